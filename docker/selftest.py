"""The runtime stages' self-test: what can be proven about an image without a GPU.

Usage (last step of the baseline and deepinfer stages; also `docker run --entrypoint python3 IMAGE
/opt/deepinfer/selftest.py --level base|optimized`):
  python /opt/deepinfer/selftest.py --level base|optimized [--skip-kernels]

Checks, each one line, any failure exits 1:
  pins        torch / triton / tilelang / vLLM installed at the pin file's versions; vllm imports
  provenance  the build args the OCI labels are made of (kept in /opt/deepinfer/provenance.env)
              equal the pin file and the recomputed patch-set hash: a label never describes
              another build
  patches     exactly this level's series entries were applied, each the file that is in the image,
              and every patched file is still as patched (sha256)
  overlay     deepinfer_sm80 installed from the copied overlay, file for file; the level marker
              (patch 01's module) says what this image is
  bindings    every row of the binding table resolves; every hooked upstream module carries the
              hook line; imported with the capability forced to 80, each rebinds to its row's target
  kernels     every registered Triton kernel cross-compiles for the image's TORCH_CUDA_ARCH_LIST,
              within its register/spill/shared-memory budgets (deepinfer_sm80.testing.sm80_report)
Needs a GPU, so skipped and said so: launching any kernel, CUDA initialisation, serving.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path("/opt/deepinfer")
PINS = ROOT / "versions.env"
PATCHES = ROOT / "patches"
STATE = ROOT / "state"
PROVENANCE = ROOT / "provenance.env"  # the label values, written by the stage from its build args
OVERLAY_SRC = ROOT / "src" / "overlay" / "deepinfer_sm80"
HOOK_LINE = "rebind(globals(), __name__)"
LEVEL_PREFIXES = {"base": ("00-",), "optimized": ("00-", "01-")}

FAILURES: list[str] = []


def load_pins(path: Path = PINS) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            pins[key] = value
    return pins


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check(name: str, fn: Callable[[], str]) -> None:
    try:
        detail = fn()
    except Exception as exc:
        FAILURES.append(name)
        print(f"selftest: FAIL {name}: {exc}", flush=True)
        return
    print(f"selftest: ok   {name}: {detail}", flush=True)


def skip(name: str, why: str) -> None:
    print(f"selftest: skip {name}: {why}", flush=True)


# ----------------------------------------------------------------------------- checks
def check_pins(pins: dict[str, str]) -> str:
    wanted = {
        "torch": "TORCH_VERSION",
        "triton": "TRITON_VERSION",
        "tilelang": "TILELANG_VERSION",
        "vllm": "VLLM_VERSION",
    }
    got = {}
    for dist, key in wanted.items():
        version = importlib.metadata.version(dist)
        # local suffixes (+cu130, +precompiled) name the build, not another release
        if version.split("+")[0] != pins[key]:
            raise AssertionError(f"{dist} {version} installed, pin file says {pins[key]}")
        got[dist] = version
    import vllm

    if not vllm.__version__.startswith(pins["VLLM_VERSION"]):
        raise AssertionError(f"vllm.__version__ {vllm.__version__} != pin {pins['VLLM_VERSION']}")
    return ", ".join(f"{k} {v}" for k, v in got.items())


def patchset_hash() -> str:
    out = subprocess.run([str(ROOT / "patchset_hash.sh"), str(PATCHES)], capture_output=True, text=True)
    if out.returncode != 0:
        raise AssertionError(out.stderr.strip())
    return out.stdout.strip()


def check_provenance(pins: dict[str, str]) -> str:
    given = load_pins(PROVENANCE)
    expected = {
        "VLLM_VERSION": pins["VLLM_VERSION"],
        "VLLM_SDIST_SHA256": pins["VLLM_SDIST_SHA256"],
        "VLLM_WHEEL_SHA256": pins["VLLM_WHEEL_SHA256"],
        "PATCHES_SHA256": patchset_hash(),
    }
    for key, want in expected.items():
        got = given.get(key, "")
        if not got:
            raise AssertionError(
                f"build arg {key} is empty (it becomes an OCI label): build through `make image`"
            )
        if got != want:
            raise AssertionError(f"build arg {key}={got} but the image's own files give {want}")
    git_sha = given.get("GIT_SHA", "")
    if not re.fullmatch(r"[0-9a-f]{40}(-dirty)?", git_sha):
        raise AssertionError(
            f"build arg GIT_SHA={git_sha!r}: expected a 40-hex revision (make image passes it)"
        )
    build = given.get("VLLM_BUILD", "")
    if build not in ("source", "precompiled"):
        raise AssertionError(f"build arg VLLM_BUILD={build!r}: expected source or precompiled")
    return f"patch set {expected['PATCHES_SHA256'][:12]}, revision {git_sha[:12]}, vLLM build {build}"


def series_entries() -> list[str]:
    names = []
    for line in (PATCHES / "series").read_text().splitlines():
        name = line.split("#")[0].strip()
        if name:
            names.append(name.split()[0])
    return names


def site_root() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise AssertionError("vllm is not importable")
    return Path(spec.origin).parent.parent


def check_patches(level: str) -> str:
    want = [n for n in series_entries() if n.startswith(LEVEL_PREFIXES[level])]
    applied = [line.split() for line in (STATE / "applied").read_text().splitlines() if line.strip()]
    names = [name for _, name in applied]
    if names != want:
        raise AssertionError(f"applied {names}, but level {level} of the series is {want}")
    for digest, name in applied:
        if sha256_file(PATCHES / name) != digest:
            raise AssertionError(f"{name}: the applied patch differs from the one in {PATCHES}")
    root = site_root()
    files = [line.split(maxsplit=1) for line in (STATE / "patched-files.sha256").read_text().splitlines()]
    for digest, rel in files:
        if sha256_file(root / rel) != digest:
            raise AssertionError(f"{rel} changed after the patches were applied (reinstalled?)")
    return f"{', '.join(names)}; {len(files)} patched files unchanged"


def check_overlay(level: str) -> str:
    import deepinfer_sm80
    from deepinfer_sm80 import bindings

    installed = Path(deepinfer_sm80.__file__).parent
    if installed.resolve() == OVERLAY_SRC.resolve() or "site-packages" not in installed.parts:
        raise AssertionError(f"deepinfer_sm80 imported from {installed}, not from the installed package")
    sources = sorted(p.relative_to(OVERLAY_SRC) for p in OVERLAY_SRC.rglob("*.py"))
    differ = [str(rel) for rel in sources if sha256_file(OVERLAY_SRC / rel) != sha256_file(installed / rel)]
    if differ:
        raise AssertionError(f"installed overlay differs from the copied source: {differ[:5]}")
    marker = bindings.active_level()
    if marker != level:
        raise AssertionError(f"level marker says {marker!r}, this stage is {level!r}")
    return f"{len(sources)} files as copied, level marker {marker!r}"


def _is_hook(line: str) -> bool:
    """`rebind(globals(), __name__)` as a statement (alone or after `import ...;`), not in a comment."""
    code = line.split("#", 1)[0]
    return any(part.strip() == HOOK_LINE for part in code.split(";"))


def check_bindings_resolve() -> str:
    from deepinfer_sm80 import bindings

    count = 0
    for row in bindings.BINDINGS:
        for target in (row.base, row.optimized):
            if target is not None:
                obj = bindings.resolve(target)
                if not callable(obj):
                    raise AssertionError(f"{row.name}: {target} is not callable")
                count += 1
    root = site_root()
    for module in bindings.hooked_modules():
        path = root / (module.replace(".", "/") + ".py")
        if not any(_is_hook(line) for line in path.read_text().splitlines()):
            raise AssertionError(f"{path.relative_to(root)}: no `{HOOK_LINE}` line (patch 00 missing?)")
    hooked = len(bindings.hooked_modules())
    return f"{len(bindings.BINDINGS)} rows, {count} targets importable, {hooked} modules hooked"


# Run in a child with the capability forced: the hooked modules are imported for real, as a server
# on an A100 would import them, and each row's symbol must then be the row's target.
_FORCED = """
import importlib
from deepinfer_sm80 import bindings
level = bindings.active_level()
for module in bindings.hooked_modules():
    mod = importlib.import_module(module)
    for row in bindings.rows_for(module):
        if not bindings.row_applies(row, 80):
            continue
        target = row.target(level)
        got = bindings._get(vars(mod), row.symbol)
        upstream = bindings.original(module, row.symbol)
        if target is None:
            ok = upstream is not None and got is upstream
        elif row.wrap:
            ok = upstream is not None and got is not upstream
        else:
            ok = got is bindings.resolve(target)
        print(("ok " if ok else "BAD ") + row.name + " -> " + str(target or "upstream"))
