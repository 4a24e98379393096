"""Servers a dead harness left running, found from their PID files and stopped.

A harness killed by SIGKILL or the OOM killer runs no teardown: its server (its own session, so
the kill does not reach it) keeps running with parent 1, holding its port and GPU memory, and
the resume fails at the port check. Every server start writes `<run>/logs/<arm>.s<k>.server.pid`
(run/server.py). A process is that stale server only when everything recorded there matches
what cannot collide: the same boot and start time of that PID, the full command line launched
(a vLLM one), and the harness's marker in its environment (run/procs.py); a process that
merely looks like vLLM (a `VLLM::` title, another user's engine, a reused PID) is never touched.
Its harness is dead when the run's lock is free (run/lock.py). Such a server is stopped (its
process group SIGTERM, then SIGKILL; `docker rm -f` for a container) when it belongs to the run
being resumed or listens on a port this run needs; one whose harness is still alive is only
named. A PID file whose process is gone, or is now another program, is removed, unless a live
harness holds that run (its server may be starting).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from deepinfer_harness.run.lock import holder, lock_path
from deepinfer_harness.run.ports import cmdline
from deepinfer_harness.run.procs import MARKER_ENV, Identity, environ_has, stop_group

STOP_GRACE_S = 15.0
KILL_WAIT_S = 10.0


@dataclass(frozen=True)
class StaleServer:
    pid_file: Path
    run_id: str
    identity: Identity
    argv: list[str]
    port: int | None
    stop_argv: list[str]
    owner_pid: int | None  # the live harness holding the run's lock; None: the harness is dead

    def describe(self) -> str:
        where = f"port {self.port}" if self.port else "no port"
        return f"vLLM server PID {self.identity.pid} of run {self.run_id} ({where}, {self.pid_file})"


def looks_like_vllm(argv: list[str]) -> bool:
    """`vllm serve`, `python -m vllm.entrypoints…`, `docker run … --entrypoint vllm … serve`."""
    return any("vllm" in part for part in argv)


def runs_recorded(live: list[str] | None, argv: list[str]) -> bool:
    """The live command line is the recorded one: equal, or a script run through its interpreter
    (`vllm serve …` shows as `python /…/bin/vllm serve …`: the interpreter, the script's path,
    then the recorded arguments word for word)."""
    if not live or not argv:
        return False
    if live == argv:
        return True
    return len(live) == len(argv) + 1 and live[2:] == argv[1:] and Path(live[1]).name == Path(argv[0]).name


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("pid"), int) else None


def recorded_identity(data: dict[str, Any]) -> Identity | None:
    """The process the PID file names, if it is that very process still: same boot, same start
    time, the recorded command line, our marker in its environment. None for anything else,
    including a PID file of an older harness, which recorded no start time or marker."""
    pid, ticks, boot, marker = (data.get(k) for k in ("pid", "start_ticks", "boot_id", "marker"))
    if not (isinstance(pid, int) and isinstance(ticks, int) and isinstance(boot, str)):
        return None
    if not isinstance(marker, str) or not marker:
        return None
    identity = Identity(pid, ticks, boot)
    argv = [str(x) for x in data.get("argv") or []]
    if not identity.alive() or not runs_recorded(cmdline(pid), argv) or not looks_like_vllm(argv):
        return None
    if not environ_has(pid, MARKER_ENV, marker) or not identity.alive():
        return None
    return identity


def find(results: Path) -> list[StaleServer]:
    """Every live server of ours under the results root (one per PID file whose very process is
    alive, see recorded_identity); PID files naming anything else are removed."""
    out = []
    for path in sorted(results.glob("*/logs/*.server.pid")):
        run_id = path.parent.parent.name
        owner = holder(lock_path(results, run_id))
        data = _read(path)
        identity = recorded_identity(data) if data else None
        if data is None or identity is None:
            # the process is gone, or the PID now names another program; a live harness's own file
            # stays (its server may be mid-exec: its command line reads empty for a few ms)
            if owner is None or owner == os.getpid():
                path.unlink(missing_ok=True)
            continue
        out.append(
            StaleServer(
                path,
                run_id,
                identity,
                [str(x) for x in data.get("argv") or []],
                urlparse(str(data.get("base_url") or "")).port,
                [str(x) for x in data.get("stop_argv") or []],
                owner if owner != os.getpid() else None,
            )
        )
    return out


def stop(server: StaleServer, grace_s: float = STOP_GRACE_S) -> None:
    """The server's whole process group: SIGTERM, SIGKILL after `grace_s`; then its stop command."""
    stop_group(server.identity, grace_s, KILL_WAIT_S)
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
