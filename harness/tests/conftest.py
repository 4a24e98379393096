from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

HERE = Path(__file__).resolve().parent

# no wall-clock thresholds: on a loaded shared host hypothesis's generation-speed and deadline
# checks fail tests whose properties hold (test_cells' round trip did, at a load average near 20)
settings.register_profile("shared-host", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("shared-host")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "integration: starts real vLLM servers (deselect: -m 'not integration')"
    )


class FakeServer:
    def __init__(self, proc: subprocess.Popen, port: int) -> None:
        self.proc, self.port = proc, port
        self.url = f"http://127.0.0.1:{port}"

    def configure(self, **cfg) -> dict:
        data = json.dumps({"reset": True, **cfg}).encode()
        req = urllib.request.Request(
            f"{self.url}/fake/config", data=data, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())


@pytest.fixture(scope="session")
def fake_server():
    proc = subprocess.Popen([sys.executable, str(HERE / "fakeserver.py")], stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())  # the server prints its port once it listens
    server = FakeServer(proc, port)
    yield server
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def fake(fake_server):
    fake_server.configure()
    return fake_server


def write_checkpoint(
    d: Path, model_type: str = "llama", vocab_size: int | None = 512, tokenizer: bool = True
) -> str:
    """A checkpoint directory good enough for preflight: config.json and a real (tiny) BPE
    tokenizer.json trained in milliseconds; no weights (no server ever loads it)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from deepinfer_harness.prompts import CANARY

    d.mkdir(parents=True, exist_ok=True)
    config = {"model_type": model_type}
    if vocab_size is not None:
        config["vocab_size"] = vocab_size
    (d / "config.json").write_text(json.dumps(config))
    if tokenizer:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator([CANARY * 4], trainer=trainer)
        tok.save(str(d / "tokenizer.json"))
    return str(d)
