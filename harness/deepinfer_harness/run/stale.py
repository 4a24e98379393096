"""Servers a dead harness left running, found from their PID files and stopped.

A harness killed by SIGKILL or the OOM killer runs no teardown: its server (its own session, so
the kill does not reach it) keeps running with parent 1, holding its port and GPU memory, and
the resume fails at the port check. Every server start writes `<run>/logs/<arm>.s<k>.server.pid`
(run/server.py). A server is a stale one of ours when all three hold: that PID file exists, the
process is still alive, and its command line is the one recorded there, a vLLM server's. Its
harness is dead when the run's lock is free (run/lock.py). Such a server is stopped (its process
group SIGTERM, then SIGKILL; `docker rm -f` for a container) when it belongs to the run being
resumed or listens on a port this run needs; one whose harness is still alive is only named. A
PID file whose process is gone, or is now another program, is removed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from deepinfer_harness.run.lock import holder, lock_path
from deepinfer_harness.run.ports import cmdline

STOP_GRACE_S = 15.0
KILL_WAIT_S = 10.0


@dataclass(frozen=True)
class StaleServer:
    pid_file: Path
    run_id: str
    pid: int
    pgid: int
    argv: list[str]
    port: int | None
    stop_argv: list[str]
    owner_pid: int | None  # the live harness holding the run's lock; None: the harness is dead

    def describe(self) -> str:
        where = f"port {self.port}" if self.port else "no port"
        return f"vLLM server PID {self.pid} of run {self.run_id} ({where}, {self.pid_file})"


def looks_like_vllm(argv: list[str]) -> bool:
    """`vllm serve`, `python -m vllm.entrypoints…`, `docker run … --entrypoint vllm … serve`."""
    return any("vllm" in part for part in argv)


def runs_recorded(live: list[str] | None, argv: list[str]) -> bool:
    """The live command line is the recorded one: equal; or a script run through its interpreter
    (`vllm serve …` shows as `python /…/bin/vllm serve …`); or a title vLLM set (`VLLM::…`)."""
    if not live or not argv:
        return False
    if live == argv or (len(argv) > 1 and live[-(len(argv) - 1) :] == argv[1:]):
        return True
    return live[0].startswith("VLLM::")


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("pid"), int) else None


def find(results: Path) -> list[StaleServer]:
    """Every live server of ours under the results root (one per PID file whose process is alive
    and still runs the recorded vLLM command line); PID files of gone processes are removed."""
    out = []
    for path in sorted(results.glob("*/logs/*.server.pid")):
        data = _read(path)
        argv = [str(x) for x in (data or {}).get("argv") or []]
        live = cmdline(data["pid"]) if data else None
        if data is None or not runs_recorded(live, argv) or not looks_like_vllm(argv):
            path.unlink(missing_ok=True)  # the process is gone, or the PID now names another program
            continue
        run_id = path.parent.parent.name
        owner = holder(lock_path(results, run_id))
        out.append(
            StaleServer(
                path,
                run_id,
                data["pid"],
                int(data.get("pgid") or data["pid"]),
                argv,
                urlparse(str(data.get("base_url") or "")).port,
                [str(x) for x in data.get("stop_argv") or []],
                owner if owner != os.getpid() else None,
            )
        )
    return out


def _gone(pid: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while cmdline(pid) is not None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)  # not our child: no wait() to block on
    return True


def stop(server: StaleServer, grace_s: float = STOP_GRACE_S) -> None:
    """The server's whole process group: SIGTERM, SIGKILL after `grace_s`; then its stop command."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        try:
            os.killpg(server.pgid, sig)
        except ProcessLookupError:
            break
        if _gone(server.pid, wait_s):
            break
    try:  # children that outlived the leader (engine core, workers) share its group
        os.killpg(server.pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if server.stop_argv:
        subprocess.run(server.stop_argv, check=False, capture_output=True)
    server.pid_file.unlink(missing_ok=True)


def clear(results: Path, run_id: str, ports: set[int], dry_run: bool = False) -> list[str]:
    """Stop the stale servers of ours that stand in this run's way: those of the run itself (a
    resume) and those on a port it needs, whose harness is dead; name the ones whose harness is
    alive (never stopped: that run is live). Returns one line per server."""
    lines = []
    for server in find(results):
        if server.run_id != run_id and server.port not in ports:
            continue
        if server.owner_pid is not None:
            lines.append(f"{server.describe()} belongs to harness PID {server.owner_pid}, still running")
            continue
        if dry_run:
            lines.append(f"{server.describe()}: its harness is gone; a real run would stop it")
            continue
        stop(server)
        lines.append(f"stopped {server.describe()}: its harness was gone (killed?)")
    return lines
