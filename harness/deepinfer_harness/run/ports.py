"""Is a server port free, and if not, which process listens on it.

A port is free when a server could bind it now. vLLM (uvicorn) binds with SO_REUSEADDR, so a
socket of an earlier server left in TIME_WAIT does not stop it; the check binds the same way, or
it would call a port "in use" for a minute after every server stop. A port in use is named with
the PID and command line that listen on it (Linux /proc; best effort: another user's process may
not be visible), so the user can tell a stale server of ours from a foreign one.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

_LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp


def port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == _LISTEN and int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(parts[9])
    return inodes


def cmdline(pid: int) -> list[str] | None:
    """A live process's argv; None when it is gone (or a zombie: it no longer holds anything)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return None
    if state == "Z":
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def listeners(port: int) -> list[int]:
    """PIDs with a socket listening on `port` (those this user may inspect)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            links = {os.readlink(fd) for fd in (entry / "fd").iterdir()}
        except OSError:
            continue
        if any(link.startswith("socket:[") and link[8:-1] in inodes for link in links):
            found.append(int(entry.name))
    return sorted(found)


def describe_holder(port: int) -> str:
    """`PID 1234 (python -m vllm.entrypoints.cli.main serve …)`, or why no PID can be named."""
    pids = listeners(port)
    if not pids:
        return "a process this user cannot inspect" if _listening_inodes(port) else "an unknown process"
    named = []
    for pid in pids[:3]:
        text = " ".join(" ".join(cmdline(pid) or []).split())  # one line, whatever the arguments hold
        named.append(f"PID {pid} ({text[:120]}{' …' if len(text) > 120 else ''})")
    return ", ".join(named)
