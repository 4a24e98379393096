"""Issue 42's numbered defects, each shown with stand-in processes and files (never vLLM)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deepinfer_harness.run import stale
from deepinfer_harness.run.procs import MARKER_ENV, Identity

from .test_run_guards import alive, free_port, start_harness_that_dies, wait_for


def _pid_file(results: Path, run_id: str, record: dict) -> Path:
    path = results / run_id / "logs" / "A.s0.server.pid"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def _foreign(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """A process of someone else's: its own session, like another user's engine."""
    return subprocess.Popen(argv, start_new_session=True, env=env)


def _reap(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 9)
    proc.wait()


# defect 1: a process titled VLLM:: that is not ours is never killed


def test_a_foreign_vllm_titled_process_named_by_a_pid_file_is_left_alone(tmp_path):
    results = tmp_path / "results"
    proc = _foreign(["bash", "-c", 'exec -a "VLLM::EngineCore" sleep 300'])
    try:
        assert wait_for(lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"VLLM::"))
        ident = Identity.of(proc.pid)
        assert ident is not None
        argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "m"]
        base = {"pid": proc.pid, "pgid": proc.pid, "argv": argv, "base_url": "http://127.0.0.1:1"}
        _pid_file(results, "r1", base)  # the file of an older harness: no start time, no marker
        assert stale.clear(results, "r1", {1}) == []
        # even with its true start time and a marker recorded: the title is not the command line
        facts = {"start_ticks": ident.start_ticks, "boot_id": ident.boot_id, "marker": "m"}
        _pid_file(results, "r1", base | facts)
        assert stale.clear(results, "r1", {1}) == []
        assert alive(proc.pid) and proc.poll() is None
    finally:
        _reap(proc)


def test_a_process_matching_all_but_one_recorded_fact_is_never_stopped(tmp_path):
    """Same command line (a vLLM one) but no marker, or the marker but another start time."""
    results = tmp_path / "results"
    script = tmp_path / "vllm_serve.py"
    script.write_text("import time; time.sleep(300)\n")
    argv = [sys.executable, str(script), "vllm", "serve"]
    unmarked = _foreign(argv)
    marked = _foreign(argv, env={**os.environ, MARKER_ENV: "tok"})
    try:
        assert wait_for(lambda: Identity.of(unmarked.pid) and Identity.of(marked.pid))
        for proc, ticks_shift, marker in ((unmarked, 0, "tok"), (marked, 1, "tok"), (marked, 0, "other")):
            ident = Identity.of(proc.pid)
            assert ident is not None
            record = {
                "pid": proc.pid,
                "pgid": proc.pid,
                "start_ticks": ident.start_ticks + ticks_shift,
                "boot_id": ident.boot_id,
                "marker": marker,
                "argv": argv,
                "base_url": "http://127.0.0.1:1",
            }
            path = _pid_file(results, "r1", record)
            assert stale.clear(results, "r1", {1}) == [], record
            assert not path.exists() and proc.poll() is None
        # all facts match: this one is ours, and it is the only one stopped
        ident = Identity.of(marked.pid)
        assert ident is not None
        _pid_file(
            results,
            "r1",
            {
                "pid": marked.pid,
                "pgid": marked.pid,
                "start_ticks": ident.start_ticks,
                "boot_id": ident.boot_id,
                "marker": "tok",
                "argv": argv,
                "base_url": "http://127.0.0.1:1",
            },
        )
        assert stale.clear(results, "r1", {1})[0].startswith(f"stopped vLLM server PID {marked.pid} ")
        assert wait_for(lambda: marked.poll() is not None) and unmarked.poll() is None
    finally:
        _reap(unmarked)
        _reap(marked)


def test_an_orphan_of_ours_records_what_cannot_collide(tmp_path):
    results, port = tmp_path / "results", free_port()
    pid = start_harness_that_dies(results, "r1", port)
    try:
        record = json.loads((results / "r1" / "logs" / "A.s0.server.pid").read_text())
        ident = Identity.of(pid)
        assert ident is not None and record["start_ticks"] == ident.start_ticks
        assert record["boot_id"] == ident.boot_id and len(record["marker"]) == 32
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"{MARKER_ENV}={record['marker']}".encode() in env
    finally:
        if alive(pid):
            os.killpg(pid, 9)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
