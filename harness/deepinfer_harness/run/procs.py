"""A process named so that it cannot be confused with another, and the one process-group teardown.

A PID alone is reused; (boot id, PID, start time in clock ticks since boot) never is. A server
leads its own session and process group (start_new_session), so while its leader lives only its
descendants can be in that group, and while any of them lives the kernel hands the number to no
new process. Signals go through a pidfd opened before the identity is checked, so a process that
exits and is replaced between check and signal is never reached.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MARKER_ENV = "DEEPINFER_HARNESS_SERVER"  # set in every launched server's environment, value recorded


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat fields after the command name (field 3 = state is index 0); None: gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: start time in clock ticks since boot; None when gone or a zombie."""
    fields = _stat(pid)
    if fields is None or fields[0] == "Z":
        return None
    return int(fields[19])


def group_of(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[2]) if fields else None


def environ_has(pid: int, name: str, value: str) -> bool:
    """The process's initial environment holds `name=value` (readable for our own user's processes)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{name}={value}".encode() in raw.split(b"\0")


@dataclass(frozen=True)
class Identity:
    pid: int
    start_ticks: int
    boot_id: str

    @classmethod
    def of(cls, pid: int) -> Identity | None:
        ticks = start_ticks(pid)
        return None if ticks is None else cls(pid, ticks, boot_id())

    def alive(self) -> bool:
        """This very process still runs (not another one that got its PID)."""
        return self.boot_id == boot_id() and start_ticks(self.pid) == self.start_ticks


def _signal_if(pid: int, sig: int, still_ours: Callable[[int], bool]) -> None:
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return  # gone
    try:
        if still_ours(pid):
            signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        pass
    finally:
        os.close(fd)


def _members(pgid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and group_of(int(entry.name)) == pgid:
            out.append(int(entry.name))
    return out


def signal_group(leader: Identity, sig: int) -> None:
    """`sig` to every process of the group `leader` led, and to nothing else: while the leader
    runs (it is checked, not assumed) the group is its; once it is gone, a process is in the
    group only if started after the leader, and the PID is not yet reused (the group still has
    members) or nothing is signalled."""
    pgid = leader.pid
    if leader.boot_id != boot_id():
        return
    if start_ticks(pgid) is not None and not leader.alive():
        return  # the leader's PID now names another process: the group is long gone

    def ours(pid: int) -> bool:
        ticks = start_ticks(pid)
        if pid == pgid:
            return ticks == leader.start_ticks
        return group_of(pid) == pgid and ticks is not None and ticks >= leader.start_ticks

    for pid in [pgid, *(p for p in _members(pgid) if p != pgid)]:
        _signal_if(pid, sig, ours)


def stop_group(
    leader: Identity,
    grace_s: float,
    kill_wait_s: float,
    wait_gone: Callable[[float], bool] | None = None,
) -> None:
    """SIGTERM to the group, SIGKILL after `grace_s` if the leader still runs, then SIGKILL to any
    member that outlived it (engine core, workers). `wait_gone(s)` waits up to s seconds for the
    leader (a Popen's wait for our own child); by default /proc is polled."""
    wait = wait_gone or (lambda s: _poll_gone(leader, s))
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        if not leader.alive():
            break
        signal_group(leader, sig)
        if wait(wait_s):
            break
    signal_group(leader, signal.SIGKILL)


def _poll_gone(leader: Identity, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while leader.alive():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)  # not our child: no wait() to block on
    return True
