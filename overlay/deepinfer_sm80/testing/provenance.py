"""Where a number came from: git revision, versions, hardware, date and the command that ran.

Every JSON under results/ carries these fields (tests/test_results_provenance.py); `REQUIRED` is the
list the test checks and `missing_fields` the check itself, so a writer and the test agree.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch
import triton

REQUIRED = ("git_sha", "date", "hardware", "versions", "command")


def git_sha() -> str:
    """HEAD of this checkout, or $DEEPINFER_GIT_SHA where the tree travelled without .git."""
    env = os.environ.get("DEEPINFER_GIT_SHA")
    if env:
        return env
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _driver_version() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return out.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown"


def command_line() -> str:
    """The interpreter's own argv (`python3 -m deepinfer_sm80.bench --out …`), shell-quoted."""
    return shlex.join([Path(sys.orig_argv[0]).name, *sys.orig_argv[1:]])


def provenance(command: str | None = None) -> dict[str, object]:
    info: dict[str, object] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_sha": git_sha(),
        "command": command or command_line(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda_runtime": torch.version.cuda,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cuda_runtime": torch.version.cuda,
        },
        "hardware": f"CPU {platform.machine()} ({os.cpu_count()} logical cores), no GPU",
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info |= {
            "gpu": props.name,
            "capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "driver": _driver_version(),
            "hardware": f"{props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs)",
        }
    return info


def missing_fields(prov: object) -> list[str]:
    """The REQUIRED fields a provenance dict lacks or leaves empty ("unknown" counts as empty)."""
    if not isinstance(prov, dict):
        return list(REQUIRED)
    missing = [k for k in REQUIRED if prov.get(k) in (None, "", "unknown", {}, [])]
    if prov.get("versions") and not isinstance(prov["versions"], dict):
        missing.append("versions (a name -> version object)")
    return missing
