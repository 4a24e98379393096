"""Issue 30 defects 3, 4 and 5, with stand-in processes (never vLLM): a server orphaned by a
SIGKILLed harness is found from its PID file and stopped by the next harness (or named); a port
in TIME_WAIT is free; a port in use names its PID; one harness per run directory; a harness
started with SIGINT ignored can still be interrupted."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from deepinfer_harness.config import ConfigError, load_profile
from deepinfer_harness.run.launch import Launch
from deepinfer_harness.run.preflight import check_ports
from deepinfer_harness.run.server import serving

from .test_first_day import SMALL
from .test_pipeline_fake import bench, write_profile

HARNESS = str(Path(__file__).resolve().parents[1])
FAKE = os.path.join(os.path.dirname(__file__), "fakeserver.py")
# a stand-in vLLM server: listens on argv[1] and sleeps; `vllm serve` in its command line as a
# real server's has
LISTENER = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('listening', flush=True)\n"
    "time.sleep(600)\n"
)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(predicate, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def profile_on(tmp_path, port_a, port_b):
    path = tmp_path / "loc.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "loc",
                "server": {"mode": "local", "ports": {"A": port_a, "B": port_b}},
                "ab": {"aa": True},
            }
        )
    )
    return load_profile(str(path))


def start_harness_that_dies(results: Path, run_id: str, port: int) -> int:
    """A harness process that starts a stand-in server the way bench-ab does (run/server.start:
    its own session, a PID file beside its log) and is then killed with SIGKILL: no teardown runs.
    Returns the orphaned server's PID."""
    log = results / run_id / "logs" / "A.s0.server.log"
    listener = results.parent / "listener.py"
    listener.write_text(LISTENER)
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from deepinfer_harness.run.launch import Launch
        from deepinfer_harness.run.server import start
        argv = [sys.executable, {str(listener)!r}, "{port}", "vllm", "serve"]
        handle = start(Launch("A", "local", "http://127.0.0.1:{port}", argv), Path({str(log)!r}))
        print(handle.proc.pid, flush=True)
        time.sleep(600)
        """
    )
    harness = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": HARNESS},
    )
    server_pid = int(harness.stdout.readline())
    assert wait_for(lambda: "listening" in log.read_text())
    harness.kill()  # SIGKILL: the OOM killer's way
    harness.wait(timeout=10)
    return server_pid


def test_a_server_orphaned_by_a_killed_harness_is_found_and_stopped(tmp_path):
    from deepinfer_harness.run import stale

    results, port, other = tmp_path / "results", free_port(), free_port()
    pid = start_harness_that_dies(results, "r1", port)
    pid_file = results / "r1" / "logs" / "A.s0.server.pid"
    try:
        assert alive(pid) and pid_file.exists()  # orphaned: still running, still listening
        assert json.loads(pid_file.read_text())["pid"] == pid
        with pytest.raises(ConfigError) as err:  # the port check names who holds the port
            check_ports(profile_on(tmp_path, port, other))
        assert f"port {port} on 127.0.0.1 (server A) is already in use by PID {pid} (" in str(err.value)
        msg = str(err.value)
        shown = msg.split(f"PID {pid} (", 1)[1].split("); ", 1)[0]  # its command line, cut with … when long
        full = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        assert full.endswith(f"listener.py {port} vllm serve") and "\n" not in msg
        assert shown == full or (shown.endswith(" …") and full.startswith(shown[:-2])), (shown, full)
        # a dry run names it; another run on other ports leaves it alone
        assert "a real run would stop it" in stale.clear(results, "r2", {port}, dry_run=True)[0]
        assert stale.clear(results, "r2", {other}) == [] and alive(pid)
        # the resume of r1 stops it (its process group), removes its PID file, frees the port
        lines = stale.clear(results, "r1", {other})
        what = f"vLLM server PID {pid} of run r1 (port {port}, {pid_file})"
        assert lines == [f"stopped {what}: its harness was gone (killed?)"]
        assert wait_for(lambda: not alive(pid)) and not pid_file.exists()
        check_ports(profile_on(tmp_path, port, other))
    finally:
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)


def test_a_pid_file_that_names_another_program_is_not_ours(tmp_path):
    from deepinfer_harness.run import stale

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        pid_file = tmp_path / "results" / "r1" / "logs" / "A.s0.server.pid"
        pid_file.parent.mkdir(parents=True)
        argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]  # recorded, not what runs
        pid_file.write_text(json.dumps({"pid": sleeper.pid, "argv": argv, "base_url": "http://127.0.0.1:1"}))
        assert stale.clear(tmp_path / "results", "r1", set()) == []
        assert sleeper.poll() is None and not pid_file.exists()  # never killed; the stale file goes
    finally:
        sleeper.kill()
        sleeper.wait()


def hold_lock(results: Path, run_id: str) -> subprocess.Popen:
    """Another process holding the run's lock (a live harness on that run)."""
    script = (
        "import time; from pathlib import Path; from deepinfer_harness.run.lock import RunLock; "
        f"RunLock.acquire(Path({str(results)!r}), {run_id!r}); print('held', flush=True); time.sleep(600)"
    )
    return subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": HARNESS},
    )


