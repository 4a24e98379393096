"""The one server lifecycle (`serving`, the context manager production uses) with stand-in
processes: fail-fast health wait with the log's cause, progress callbacks, liveness from the
health endpoint, teardown on Ctrl-C."""

import os
import signal
import socket
import sys
import time

import pytest

from deepinfer_harness.run.launch import Launch
from deepinfer_harness.run.server import ServerDied, parse_log, serving

FAKE = os.path.join(os.path.dirname(__file__), "fakeserver.py")

LOG = """(EngineCore pid=1) INFO [kv_cache_utils.py:2327] GPU KV cache size: 4,648,480 tokens, Maximum concurrency for 1,048,576 tokens per request: 4.43x
(APIServer pid=2) INFO [api_utils.py:286] non-default args: {'model': '/m', 'max_model_len': 1048576}
(EngineCore pid=1) INFO [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/m', speculative_config=SpeculativeConfig(method='dspark', num_spec_tokens=5), tokenizer='/m'
(Worker pid=3) INFO Using FLASHMLA_SPARSE attention backend out of potential backends
"""  # noqa: E501


def test_parse_startup_log():
    facts = parse_log(LOG)
    assert facts["kv_cache"] == {
        "kv_cache_size_tokens": 4648480,
        "max_model_len": 1048576,
        "kv_cache_max_concurrency": 4.43,
        "windows_1m": 4.433,
    }
    assert facts["non_default_args"].startswith("{'model'")
    assert facts["engine_version"] == "v0.32.0"
    assert "dspark" in facts["speculative_config"]
    assert facts["attention_backend"] == "FLASHMLA_SPARSE"


def test_health_wait_fails_fast_with_the_cause_from_the_log(tmp_path):
    script = (
        "import sys, time; print('INFO loading'); time.sleep(1.2); "
        "print('OSError: /nonexistent/path does not appear to have a config.json'); "
        "print('INFO shutting down'); sys.exit(3)"
    )
    launch = Launch("A", "local", "http://127.0.0.1:9", [sys.executable, "-c", script])
    seen = []
    t0 = time.monotonic()
    with (
        pytest.raises(ServerDied, match="exited with 3") as err,
        serving([launch], lambda _l: tmp_path / "a.log", 60, lambda *a: seen.append(a)),
    ):
        pass
    assert time.monotonic() - t0 < 20
    assert "config.json" in str(err.value) and "\n" not in str(err.value)  # one line, the real cause
    assert seen and seen[0][0] is launch and isinstance(seen[0][1], float)  # progress while waiting


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_whole_group_is_killed_on_ctrl_c_and_liveness_uses_health(tmp_path):
    port = free_port()
    launch = Launch(
        "A", "local", f"http://127.0.0.1:{port}", [sys.executable, FAKE, str(port)], {"FAKE_SPAWN_CHILD": "1"}
    )
    with pytest.raises(KeyboardInterrupt), serving([launch], lambda _l: tmp_path / "a.log", 60) as handles:
        handle = handles["A"]
        pgid = handle.proc.pid
        assert handle.alive()
        os.kill(pgid, signal.SIGSTOP)  # the process still exists but /health stops answering
        assert not handle.exited() and not handle.alive()
        os.kill(pgid, signal.SIGCONT)
        raise KeyboardInterrupt
    deadline = time.monotonic() + 10
    while group_alive(pgid) and time.monotonic() < deadline:  # orphans are reaped by init
        time.sleep(0.05)
    assert not group_alive(pgid)
    assert (tmp_path / "a.log").read_text().strip() == str(port)
