"""Kernel A/B through the patched entry points: each bound upstream symbol at the base and optimized level.

On a GPU, with the GPU bundle on PYTHONPATH (scripts/gpu_suite.sh sets it up):
    DEEPINFER_SM80_FORCE_CAPABILITY=80 python scripts/entry_point_ab.py --out DIR [--only a,b] [--quick]

For each upstream module with rows, the binding hook (`rebind`, the line patch 00 appends) runs once with
no level marker (base) and once with patch 01's marker module simulated in sys.modules (optimized); the
objects it leaves in the upstream module are what vLLM calls. Every row with a different target at the
two levels and a case below is timed (CUDA-graph replays over input sets rotated past L2, the ops'
own bench input builders) and the optimized output is checked against the base output (bitwise, or
the op's bench tolerance). Writes DIR/entry_point_ab.json: `rows` (common Row format: impl "base" =
base level, "deepinfer" = optimized level), `targets` (optimized never slower than base at any shape),
`errors` (a case that raised is recorded and the rest continue) and `skipped` (rows not A/B-able here,
with the reason). Exit 0 when every case ran and met its target, 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "overlay") not in sys.path:
    sys.path.insert(0, str(ROOT / "overlay"))

from deepinfer_sm80 import bindings  # noqa: E402

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
        return "no entry-point case in scripts/entry_point_ab.py"
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
            target.name, target.measured, target.goal, target.unit, False, "output mismatch",
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
@dataclass(frozen=True)
class Shape:
    label: str
    size: int
    bytes_moved: int
    make: Callable[[], Callable[[Callable[..., Any], int], Any]]  # -> run(fn, set_index) -> outputs
    n_sets: int
    check: Callable[[Any, Any], str]  # (optimized outputs, base outputs) -> verdict


def _bitwise(a: Any, b: Any) -> str:
    import torch

    a, b = (a if isinstance(a, list | tuple) else [a]), (b if isinstance(b, list | tuple) else [b])
    same = all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b, strict=True))
    return "bitwise" if same else "mismatch"


def _kv_insert_shapes(quick: bool) -> Iterator[Shape]:
    from deepinfer_sm80.bench import _kv_cache as kc
    from deepinfer_sm80.testing.bench import input_sets_needed
    from deepinfer_sm80.testing.inputs import avoid_seven_pow2, generator

    # amax = 7·2^j groups may round to either exponent (docs/FP8_DS_MLA.md): nudged, as the bench does
    for tokens in (64,) if quick else (1, 64, 1_536, 8_192):
        bs, n_bytes = kc.INSERT_BLOCK_SIZE, tokens * kc.INSERT_BYTES_PER_TOKEN
        n_sets = input_sets_needed(n_bytes)

        def make(tokens: int = tokens, bs: int = bs, n_sets: int = n_sets) -> Callable[..., Any]:
            gen = generator(f"ab-kv-insert-{tokens}", "cuda")
            blocks = -(-tokens // bs) + 2
            sets = [
                (avoid_seven_pow2(kc.random_k(tokens, gen)), kc.random_pool(blocks, bs, gen, valid=True),
                 kc.prefill_slots(tokens, blocks, bs, gen))
                for _ in range(n_sets)
            ]  # fmt: skip
            pools = {}

            def run(fn: Callable[..., Any], i: int) -> Any:
                k, pool, slots = sets[i]
                if (id(fn), i) not in pools:  # per-level copies, made before capture (never inside it)
                    pools[(id(fn), i)] = pool.clone()
                target = pools[(id(fn), i)]
                fn(k, target, slots, bs)
                return target

            return run

        yield Shape(f"prefill-T{tokens}", tokens, n_bytes, make, n_sets, _bitwise)


def _kv_gather_shapes(quick: bool) -> Iterator[Shape]:
    import torch

    from deepinfer_sm80.bench import _kv_cache as kc
    from deepinfer_sm80.testing.bench import input_sets_needed
    from deepinfer_sm80.testing.inputs import generator

    for tokens in (4_096,) if quick else (4_096, 49_152, 131_072):
        bs = kc.GATHER_BLOCK_SIZE
        n_bytes = tokens * kc.GATHER_BYTES_PER_TOKEN
        n_sets = input_sets_needed(n_bytes, limit=16)

        def make(tokens: int = tokens, bs: int = bs, n_sets: int = n_sets) -> Callable[..., Any]:
            gen = generator(f"ab-kv-gather-{tokens}", "cuda")
            blocks = -(-tokens // bs) + 1
            sets = [
                (kc.random_pool(blocks, bs, gen, valid=True), kc.block_table_for([tokens], blocks, bs, gen))
                for _ in range(n_sets)
            ]
            seq = torch.tensor([tokens], dtype=torch.int32, device="cuda")
            outs: dict[tuple[int, int], torch.Tensor] = {}

            def run(fn: Callable[..., Any], i: int) -> Any:
                if (id(fn), i) not in outs:
                    outs[(id(fn), i)] = torch.zeros(1, tokens, 512, dtype=torch.bfloat16, device="cuda")
                out = outs[(id(fn), i)]
                pool, table = sets[i]
                fn(out, pool, seq, None, table, bs, 0, max_gather_len=tokens)
                return out

            return run

        yield Shape(f"compressed-{tokens // 1024}k", tokens, n_bytes, make, n_sets, _bitwise)


def _combine_shapes(quick: bool) -> Iterator[Shape]:
    from deepinfer_sm80.bench import topk_swa_combine as bc
    from deepinfer_sm80.testing.bench import input_sets_needed
    from deepinfer_sm80.testing.inputs import generator

    for tokens, ratio in ((512, 1),) if quick else ((64, 1), (512, 1), (1_536, 2), (4_096, 1)):
        gen = generator(f"ab-combine-{tokens}-{ratio}")  # the combiner builder draws on the CPU
        probe = bc.chunk(tokens, ratio, gen)
        n_bytes = bc.bytes_moved(probe)
        n_sets = input_sets_needed(n_bytes, limit=16)

        def make(tokens: int = tokens, ratio: int = ratio, n_sets: int = n_sets) -> Callable[..., Any]:
            gen = generator(f"ab-combine-{tokens}-{ratio}")  # the combiner builder draws on the CPU
            sets = [bc.chunk(tokens, ratio, gen) for _ in range(n_sets)]

            def run(fn: Callable[..., Any], i: int) -> Any:
                return fn(**bc.args(sets[i]))  # out=None: both write every column

            return run

        yield Shape(f"r{ratio}-T{tokens}", tokens, n_bytes, make, n_sets, _bitwise)


def _sparse_close(tol: float) -> Callable[[Any, Any], str]:
    def check(a: Any, b: Any) -> str:
        from deepinfer_sm80.bench.sparse_mla import _close

        return _close(a.cpu(), b.cpu(), tol)

    return check


def _decode_shapes(quick: bool) -> Iterator[Shape]:
    import torch

    from deepinfer_sm80.bench.sparse_mla_cases import decode_inputs
    from deepinfer_sm80.formats.fp8_ds_mla import RECORD_BYTES
    from deepinfer_sm80.testing.bench import input_sets_needed
    from deepinfer_sm80.testing.inputs import generator
    from deepinfer_sm80.testing.shapes import V41

    for tq, heads, ctx in (
        ((16, 64, 16_384),) if quick else ((1, 64, 16_384), (16, 64, 16_384), (64, 8, 65_536))
    ):
        n_bytes = tq * ((128 + 512) * (RECORD_BYTES + 4) + 2 * heads * 512 * 2)
        n_sets = input_sets_needed(n_bytes, limit=16)

        def make(
            tq: int = tq, heads: int = heads, ctx: int = ctx, n_sets: int = n_sets
        ) -> Callable[..., Any]:
            gen = generator(f"ab-decode-{tq}-{heads}-{ctx}", "cuda")
            states = ctx  # ratio 1
            sets = [
                decode_inputs([128] * tq, [512] * tq, heads, gen, swa_blocks=tq * 4 + 1,
                              kv_blocks=tq * states // 32 + 1, region=states, q_scale=0.3)
                for _ in range(n_sets)
            ]  # fmt: skip
            outs: dict[tuple[int, int], torch.Tensor] = {}

            def run(fn: Callable[..., Any], i: int) -> Any:
                s = sets[i]
                if (id(fn), i) not in outs:
                    outs[(id(fn), i)] = torch.empty_like(s.q)
                out = outs[(id(fn), i)]
                fn(s.q, s.kv_cache, s.swa_cache, False, None, None, s.swa_dense, s.swa_lens, s.swa_ragged,
                   s.swa_indptr, s.topk_ragged, s.topk_indptr, s.sink, V41.scale, 512, 448, 64,
                   out)  # fmt: skip
                return out

            return run

        yield Shape(f"h{heads}-ctx{ctx // 1024}k", tq, n_bytes, make, n_sets, _sparse_close(448.0))


def _prefill_shapes(quick: bool) -> Iterator[Shape]:
    import torch

    from deepinfer_sm80.bench.sparse_mla_cases import prefill_inputs
    from deepinfer_sm80.testing.inputs import generator
    from deepinfer_sm80.testing.shapes import V41

    for tokens, heads, ctx in ((256, 64, 16_384),) if quick else ((256, 64, 16_384), (1_024, 8, 65_536)):
        width = 512 + 128
        num_kv = ctx + 128 + tokens
        n_bytes = tokens * (width * 4 + 2 * heads * 512 * 2) + num_kv * 1024

        def make(tokens: int = tokens, heads: int = heads, num_kv: int = num_kv, width: int = width) -> Any:
            gen = generator(f"ab-prefill-{tokens}-{heads}-{num_kv}", "cuda")
            inp = prefill_inputs([width] * tokens, heads, num_kv, gen, width=width, q_scale=0.3)
            outs: dict[int, torch.Tensor] = {}

            def run(fn: Callable[..., Any], _: int) -> Any:
                if id(fn) not in outs:
                    outs[id(fn)] = torch.empty_like(inp.q)
                out = outs[id(fn)]
                fn(inp.q, inp.kv, inp.indices, inp.lens, V41.scale, 512, 448, 64, inp.sink, out)
                return out

            return run

        yield Shape(f"h{heads}-ctx{ctx // 1024}k", tokens, n_bytes, make, 1, _sparse_close(5.0))


def _mhc_check(a: Any, b: Any) -> str:
    import torch

    from deepinfer_sm80.testing.compare import MismatchError, assert_close

    a, b = (a if isinstance(a, tuple | list) else (a,)), (b if isinstance(b, tuple | list) else (b,))
    try:
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
                continue
            assert_close(f"mhc[{i}]", x.float(), y.float(), abs=5e-5, rel_in_eps=2**12, why="bench tolerance")
    except MismatchError as exc:
        print(f"  mismatch: {exc}")
        return "mismatch"
    return "close"


def _mhc_shapes(kind: str, quick: bool) -> Iterator[Shape]:
    from deepinfer_sm80.bench import mhc as bm

    for tokens in (12,) if quick else (1, 12, 1_536):
        n_bytes = tokens * bm.HIDDEN * 2 * (2 if kind == "pre" else 9)

        def make(tokens: int = tokens) -> Callable[..., Any]:
            sets = bm._sets(f"ab-mhc-{kind}-T{tokens}", tokens)
            streams = [s.x.unsqueeze(1).expand(-1, 4, -1).contiguous() for s in sets]

            def run(fn: Callable[..., Any], i: int) -> Any:
                s = sets[i % len(sets)]
                if kind == "pre":
                    return fn(streams[i % len(sets)], s.fn_broadcast, s.hc_scale, s.hc_base, *bm.SCALARS,
                              x=s.x, norm_weight=s.norm_weight, norm_eps=bm.P.norm_eps)  # fmt: skip
                return fn(s.x, s.residual, s.post.unsqueeze(-1), s.comb)

            return run

        yield Shape(f"h{bm.HIDDEN}", tokens, n_bytes, make, 4, _mhc_check)


CASES: dict[str, Callable[[bool], Iterator[Shape]]] = {
    "kv_insert": _kv_insert_shapes,
    "kv_gather": _kv_gather_shapes,
    "topk_swa_combine": _combine_shapes,
    "sparse_mla_decode": _decode_shapes,
    "sparse_mla_prefill": _prefill_shapes,
    "mhc_pre": lambda quick: _mhc_shapes("pre", quick),
    "mhc_post": lambda quick: _mhc_shapes("post", quick),
}


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
