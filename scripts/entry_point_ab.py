"""Kernel A/B through the patched entry points: each bound upstream symbol at the base and optimized level.

On a GPU, with the GPU bundle on PYTHONPATH (scripts/gpu_suite.sh sets it up):
    DEEPINFER_SM80_FORCE_CAPABILITY=80 python scripts/entry_point_ab.py --out DIR [--only a,b] [--quick]

For each upstream module with rows, the binding hook (`rebind`, the line patch 00 appends) runs once with
no level marker (base) and once with patch 01's marker module simulated in sys.modules (optimized); the
objects it leaves in the upstream module are what vLLM calls. Every row with a different target at the
two levels and a case in its op's testing/cases/<op>.py is timed (CUDA-graph replays over input sets
rotated past L2, the ops' own bench input builders) and the optimized output is checked against the
base output (bitwise, or the op's bench tolerance). Writes DIR/entry_point_ab.json: `rows` (common Row
format: impl "base" = base level, "deepinfer" = optimized level), `targets` (optimized never slower than
base at any shape), `errors` (a case that raised is recorded and the rest continue) and `skipped` (rows
not A/B-able here, with the reason). Exit 0 when every case ran and met its target, 1 otherwise, 2 on
bad arguments.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "overlay") not in sys.path:
    sys.path.insert(0, str(ROOT / "overlay"))

from deepinfer_sm80 import bindings  # noqa: E402
from deepinfer_sm80.testing.cases.entry_point import Shape, entry_point_cases  # noqa: E402

if TYPE_CHECKING:
    from deepinfer_sm80.testing.bench import Target
# testing.bench defines Triton kernels: imported at call time, so importing this script (its CPU tests)
# defines none before a test session has chosen the interpreter

OUT_NAME = "entry_point_ab.json"
SLOWER_CAUSE = "optimized slower than base at this shape (see the op's bench and docs for the cause)"


# ----------------------------------------------------------------------------- arguments
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for entry_point_ab.json")
    parser.add_argument("--only", default="", help="comma-separated binding row names (default: all)")
    parser.add_argument("--quick", action="store_true", help="the smallest shape of each case only")
    args = parser.parse_args(argv)
    names = {n.strip() for n in args.only.split(",") if n.strip()}
    unknown = names - {b.name for b in bindings.BINDINGS}
    if unknown:
        parser.error(f"--only: unknown binding row(s) {sorted(unknown)}")
    args.only = names
    return args


# ----------------------------------------------------------------------------- the two levels
@contextmanager
def level(name: str) -> Iterator[None]:
    """patch 01 installed (optimized) or not (base), as `bindings.active_level` sees it."""
    saved = sys.modules.pop(bindings.LEVEL_MARKER, None)
    if name == "optimized":
        sys.modules[bindings.LEVEL_MARKER] = SimpleNamespace(LEVEL="optimized")  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.modules.pop(bindings.LEVEL_MARKER, None)
        if saved is not None:
            sys.modules[bindings.LEVEL_MARKER] = saved


def bound_objects(rows: list[bindings.Binding]) -> dict[str, dict[str, Any]]:
    """level -> row name -> the object the hook leaves on the upstream symbol at that level.

    Upstream modules are left at the optimized level (rebind is idempotent; each run rebinds from
    upstream's saved originals)."""
    out: dict[str, dict[str, Any]] = {}
    for lvl in bindings.LEVELS:
        with level(lvl):
            got: dict[str, Any] = {}
            for module_name in dict.fromkeys(r.module for r in rows):
                module = importlib.import_module(module_name)
                bindings.rebind(vars(module), module_name)
                for row in rows:
                    if row.module == module_name:
                        got[row.name] = bindings._get(vars(module), row.symbol)
            out[lvl] = got
    return out


def ab_able(row: bindings.Binding) -> str | None:
    """None if the row has distinct base and optimized objects to time, else why not."""
    if row.optimized is None or row.optimized == row.base:
        return "same target at both levels"
    if row.wrap:
        return "wraps a method/gate (measured end to end by its own bench and the serving A/B)"
    if row.name not in CASES:
        return "no entry-point case (ENTRY_POINT_CASES in testing/cases/<op>.py)"
    return None


# ----------------------------------------------------------------------------- result rows
def pair_rows(
    op: str, shape: str, size: int, base: Any, opt: Any, verdict: str
) -> tuple[list[dict[str, object]], Target]:
    """The base-level and optimized-level Rows of one shape (Timings) and its never-slower target."""
    from deepinfer_sm80.testing.bench import Row, Target, at_most

    rows = [
        Row.from_timing(op, "base", shape, size, base, "n/a").as_dict(),
        Row.from_timing(op, "deepinfer", shape, size, opt, verdict).as_dict(),
    ]
    ratio = opt.us / base.us if base.us > 0 else float("inf")
    target = at_most(f"{op} {shape} {size}: optimized/base time", ratio, 1.0, "x", SLOWER_CAUSE)
    if verdict == "mismatch":
        target = Target(
            target.name,
            target.measured,
            target.goal,
            target.unit,
            False,
            "output mismatch",
            direction=target.direction,
        )
    return rows, target


def summary(rows: list[dict], targets: list[Target], errors: list[dict], skipped: dict, env: dict) -> dict:
    return {
        "rows": rows,
        "targets": [t.as_dict() for t in targets],
        "errors": errors,
        "skipped": skipped,
        "environment": env,
        "all_met": bool(targets) and all(t.met for t in targets) and not errors,
    }


# ----------------------------------------------------------------------------- cases (GPU)
# each op's entry-point shapes live with its other cases, in testing/cases/<op>.py (ENTRY_POINT_CASES)
CASES: dict[str, Callable[[bool], Iterator[Shape]]] = entry_point_cases()


def run_case(
    row: bindings.Binding, fns: dict[str, dict[str, Any]], quick: bool, ceilings: Any
) -> tuple[list, list]:
    from deepinfer_sm80.testing.bench import summarize, time_graph

    rows, targets = [], []
    for shape in CASES[row.name](quick):
        run = shape.make()
        base_fn, opt_fn = fns["base"][row.name], fns["optimized"][row.name]
        verdict = shape.check(run(opt_fn, 0), run(base_fn, 0))
        t = {
            lvl: summarize(
                f"{row.name} {shape.label} {shape.size} {lvl}",
                time_graph(lambda i, f=fn, r=run: r(f, i), shape.n_sets, replays=10),
                shape.bytes_moved,
                ceilings,
            )
            for lvl, fn in (("base", base_fn), ("optimized", opt_fn))
        }
        pair, target = pair_rows(row.name, shape.label, shape.size, t["base"], t["optimized"], verdict)
        print(f"{row.name:20} {shape.label:16} {shape.size:8} base {t['base'].us:9.1f} us | "
              f"optimized {t['optimized'].us:9.1f} us | {verdict}")  # fmt: skip
        rows += pair
        targets.append(target)
    return rows, targets


def environment() -> dict[str, object]:
    import torch
    import triton

    p = torch.cuda.get_device_properties(0)
    return {
        "gpu": p.name, "capability": f"{p.major}.{p.minor}", "torch": torch.__version__,
        "triton": triton.__version__, "forced_capability": bindings.device_capability(),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import os

    import torch

    if not torch.cuda.is_available():
        print("entry_point_ab: no CUDA device", file=sys.stderr)
        return 2
    os.environ.setdefault(bindings.ENV_FORCE_CAPABILITY, "80")
    from deepinfer_sm80.testing.bench import Ceilings

    chosen = [b for b in bindings.BINDINGS if not args.only or b.name in args.only]
    skipped = {b.name: why for b in chosen if (why := ab_able(b)) is not None}
    todo = [b for b in chosen if b.name not in skipped]
    errors: list[dict[str, str]] = []
    try:
        fns = bound_objects(todo)
    except Exception as exc:  # one module that does not import must not hide the others
        fns = {"base": {}, "optimized": {}}
        errors.append({"row": "*", "stage": "bind", "error": f"{type(exc).__name__}: {exc}"})
        for row in todo:
            try:
                one = bound_objects([row])
                for lvl in fns:
                    fns[lvl].update(one[lvl])
            except Exception as exc2:
                errors.append({"row": row.name, "stage": "bind", "error": f"{type(exc2).__name__}: {exc2}"})
    ceilings = Ceilings.measure()
    rows: list[dict] = []
    targets: list[Target] = []
    for row in todo:
        if row.name not in fns["base"]:
            continue
        try:
            r, t = run_case(row, fns, args.quick, ceilings)
            rows += r
            targets += t
        except Exception as exc:
            traceback.print_exc()
            errors.append({"row": row.name, "stage": "run", "error": f"{type(exc).__name__}: {exc}"})
        torch.cuda.empty_cache()
    env = {**environment(), "ceilings": ceilings.as_dict()}
    result = summary(rows, targets, errors, skipped, env)
    from deepinfer_sm80.testing.provenance import provenance

    result["provenance"] = provenance()  # tests/test_results_provenance.py checks every results JSON
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / OUT_NAME).write_text(json.dumps(result, indent=1) + "\n")
    print(f"entry_point_ab: {len(targets)} shapes, {sum(t.met for t in targets)} met, {len(errors)} errors "
          f"-> {args.out / OUT_NAME}")  # fmt: skip
    return 0 if result["all_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
