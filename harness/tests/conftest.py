from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


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
