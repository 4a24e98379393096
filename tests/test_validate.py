"""`make validate` (scripts/validate.py) on a machine without a GPU: the CPU steps run, it stops at the
first GPU step, says so, exits 3 and leaves one evidence JSON; the GPU serving commands are well formed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "scripts" / "validate.py")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=600, cwd=ROOT
    )


@pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import torch; exit(torch.cuda.is_available())"]).returncode,
    reason="this test is the no-GPU path",
)
def test_cpu_run_stops_at_first_gpu_step(tmp_path: Path) -> None:
    # the checkpoint steps are test_tiny_v41's (they take a minute); skipped here by name
    p = _run(
        "--out", str(tmp_path), "--model", str(tmp_path / "tiny"), "--skip", "tiny-checkpoint,tiny-loads"
    )
    assert p.returncode == 3, p.stdout + p.stderr
    assert "stopped at 'gpu-tests'" in p.stdout
    (evidence,) = tmp_path.glob("validate-*.json")
    d = json.loads(evidence.read_text())
    assert (d["verdict"], d["stopped_at"], d["gpus"]) == ("incomplete", "gpu-tests", [])
    status = {s["name"]: s["status"] for s in d["steps"]}
    assert status["environment"] == status["pipeline-plans"] == "pass"
    assert all(status[n] == "skipped" for n in ("gpu-tests", "sm80-report", "serve-tp1", "serve-pp3"))
    assert d["versions"]["torch"] and d["targets"] and {"name", "met"} <= set(d["targets"][0])
    plans = next(s for s in d["steps"] if s["name"] == "pipeline-plans")["plans"]
    assert plans["14,14,12"]["payload_bytes_per_token"] == [0, 8908]


def test_dry_run_serving_commands(tmp_path: Path) -> None:
    p = _run("--dry-run", "--out", str(tmp_path), "--model", str(tmp_path / "tiny"))
    assert p.returncode == 0, p.stderr
    lines = dict(line.split(": ", 1) for line in p.stdout.splitlines())
    assert set(lines) == {"serve-tp1", "serve-tp2", "serve-pp2", "serve-pp3"}
    assert lines["serve-pp3"].startswith("VLLM_PP_LAYER_PARTITION=2,2,2 ")
    assert "topology.pp=3" in lines["serve-pp3"] and "topology.tp=2" in lines["serve-tp2"]
    assert "DEEPINFER_SM80_DISABLE" in lines["serve-tp1"] and "fp8_ds_mla" in lines["serve-tp1"]


def test_unknown_step_is_usage_error(tmp_path: Path) -> None:
    p = _run("--skip", "nope", "--out", str(tmp_path))
    assert p.returncode == 2 and "unknown step" in p.stderr


def test_engram_tables_that_do_not_fit_fail_before_serving(tmp_path: Path) -> None:
    """Engram host memory (issue 22 item 6): tables larger than any host fail the CPU step, by name."""
    cfg = tmp_path / "config.json"
    huge = {"engram_layer_ids": [1, 14], "engram_num_embeddings": [2**40, 2**40], "engram_head_dim": 1024}
    cfg.write_text(json.dumps(huge))
    p = _run(
        "--out", str(tmp_path), "--model", str(tmp_path / "tiny"), "--engram-config", str(cfg),
        "--skip", "tiny-checkpoint,tiny-loads",
    )  # fmt: skip
    assert p.returncode == 1, p.stdout + p.stderr
    (evidence,) = tmp_path.glob("validate-*.json")
    step = next(s for s in json.loads(evidence.read_text())["steps"] if s["name"] == "engram-memory")
    assert step["status"] == "fail" and "does not fit" in step["reason"]
    assert _run("--engram-config", str(tmp_path / "absent.json")).returncode == 2
