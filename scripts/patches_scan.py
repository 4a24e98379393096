"""Reachability compile scan of the SM8x serving path (part of issue 13's proof).

1. Runs, under TRITON_INTERPRET=1 on the CPU, the tests that drive the SM8x path with the binding
   table applied at capability 8.0: the attention layer's forward_mqa (decode + prefill, which calls
   upstream's metadata/combine/inverse-RoPE kernels and the overlay's gather and sparse MLA) and the
   row targets' own tests (compressed-KV writer, Engram lookup, pack_seq), recording every Triton launch;
   then the layer at production shapes (top-k 512, 64 and 8 heads) with launches recorded, not run.
2. Cross-compiles each recorded launch (kernel, signature, constexprs, warps) for sm_80 and sm_86.
3. Writes results/sm80-reachability.json; exit 1 if any launch fails to compile or emits a hardware
   e4m3 conversion (fp8e4nv / sm_89+ PTX). Register/spill/smem budget misses are reported, not fatal.

Usage: python scripts/patches_scan.py [--out results/sm80-reachability.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "overlay"))

# tests that drive the SM8x path; comparison tests that launch upstream's fp8 kernels as the reference
# (test_o_proj_upstream.py, the *_upstream_* GPU cases) are not drivers
DRIVERS = (
    "overlay/tests/integration/test_sm8x_attention.py",
    "overlay/tests/integration/test_pack_seq.py",
    "overlay/tests/ops/test_compress_insert.py",
    "overlay/tests/ops/test_engram.py",
)


# production shapes (top-k 512, TP1 64 heads, TP8 8 heads): launches recorded, not interpreted
PRODUCTION = ("overlay/tests/integration/test_sm8x_attention.py", "-k", "topk512")


def trace(path: Path, tests: tuple[str, ...], **extra_env: str) -> None:
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        DEEPINFER_INTERPRET_VLLM_TRITON="1",
        DEEPINFER_KERNEL_TRACE=str(path),
        **extra_env,
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "deepinfer_sm80.testing.kernel_trace",
            *tests,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0 or " passed" not in proc.stdout:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        raise SystemExit("patches-scan: the driving tests failed:\n" + "\n".join(tail))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "sm80-reachability.json")
    args = parser.parse_args(argv)
    # the traced tests run interpreted in their own processes; the cross-compile here needs real JIT
    # functions, so an interpreter switch inherited from a calling test session must not apply
    os.environ.pop("TRITON_INTERPRET", None)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "launches.jsonl"
        trace(path, DRIVERS)
        trace(path, PRODUCTION, DEEPINFER_KERNEL_TRACE_ONLY="1")
        from deepinfer_sm80.testing.kernel_trace import compile_trace

        launches = len(set(path.read_text().splitlines()))
        rows = compile_trace(path)
    # fatal: it did not compile (no resource report) or it emits a hardware e4m3 conversion
    fatal = [r for r in rows if "regs" not in r or r.get("uses_hw_fp8")]
    kernels = sorted({r["kernel"] for r in rows})
    budget = [r for r in rows if r["problems"] and r not in fatal]
    result = {
        "what": "every Triton launch of the SM8x path's driving tests, cross-compiled for sm_80/sm_86",
        "drivers": [*DRIVERS, " ".join(PRODUCTION) + " (launches recorded, not run)"],
        "launches": launches,
        "kernels": kernels,
        "rows": rows,
        "targets": [
            {
                "name": "launches that compile for sm_80 and sm_86 without hardware e4m3",
                "measured": len(rows) - len(fatal),
                "goal": len(rows),
                "unit": "launch x arch",
                "direction": "==",
                "met": not fatal,
                "cause": "; ".join(f"{r['kernel']} sm_{r['arch']}: {r['problems']}" for r in fatal),
            },
            {
                "name": "launches within the register/spill/smem budgets",
                "measured": len(rows) - len(budget) - len(fatal),
                "goal": len(rows),
                "unit": "launch x arch",
                "direction": "==",
                "met": not budget and not fatal,
                "cause": "; ".join(
                    f"{r['kernel'].rsplit('.', 1)[-1]} sm_{r['arch']}: {r['problems']}" for r in budget
                ),
            },
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # a re-run that finds the same launches keeps the file (and its provenance) byte for byte
    old = json.loads(args.out.read_text()) if args.out.exists() else {}
    if {k: v for k, v in old.items() if k != "provenance"} != json.loads(json.dumps(result)):
        from deepinfer_sm80.testing.provenance import provenance

        result["provenance"] = provenance()
        args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(
        f"patches-scan: {launches} launches of {len(kernels)} kernels, {len(rows)} compiles; "
        f"{len(fatal)} fatal, {len(budget)} over budget -> {args.out}"
    )
    for r in fatal + budget:
        print(f"  {r['kernel']} sm_{r['arch']}: {r['problems']}")
    return 1 if fatal else 0


if __name__ == "__main__":
    sys.exit(main())