"""


def check_forced_rebind() -> str:
    env = dict(os.environ, DEEPINFER_SM80_FORCE_CAPABILITY="80")
    env.pop("DEEPINFER_SM80_DISABLE", None)
    proc = subprocess.run([sys.executable, "-c", _FORCED], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise AssertionError(f"importing the hooked modules failed: {proc.stderr.strip().splitlines()[-1:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("ok ", "BAD "))]
    bad = [ln[4:] for ln in lines if ln.startswith("BAD ")]
    if bad or not lines:
        raise AssertionError(f"not rebound as the table says: {bad or 'no rows checked'}")
    return "; ".join(ln[3:] for ln in lines)


def check_kernels(pins: dict[str, str]) -> str:
    from deepinfer_sm80.device import BUDGETS

    archs = {int(a.replace(".", "")) for a in pins["TORCH_CUDA_ARCH_LIST"].split()}
    if archs != set(BUDGETS):
        raise AssertionError(
            f"image arch list {sorted(archs)} but the kernel budgets cover {sorted(BUDGETS)}"
        )
    proc = subprocess.run(
        [sys.executable, "-m", "deepinfer_sm80.testing.sm80_report"], capture_output=True, text=True
    )
    rows = [ln for ln in proc.stdout.splitlines() if ln.rstrip().endswith("ok") or "FAIL" in ln]
    if proc.returncode != 0:
        failed = [ln for ln in rows if "FAIL" in ln] or proc.stderr.strip().splitlines()[-3:]
        raise AssertionError(f"sm80_report exit {proc.returncode}: {failed}")
    print(proc.stdout.rstrip())
    tilelang_skip = [ln for ln in proc.stdout.splitlines() if ln.startswith("TileLang kernels NOT compiled")]
    if tilelang_skip:
        raise AssertionError(f"{tilelang_skip[0]} (the image must compile its TileLang kernels too)")
    names = ", ".join(f"sm_{a}" for a in sorted(archs))
    return f"{len(rows)} kernel x arch compiles for {names}, all within budget"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--level", required=True, choices=sorted(LEVEL_PREFIXES))
    parser.add_argument("--skip-kernels", action="store_true", help="leave out the cross-compile (slow)")
    args = parser.parse_args(argv)
    pins = load_pins()
    # compiles go to a scratch cache, removed at the end: the image keeps no self-test artefacts
    scratch = tempfile.mkdtemp(prefix="deepinfer-selftest-")
    os.environ["TRITON_CACHE_DIR"] = scratch
    try:
        return _run(args, pins)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(args: argparse.Namespace, pins: dict[str, str]) -> int:
    check("pins", lambda: check_pins(pins))
    check("provenance", lambda: check_provenance(pins))
    check("patches", lambda: check_patches(args.level))
    check("overlay", lambda: check_overlay(args.level))
    check("bindings", check_bindings_resolve)
    check("bindings on forced sm_80", check_forced_rebind)
    if args.skip_kernels:
        skip("kernels", "--skip-kernels given")
    else:
        check("kernels", lambda: check_kernels(pins))
    skip("kernel launches, CUDA init, serving", "need a GPU: make gpu-suite / bench-ab on an SM8x host")
    if FAILURES:
        print(f"selftest: {len(FAILURES)} check(s) failed: {', '.join(FAILURES)}", file=sys.stderr)
        return 1
    print(f"selftest: level {args.level}: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
