"""Which GPU archs each compiled library of a vLLM wheel carries (SASS and PTX), read with cuobjdump.

Usage: python wheel_archs.py WHEEL_DIR "8.0 8.6"
Prints one line per shared object and exits 1 unless vLLM's core extensions (`_C*`, `_moe_C*`) carry
SASS for every arch in the list: those are the compiled kernels the SM8x path calls. Runs in the
image's build stage (the cuobjdump is the one Triton's wheel ships) and in tests.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

CORE_PREFIXES = ("_C", "_moe_C")  # vLLM's own ops (paged KV, activations, MoE routing, Marlin, ...)


def is_core(name: str) -> bool:
    """vllm/_C*.so and vllm/_moe_C*.so (not third_party/deep_gemm/_C_extension, a JIT helper)."""
    return Path(name).parent == Path("vllm") and Path(name).name.startswith(CORE_PREFIXES)


_ARCH = re.compile(r"sm_(\d+[a-z]?)")


def cuobjdump() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def archs_of(lib: Path, kind: str) -> list[str]:
    """sm_XX names of the ELF (kind='elf') or PTX (kind='ptx') images embedded in one library."""
    res = subprocess.run([str(cuobjdump()), f"--list-{kind}", str(lib)], capture_output=True, text=True)
    if res.returncode != 0 and "does not contain" not in res.stderr + res.stdout:
        return []
    return sorted(set(_ARCH.findall(res.stdout)), key=lambda a: (int(re.sub(r"\D", "", a)), a))


def wanted_archs(arch_list: str) -> list[str]:
    """'8.0 8.6' -> ['80', '86'] (the TORCH_CUDA_ARCH_LIST spelling, '+PTX' ignored)."""
    return [a.replace("+PTX", "").replace(".", "") for a in arch_list.replace(";", " ").split()]


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    wheels = sorted(Path(argv[1]).glob("vllm-*.whl"))
    if len(wheels) != 1:
        print(
            f"wheel_archs: expected one vllm wheel in {argv[1]}, found {[w.name for w in wheels]}",
            file=sys.stderr,
        )
        return 1
    want = wanted_archs(argv[2])
    problems = []
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheels[0]) as zf:
        libs = sorted(n for n in zf.namelist() if n.endswith(".so"))
        print(f"{wheels[0].name}: {len(libs)} shared objects; core ops need SASS for sm_{' sm_'.join(want)}")
        for name in libs:
            path = Path(zf.extract(name, tmp))
            sass, ptx = archs_of(path, "elf"), archs_of(path, "ptx")
            print(f"  {name:52} SASS {' '.join(sass) or '-':40} PTX {' '.join(ptx) or '-'}")
            if is_core(name):
                missing = [a for a in want if a not in sass]
                if missing:
                    problems.append(f"{name} lacks SASS for sm_{', sm_'.join(missing)}")
        if not any(is_core(n) for n in libs):
            problems.append("no _C*/_moe_C* extension in the wheel")
    for p in problems:
        print(f"wheel_archs: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