def test_a_live_runs_server_is_named_never_stopped(tmp_path):
    from deepinfer_harness.run import stale
    from deepinfer_harness.run.lock import RunLock

    results, port = tmp_path / "results", free_port()
    pid = start_harness_that_dies(results, "r1", port)
    holder = hold_lock(results, "r1")  # the run's lock is held: its harness is alive
    try:
        assert holder.stdout.readline().strip() == "held"
        lines = stale.clear(results, "r2", {port})
        assert lines and f"belongs to harness PID {holder.pid}, still running" in lines[0] and alive(pid)
        with pytest.raises(ConfigError, match=f"run r1 is in use by harness PID {holder.pid}"):
            RunLock.acquire(results, "r1")
    finally:
        holder.kill()
        holder.wait()
        os.killpg(pid, signal.SIGKILL)


def test_the_server_pid_file_lives_beside_its_log_while_it_runs(tmp_path):
    port = free_port()
    launch = Launch("A", "local", f"http://127.0.0.1:{port}", [sys.executable, FAKE, str(port)])
    log = tmp_path / "logs" / "A.s0.server.log"
    with serving([launch], lambda _l: log, 60) as handles:
        record = json.loads((tmp_path / "logs" / "A.s0.server.pid").read_text())
        assert record["pid"] == record["pgid"] == handles["A"].proc.pid == os.getpgid(handles["A"].proc.pid)
        assert record["argv"] == launch.argv and record["harness_pid"] == os.getpid()
    assert not (tmp_path / "logs" / "A.s0.server.pid").exists()


def time_wait(port):
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return any(int(r[1].rsplit(":", 1)[1], 16) == port and r[3] == "06" for r in rows)


def test_a_port_in_time_wait_is_free():
    """vLLM binds with SO_REUSEADDR, so a closed connection's TIME_WAIT does not stop it; the
    check binds the same way (it called such a port 'in use' for a minute after every stop)."""
    from deepinfer_harness.run.preflight import port_free

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()  # the server side closes first: its socket (local port `port`) enters TIME_WAIT
    time.sleep(0.1)
    client.close()
    server.close()
    assert time_wait(port)
    assert port_free("127.0.0.1", port)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert not port_free("127.0.0.1", busy.getsockname()[1])


def test_a_second_invocation_on_a_live_run_exits_2_naming_the_holder(fake, tmp_path, capsys):
    profile = write_profile(tmp_path, fake.url, plan=SMALL)
    holder = hold_lock(tmp_path / "results", "fake")
    try:
        assert holder.stdout.readline().strip() == "held"
        assert bench(tmp_path, profile) == 2
        err = capsys.readouterr().err.strip()
        assert err.splitlines() == [err] and err.startswith("error: run fake is in use by harness PID ")
        assert f"PID {holder.pid} " in err
        assert not (tmp_path / "results" / "fake").exists()  # nothing written, nothing taken over
    finally:
        holder.kill()  # dies without releasing: the kernel drops its lock
        holder.wait()
    assert bench(tmp_path, profile) == 0  # a dead holder's lock is never stale


def test_sigint_ignored_at_start_still_interrupts(tmp_path):
    """Started with SIGINT ignored (`trap '' INT` in a script), the harness used to keep ignoring
    it: Ctrl-C did nothing. It restores Python's default handling at start."""
    script = textwrap.dedent(
        """
        import sys, time
        from deepinfer_harness import cli
        def slow(args):
            print("ready", flush=True)
            time.sleep(60)
            return 0
        cli.cmd_validate = slow
        sys.exit(cli.main(["validate", "--profile", "smoke"]))
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": HARNESS},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # inherited across exec
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130
        assert "interrupted" in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
