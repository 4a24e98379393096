"""Download a pinned wheel with pip and refuse it unless its sha256 matches the pin file."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path


class ChecksumError(RuntimeError):
    pass


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify(path: Path, expected: str) -> None:
    got = sha256_of(path)
    if got != expected:
        raise ChecksumError(f"{path.name}: sha256 {got} does not match the pinned {expected}; refusing it")


def fetch(
    requirement: str,
    filename: str,
    expected_sha256: str,
    dest: Path,
    python_version: str = "3.12",
    platform: str = "manylinux_2_28_x86_64",
) -> Path:
    """Return dest/filename, downloading it with pip if absent; raise ChecksumError on mismatch.
    `python_version` / `platform`: the wheel's tags (vLLM's are abi3; a CPython-specific wheel names
    its own)."""
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / filename
    if not wheel.exists():
        # pip resolves the file from the index (no hand-written URL); --no-deps: the wheel alone.
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                python_version,
                "--platform",
                platform,
                "-d",
                str(dest),
                requirement,
            ],
            check=True,
        )
    if not wheel.exists():
        raise FileNotFoundError(f"pip did not produce {wheel}")
    try:
        verify(wheel, expected_sha256)
    except ChecksumError:
        wheel.rename(wheel.with_suffix(".rejected"))
        raise
    return wheel
