"""`make sm80-report`: compile every registered kernel for sm_80 and sm_86 and print a resource table.

Usage: python -m deepinfer_sm80.testing.sm80_report [--json results/sm80-compile.json]
Exits 1 if any kernel spills, exceeds a budget or uses hardware FP8.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from deepinfer_sm80.registry import all_specs, tilelang_specs
from deepinfer_sm80.testing.budgets import BUDGETS
from deepinfer_sm80.testing.crosscompile import CompileReport, compile_for
from deepinfer_sm80.testing.provenance import provenance


def build_reports() -> tuple[list[CompileReport], str | None]:
    """Triton and TileLang kernels for every arch; the reason TileLang was skipped, if it was."""
    from deepinfer_sm80.testing.tilelang_compile import compile_tilelang, tilelang_missing_reason

    reports = [compile_for(spec, arch) for spec in all_specs() for arch in BUDGETS]
    skipped = tilelang_missing_reason()
    if skipped is None:
        reports += [compile_tilelang(spec, arch) for spec in tilelang_specs() for arch in BUDGETS]
    return reports, skipped


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
    reports, tilelang_skipped = build_reports()
    print(format_table(reports))
    if tilelang_skipped:
        print(f"TileLang kernels NOT compiled: {tilelang_skipped}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload: dict[str, object] = {
            "schema": 2,
            "what": "Triton and TileLang kernels compiled on CPU for sm_80/sm_86; resources from cuobjdump",
            "tilelang_skipped": tilelang_skipped,
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
