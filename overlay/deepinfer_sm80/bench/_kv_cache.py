"""Shared body of bench/kv_gather.py and bench/kv_quant_insert.py: bitwise vs upstream vLLM 0.32.0's own
kernels (the cases and checks live in testing/cases/kv_gather.py and kv_quant_insert.py, which the op tests
assert too), then base / optimized / upstream timed (gather 4K..1M tokens, insert 1..8192 tokens; page sizes,
bytes per token and the GPU inputs in testing/kv_cache_shapes.py, which the entry-point cases share).

Upstream runs from the carried bundle; its kernels use tl.float8e4nv, so this needs sm_89+ (the H200).
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from deepinfer_sm80.formats.fp8_ds_mla import DATA_BYTES
from deepinfer_sm80.ops import kv_gather as kvg
from deepinfer_sm80.ops import kv_quant_insert as kvi
from deepinfer_sm80.testing.bench import (
    Ceilings,
    Row,
    Target,
    Timing,
    _copy_kernel,
    at_least,
    format_line,
    input_sets_needed,
    summarize,
    time_graph,
)
from deepinfer_sm80.testing.cases import kv_gather as gather_cases
from deepinfer_sm80.testing.cases import kv_quant_insert as insert_cases
from deepinfer_sm80.testing.inputs import avoid_seven_pow2
from deepinfer_sm80.testing.kv_cache_shapes import (
    GATHER_BLOCK_SIZE,
    GATHER_BYTES_PER_TOKEN,
    INSERT_BLOCK_SIZE,
    INSERT_BYTES_PER_TOKEN,
    block_table_for,
    prefill_slots,
    random_k,
    random_pool,
)

# DEEPINFER_BENCH_QUICK=1: base / DeepInfer / upstream only (no tile or grid sweeps), for a short lease
QUICK = os.environ.get("DEEPINFER_BENCH_QUICK") == "1"
GATHER_TOKENS = (4_096, 16_384, 49_152, 131_072, 1_048_576)
INSERT_TOKENS = (1, 4, 16, 64, 1_536, 4_096, 8_192)
# (BLOCK_T, num_warps) around the defaults; the first run swept (8|16|32|64, 4|8) and (1..16, 1..8)
GATHER_SWEEP = ((16, 4), (4, 1), (8, 4), (16, 2), (32, 8))
INSERT_SWEEP = ((4, 4), (8, 4), (16, 4))
SWEEP_GATHER_AT = (49_152, 131_072, 1_048_576)
SWEEP_INSERT_AT = (1_536, 4_096, 8_192)
SEED_GATHER_48K = {
    "baseline_us": 263.43,
    "optimized_us": 34.47,
    "speedup": 7.64,
    "gpu": "their SM80 (seed write-up)",
}


# ----------------------------------------------------------------------------- insert
def insert_timings(cu: object, ceilings: Ceilings, gen: torch.Generator) -> list[dict[str, object]]:
    return [_insert_size(cu, tokens, ceilings, gen) for tokens in INSERT_TOKENS]


def _insert_size(cu: object, tokens: int, ceilings: Ceilings, gen: torch.Generator) -> dict[str, object]:
    bytes_moved = tokens * INSERT_BYTES_PER_TOKEN
    n_sets = input_sets_needed(bytes_moved)
    bs = INSERT_BLOCK_SIZE
    num_blocks = -(-tokens // bs) + 2
    sets = [
        (
            avoid_seven_pow2(random_k(tokens, gen)),
            random_pool(num_blocks, bs, gen, valid=True),
            prefill_slots(tokens, num_blocks, bs, gen),
        )
        for _ in range(n_sets)
    ]

    def call(fn: Callable[..., object], **kw: object) -> Callable[[int], object]:
        return lambda i: fn(sets[i][0], sets[i][1], sets[i][2], bs, **kw)

    impls = {
        "optimized": call(kvi.quantize_and_insert_k_cache),
        "base": call(kvi.base_quantize_and_insert_k_cache),
        "upstream": call(cu.quantize_and_insert_k_cache),  # type: ignore[attr-defined]
    }
    if tokens in SWEEP_INSERT_AT and not QUICK:
        for bt, nw in INSERT_SWEEP:
            impls[f"optimized[T{bt},w{nw}]"] = call(kvi.launch_insert, block_t=bt, num_warps=nw)
    impls[SAME_SIZE_COPY] = same_size_copy(bytes_moved, n_sets)
    timings = {
        n: summarize(f"kv_insert T={tokens} {n}", time_graph(fn, n_sets), bytes_moved, ceilings)
        for n, fn in impls.items()
    }
    return _report(timings, tokens=tokens, block_size=bs, input_sets=n_sets)


SAME_SIZE_COPY = "copy[same bytes]"


def same_size_copy(bytes_moved: int, n_sets: int) -> Callable[[int], object]:
    """An SM copy kernel reading and writing bytes_moved in all (half each way), over n_sets buffer pairs
    rotated like the op's inputs: the ceiling at this size, launch and tail included, in the same run."""
    n = max(1, bytes_moved // 8)  # int32 words each way
    pairs = [
        (torch.zeros(n, dtype=torch.int32, device="cuda"), torch.empty(n, dtype=torch.int32, device="cuda"))
        for _ in range(n_sets)
    ]
    block = 4096
    return lambda i: _copy_kernel[(triton.cdiv(n, block),)](
        pairs[i][0], pairs[i][1], n, BLOCK=block, num_warps=8
    )


def _report(timings: dict[str, Timing], **meta: object) -> dict[str, object]:
    opt = timings["optimized"]
    copy = timings.get(SAME_SIZE_COPY)
    if copy is not None:  # the op's time against a plain copy of its bytes, launch included both sides
        meta["pct_of_same_size_copy"] = round(100 * copy.us / opt.us, 1)
    for n, t in timings.items():
        print(format_line(t, "" if n == "optimized" else f"optimized {t.us / opt.us:.2f}x faster"))
    speedups = {f"speedup_vs_{n}": round(t.us / opt.us, 3) for n, t in timings.items() if n != "optimized"}
    return {**meta, **{n: t.as_dict() for n, t in timings.items()}, **speedups}


# ----------------------------------------------------------------------------- gather
def gather_timings(cu: object, ceilings: Ceilings, gen: torch.Generator) -> list[dict[str, object]]:
    rows = []
    for tokens in GATHER_TOKENS:
        rows.append(_gather_size(cu, tokens, ceilings, gen))
        torch.cuda.empty_cache()
    return rows


def _gather_size(cu: object, tokens: int, ceilings: Ceilings, gen: torch.Generator) -> dict[str, object]:
    bs = GATHER_BLOCK_SIZE
    bytes_moved = tokens * GATHER_BYTES_PER_TOKEN + 4 * -(-tokens // bs)
    n_sets = input_sets_needed(bytes_moved, limit=32)
    num_blocks = -(-tokens // bs) + 1
    sets = [
        (
            torch.randn(1, tokens, 512, device="cuda", generator=gen).bfloat16(),
            random_pool(num_blocks, bs, gen, valid=True),
            block_table_for([tokens], num_blocks, bs, gen),
        )
        for _ in range(n_sets)
    ]
    seq = torch.tensor([tokens], dtype=torch.int32, device="cuda")

    def call(fn: Callable[..., object], **kw: object) -> Callable[[int], object]:
        return lambda i: fn(sets[i][0], sets[i][1], seq, None, sets[i][2], bs, 0, **kw)

    upstream = cu.dequantize_and_gather_k_cache_triton  # type: ignore[attr-defined]
    impls = {
        "optimized": call(kvg.dequantize_and_gather_k_cache, max_gather_len=tokens),
        "base": call(kvg.base_dequantize_and_gather_k_cache, max_gather_len=tokens),
        "base[max_gather_len=None]": call(kvg.base_dequantize_and_gather_k_cache),
        "upstream": call(upstream, max_gather_len=tokens),
        "upstream[max_gather_len=None]": call(upstream),
        "optimized[max_gather_len=None]": call(kvg.dequantize_and_gather_k_cache),
    }
    if QUICK:
        impls = {k: v for k, v in impls.items() if k in IMPL_OF}
    if tokens in (49_152, 131_072) and not QUICK:  # persistent-style grids: fewer programs looping over tiles
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for per_sm in (6, 12, 24):
            impls[f"optimized[{per_sm} programs/SM]"] = call(
                kvg.launch_gather, max_gather_len=tokens, max_programs=per_sm * sms
            )
    if tokens in SWEEP_GATHER_AT and not QUICK:
        for bt, nw in GATHER_SWEEP:
            impls[f"optimized[T{bt},w{nw}]"] = call(
                kvg.launch_gather, max_gather_len=tokens, block_t=bt, num_warps=nw
            )
    impls[SAME_SIZE_COPY] = same_size_copy(bytes_moved, n_sets)
    slow = tokens >= 131_072  # base/upstream take milliseconds there: fewer replays
    timings = {
        n: summarize(
            f"kv_gather {tokens // 1024}K {n}",
            time_graph(fn, n_sets, replays=5 if slow and not n.startswith("optimized") else 20),
            bytes_moved,
            ceilings,
        )
        for n, fn in impls.items()
    }
    return _report(timings, tokens=tokens, block_size=bs, input_sets=n_sets)


# ----------------------------------------------------------------------------- ceilings probes
_ROW = tl.constexpr(DATA_BYTES)  # jit bodies read module globals only as constexpr


@triton.jit
def _mix_probe_kernel(src_ptr, dst_ptr, BLOCK_T: tl.constexpr):  # noqa: ANN001
    """The gather's traffic without its decode: 512 bytes of each 576-byte row in, 512 bf16 out."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.arange(0, 512)[None, :]
    x = tl.load(src_ptr + t[:, None] * _ROW + c)
    tl.store(dst_ptr + t[:, None] * 512 + c, x.to(tl.bfloat16))


def mix_probe(ceilings: Ceilings) -> dict[str, object]:
    """The gather's byte mix (512 of 576 bytes in, 1024 out per row) with no decode: what the
    gather could reach if decoding were free, beside the suite's copy ceiling."""
    tokens = 1 << 20
    sets = [
        (
            torch.randint(0, 256, (tokens, DATA_BYTES), dtype=torch.uint8, device="cuda"),
            torch.empty(tokens, 512, dtype=torch.bfloat16, device="cuda"),
        )
        for _ in range(2)
    ]
    mix = time_graph(lambda i: _mix_probe_kernel[(tokens // 16,)](sets[i][0], sets[i][1], BLOCK_T=16), 2)
    timing = summarize("gather byte mix, no decode, 1M rows", mix, tokens * (512 + 1024), ceilings)
    print(format_line(timing))
    return timing.as_dict()


SECTIONS = {
    "gather": ("gather_mix_probe", "gather_correctness", "gather"),
    "insert": ("insert_correctness", "insert"),
}


def run(op: str, ceilings: Ceilings) -> dict[str, object]:
    """Every section of one op (`gather` or `insert`); a failing section's error goes into the JSON."""
    import vllm.models.deepseek_v41.common.ops.cache_utils as cu  # the carried upstream tree

    gen = torch.Generator(device="cuda").manual_seed(20261129)
    fns: dict[str, Callable[[], object]] = {
        "gather_mix_probe": lambda: mix_probe(ceilings),
        "insert_correctness": lambda: insert_cases.upstream_bitwise(cu, gen),
        "gather_correctness": lambda: gather_cases.upstream_bitwise(cu, gen),
        "gather": lambda: gather_timings(cu, ceilings, gen),
        "insert": lambda: insert_timings(cu, ceilings, gen),
    }
    result: dict[str, object] = {
        "upstream": "vllm 0.32.0 (official wheel's Python tree): quantize_and_insert_k_cache, "
        "dequantize_and_gather_k_cache_triton (CUDA path, per-group kernel)",
        "baseline": "base = SM80 ports of upstream's kernels (software e4m3, same grid and loops)",
        "config": {
            "gather": {"BLOCK_T": kvg.BLOCK_T, "num_warps": kvg.NUM_WARPS},
            "insert": {"BLOCK_T": kvi.BLOCK_T, "num_warps": kvi.NUM_WARPS},
        }[op],
        "bytes_per_token": GATHER_BYTES_PER_TOKEN if op == "gather" else INSERT_BYTES_PER_TOKEN,
    }
    if op == "gather":
        result["seed_gather_48k"] = SEED_GATHER_48K
    for key in SECTIONS[op]:
        try:
            result[key] = fns[key]()
        except Exception:
            traceback.print_exc()
            result[key] = {"error": traceback.format_exc()[-2000:]}
    _summary(result)
    return result


IMPL_OF = {"optimized": "deepinfer", "base": "base", "upstream": "upstream"}


def rows(op: str, result: dict[str, object], block_size_label: str) -> list[Row]:
    """Long-format rows for the three main impls; sweep variants stay in the JSON's sections."""
    correctness = result.get(f"{op}_correctness", {})
    assert isinstance(correctness, dict)

    def verdict(impl_key: str) -> str:
        cases = [  # bitwise verdicts only (the 7·2^j probe reports exponent counts beside its own)
            v for v in correctness.values() if isinstance(v, dict) and "bitwise" in v.get(impl_key, {})
        ]
        if not cases:
            return "n/a"
        return "bitwise" if all(c[impl_key].get("bitwise") for c in cases) else "mismatch"

    out = []
    timed = result.get(op, [])
    for shape in timed if isinstance(timed, list) else []:
        for key, impl in IMPL_OF.items():
            t = shape[key]
            out.append(
                Row(
                    op=f"kv_{'gather' if op == 'gather' else 'quant_insert'}",
                    impl=impl,
                    shape=block_size_label,
                    size=int(shape["tokens"]),
                    us=t["us"],
                    gbps=t["gbps"],
                    pct_of_copy=t["pct_of_copy"],
                    floor_us=t["floor_us"],
                    verdict="n/a" if key == "upstream" else verdict(key),
                )
            )
    return out


def _summary(result: dict[str, object]) -> None:
    for key in ("gather", "insert"):
        rows = result.get(key)
        if not isinstance(rows, list):
            continue
        for r in rows:
            o = r["optimized"]
            print(
                f"{key:6} {r['tokens']:>8} tok  opt {o['us']:9.1f} us {o['gbps']:7.0f} GB/s "
                f"({o['pct_of_copy']}% copy, "
                f"floor {o['floor_us']} us)  base {r['base']['us']:9.1f}  "
                f"upstream {r['upstream']['us']:9.1f}  x{r['speedup_vs_base']} vs base, "
                f"x{r['speedup_vs_upstream']} vs upstream"
            )


def same_size_targets(
    kind: str, result: dict[str, object], goal: float, sizes: tuple[int, ...] | None
) -> list[Target]:
    """The op (`kind`: gather or insert) against an SM copy of its own bytes timed beside it (launch and
    tail included both sides): what the size allows, where "% of copy" compares with a multi-GB copy's
    bandwidth. `sizes`: the token counts that carry a goal (None: every timed one)."""
    out = []
    timed = result.get(kind, [])
    for shape in timed if isinstance(timed, list) else []:
        tokens = int(shape["tokens"])
        if "pct_of_same_size_copy" in shape and (sizes is None or tokens in sizes):
            out.append(
                at_least(
                    f"{kind} T={tokens} time of a same-size copy / ours (%)",
                    float(shape["pct_of_same_size_copy"]),
                    goal,
                    "% of same-size copy",
                    cause="the decode/encode arithmetic and the slot -> page chain on top of the copy",
                )
            )
    return out
