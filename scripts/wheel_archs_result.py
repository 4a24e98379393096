"""results/wheel-archs.json: the SASS and PTX archs of every shared object in the pinned official vLLM wheel.

The same reading as the image's build stage (`docker/wheel_archs.py`, cuobjdump from Triton's wheel),
kept as a result so docker/README.md can render its table from a committed file instead of prose.
The wheel is the pinned one (docker/versions.env), checked against its sha256 before it is read.

Usage: python scripts/wheel_archs_result.py [--wheel-dir .cache/wheels] [--out results/wheel-archs.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import zipfile
from pathlib import Path

from fetch_wheel import sha256_of  # scripts/fetch_wheel.py: the one sha256 reader
from pins import load_pins  # scripts/pins.py: docker/versions.env

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docker"))

import wheel_archs  # noqa: E402  (docker/wheel_archs.py: the build stage's reader)


def read(wheel: Path) -> dict[str, dict[str, str]]:
    """{library path in the wheel: {"sass": "80 86 ...", "ptx": "80 ..."}} for every .so."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
        for name in sorted(n for n in zf.namelist() if n.endswith(".so")):
            path = Path(zf.extract(name, tmp))
            sass, ptx = wheel_archs.archs_of(path, "elf"), wheel_archs.archs_of(path, "ptx")
            out[name] = {"sass": " ".join(sass) or "–", "ptx": " ".join(ptx) or "–"}
            path.unlink()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel-dir", type=Path, default=ROOT / ".cache" / "wheels")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "wheel-archs.json")
    args = parser.parse_args(argv)
    pins = load_pins()
    wheel = args.wheel_dir / pins["VLLM_WHEEL"]
    if not wheel.is_file():
        print(f"wheel_archs_result: no {wheel} (make fetch-vllm downloads it)", file=sys.stderr)
        return 2
    digest = sha256_of(wheel)
    if digest != pins["VLLM_WHEEL_SHA256"]:
        print(f"wheel_archs_result: {wheel.name}: sha256 {digest} is not the pinned one", file=sys.stderr)
        return 1
    from deepinfer_sm80.testing.provenance import provenance

    libraries = read(wheel)
    want = wheel_archs.wanted_archs(pins["TORCH_CUDA_ARCH_LIST"])
    doc = {
        "what": "SASS / PTX archs of each shared object in the official vLLM wheel (cuobjdump, "
        "docker/wheel_archs.py)",
        "wheel": wheel.name,
        "wheel_sha256": digest,
        "arch_list": pins["TORCH_CUDA_ARCH_LIST"],
        "core_libraries_with_sass_for_arch_list": sorted(
            n for n, v in libraries.items() if wheel_archs.is_core(n) and set(want) <= set(v["sass"].split())
        ),
        "libraries": libraries,
        "provenance": provenance(command="python scripts/wheel_archs_result.py"),
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wheel_archs_result: {len(libraries)} shared objects -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
