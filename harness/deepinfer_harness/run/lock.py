"""One harness per run directory: an exclusive `fcntl.flock` on `<results>/.<run id>.lock`.

A second invocation with the same --run-id (a resume while the first still runs, two terminals,
a retried job) would otherwise take over a live run: retire its partial runs, start a server on
its port, rewrite its manifest. The lock is held from before anything is written until the
harness exits; the kernel releases it when the holder dies, however it dies (SIGKILL, OOM kill),
so a lock is never stale. The file names its holder's PID, which the refusal quotes. It sits
beside the run directory, not in it, so setting the directory aside (`--fresh`) keeps the lock.
The descriptor is not inherited by servers (Python opens files non-inheritable), so an orphaned
server never holds it.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from deepinfer_harness.config import ConfigError


def lock_path(results: Path, run_id: str) -> Path:
    return results / f".{run_id}.lock"


def _holder_pid(path: Path) -> int | None:
    try:
        first = path.read_text().split()
    except OSError:
        return None
    return int(first[0]) if first and first[0].isdigit() else None


def holder(path: Path) -> int | None:
    """The PID holding the lock at `path`, or None when nobody holds it (its holder exited or was
    killed: the kernel dropped the lock). A holder that is this process is reported as such."""
    if not path.exists():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder_pid(path) or -1  # held, by a process that has not written its PID yet
    finally:
        os.close(fd)  # closing drops a lock taken just now
    return None


@dataclass
class RunLock:
    path: Path
    fd: int | None

    @classmethod
    def acquire(cls, results: Path, run_id: str) -> RunLock:
        """Take the run's lock or raise ConfigError (exit 2) naming the PID that holds it."""
        path = lock_path(results, run_id)
        try:
            results.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigError(f"cannot lock run {run_id}: {path}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid = _holder_pid(path)
            who = f"harness PID {pid}" if pid else "another harness"
            raise ConfigError(
                f"run {run_id} is in use by {who} (lock {path}); wait for it to end, stop it, "
                "or pick another --run-id"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return cls(path, fd)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the flock; the file stays (unlinking would race)
            self.fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
