"""KV-cache insert and gather on the 584-byte record: bitwise vs upstream vLLM 0.32.0's own kernels, then
base / optimized / upstream timed at the issue's sizes (gather 4K..1M tokens, insert 1..8192 tokens).

Upstream runs from the carried bundle; its kernels use tl.float8e4nv, so this needs sm_89+ (the H200).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl

from deepinfer_sm80.ops import kv_gather as kvg
from deepinfer_sm80.ops import kv_quant_insert as kvi
from deepinfer_sm80.formats.fp8_ds_mla import DATA_BYTES, RECORD_BYTES, SCALE_BYTES, page_bytes, token_views
from deepinfer_sm80.testing.bench import (
    Ceilings,
    Timing,
    format_line,
    input_sets_needed,
    summarize,
    time_graph,
)
from deepinfer_sm80.testing.compare import MismatchError, assert_bitwise_equal

GATHER_TOKENS = (4_096, 16_384, 49_152, 131_072, 1_048_576)
GATHER_BLOCK_SIZE = 128  # compressed cache, ratio 1: 128 states per 74,880-byte page (SPEC.md §2.1)
INSERT_TOKENS = (1, 4, 16, 64, 1_536, 4_096, 8_192)
INSERT_BLOCK_SIZE = 64
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
GATHER_BYTES_PER_TOKEN = RECORD_BYTES + 512 * 2  # 584 read + 1024 written
INSERT_BYTES_PER_TOKEN = 512 * 2 + 8 + RECORD_BYTES  # k row + int64 slot read, record written


# ----------------------------------------------------------------------------- inputs (on the GPU)
def random_pool(num_blocks: int, block_size: int, gen: torch.Generator, *, valid: bool) -> torch.Tensor:
    """[num_blocks, block_size, 584] view of random pages; `valid` makes them encoder-like (finite codes,
    scales 105..247, pad 0, finite RoPE) for timing, else every byte pattern appears."""
    page = page_bytes(block_size)
    pool = torch.randint(0, 256, (num_blocks, page), dtype=torch.uint8, device="cuda", generator=gen)
    view = pool.as_strided((num_blocks, block_size, RECORD_BYTES), (page, RECORD_BYTES, 1))
    data, scale = token_views(view, block_size)
    if valid:
        nope = data[..., :448]
        nope[(nope & 0x7F) == 0x7F] = 0x7E
        data[..., 448:] = (
            torch.randn(num_blocks, block_size, 64, device="cuda", generator=gen)
            .bfloat16()
            .view(torch.uint8)
            .view(num_blocks, block_size, 128)
        )
        scale[..., :7] = torch.randint(
            105, 248, (num_blocks, block_size, 7), dtype=torch.uint8, device="cuda", generator=gen
        )
        scale[..., 7] = 0
    else:
        edges = torch.tensor([0, 1, 126, 127, 128, 254, 255], dtype=torch.uint8, device="cuda")
        pick = torch.randint(0, 7, (num_blocks, block_size, 7), device="cuda", generator=gen)
        edge = torch.rand(num_blocks, block_size, 7, device="cuda", generator=gen) < 0.1
        scale[..., :7] = torch.where(edge, edges[pick], scale[..., :7].clamp(105, 247))
        rope = data[..., 448:].view(torch.int16)
        for col, value in enumerate((float("nan"), float("inf"), float("-inf"), -0.0)):
            rope[:, ::5, col] = torch.tensor(value, dtype=torch.bfloat16).view(torch.int16)
    return view


def block_table_for(lens: list[int], num_blocks: int, block_size: int, gen: torch.Generator) -> torch.Tensor:
    perm = torch.randperm(num_blocks, device="cuda", generator=gen).to(torch.int32)
    width = max(-(-n // block_size) for n in lens)
    table = torch.full((len(lens), width), -1, dtype=torch.int32, device="cuda")
    start = 0
    for r, n in enumerate(lens):
        nb = -(-n // block_size)
        table[r, :nb] = perm[start : start + nb]
        start += nb
    return table


def random_k(tokens: int, gen: torch.Generator) -> torch.Tensor:
    """[tokens, 512] bf16, groups spread over 2^±30 with zero, tiny and near-max groups; never all zero."""
    x = torch.randn(tokens, 8, 64, device="cuda", generator=gen)
    x = x * torch.exp2(torch.randint(-30, 30, (tokens, 8, 1), device="cuda", generator=gen).float())
    kind = torch.randint(0, 32, (tokens, 8, 1), device="cuda", generator=gen)
    x = torch.where(kind == 0, torch.zeros_like(x), x)
    x = torch.where(kind == 1, x * 2.0**-126, x)
    x = torch.where(kind == 2, x.sign() * 3.3e38 * torch.rand(x.shape, device="cuda", generator=gen), x)
    return x.reshape(tokens, 512).bfloat16()


def avoid_seven_pow2(k: torch.Tensor) -> torch.Tensor:
    """Nudge groups with amax = 7·2^j one bf16 ulp up (the [UNVERIFIED] case of SPEC.md §2.2)."""
    bits = k.view(torch.int16).clone()
    nope = bits[:, :448].clone().reshape(-1, 7, 64)
    mag = nope & 0x7FFF
    seven = ((mag & 0x7F) == 0x60) & (mag >= 0x80) & (mag < 0x7F80) & (mag == mag.amax(-1, keepdim=True))
    nope += seven.to(torch.int16)
    bits[:, :448] = nope.reshape(-1, 448)
    return bits.view(torch.bfloat16)


def prefill_slots(tokens: int, num_blocks: int, block_size: int, gen: torch.Generator) -> torch.Tensor:
    """Consecutive positions in randomly placed pages, as a prefill writes them."""
    pages = torch.randperm(num_blocks, device="cuda", generator=gen)[: -(-tokens // block_size)]
    pos = torch.arange(tokens, device="cuda")
    return pages[pos // block_size] * block_size + pos % block_size


# ----------------------------------------------------------------------------- helpers
def _pool_of(view: torch.Tensor) -> torch.Tensor:
    return view._base if view._base is not None else view


def _clone_view(view: torch.Tensor) -> torch.Tensor:
    return _pool_of(view).clone().as_strided(view.shape, view.stride(), view.storage_offset())


def _equal(name: str, out: torch.Tensor, ref: torch.Tensor) -> dict[str, object]:
    try:
        assert_bitwise_equal(name, out, ref)
        return {"bitwise": True}
    except MismatchError as err:
        print(f"MISMATCH {err}")
        return {"bitwise": False, "error": str(err)[:400]}


# ----------------------------------------------------------------------------- insert
def insert_correctness(cu: object, gen: torch.Generator) -> dict[str, object]:
    out: dict[str, object] = {}
    for tokens, bs, slot_dtype in (
        (1, 32, torch.int64),
        (37, 32, torch.int32),
        (1536, 128, torch.int64),
        (8192, 64, torch.int64),
    ):
        num_blocks = -(-tokens // bs) * 2 + 1
        cache = random_pool(num_blocks, bs, gen, valid=False)
        k = avoid_seven_pow2(random_k(tokens, gen))
        k[:, 448:] = torch.randint(
            -(2**15), 2**15, (tokens, 64), dtype=torch.int16, device="cuda", generator=gen
        ).view(torch.bfloat16)  # RoPE: any bits, NaN/inf/-0 included
        slots = torch.randperm(num_blocks * bs, device="cuda", generator=gen)[:tokens]
        slots[torch.randperm(tokens, device="cuda", generator=gen)[: tokens // 7]] = -1
        slots = slots.to(slot_dtype)
        caches = {name: _clone_view(cache) for name in ("upstream", "base", "optimized", "reference")}
        cu.quantize_and_insert_k_cache(k, caches["upstream"], slots.long(), block_size=bs)  # type: ignore[attr-defined]
        kvi.base_quantize_and_insert_k_cache(k, caches["base"], slots, bs)
        kvi.quantize_and_insert_k_cache(k, caches["optimized"], slots, bs)
        kvi.quantize_and_insert_ref(k, caches["reference"], slots, bs)
        want = _pool_of(caches["upstream"])
        out[f"T{tokens}-bs{bs}-{str(slot_dtype)[6:]}"] = {
            name: _equal(f"insert {name} T={tokens}", _pool_of(caches[name]), want)
            for name in ("base", "optimized", "reference")
        }
    out["amax_7x2^j"] = _seven_pow2_probe(cu, gen)
    return out


def _seven_pow2_probe(cu: object, gen: torch.Generator) -> dict[str, object]:
    """Which exponent upstream's `ceil(log2(amax / 448))` picks when amax = 7·2^j exactly."""
    j = torch.arange(-13, 100, device="cuda")
    tokens = len(j)
    x = torch.randn(tokens, 512, device="cuda", generator=gen).clamp(-6.9, 6.9)
    x[:, :448] *= torch.exp2(j.float())[:, None]
    x[:, 0:448:64] = 7.0 * torch.exp2(j.float())[:, None]
    k = x.bfloat16()
    cache = random_pool(2, 128, gen, valid=False)
    slots = torch.arange(tokens, device="cuda")
    runs = {n: _clone_view(cache) for n in ("upstream", "base", "optimized")}
    cu.quantize_and_insert_k_cache(k, runs["upstream"], slots, block_size=128)  # type: ignore[attr-defined]
    kvi.base_quantize_and_insert_k_cache(k, runs["base"], slots, 128)
    kvi.quantize_and_insert_k_cache(k, runs["optimized"], slots, 128)
    exact = (j - 6 + 127).tolist()
    picked = {n: token_views(c, 128)[1][0, :tokens, :7].long() for n, c in runs.items()}
    result: dict[str, object] = {"groups": tokens * 7}
    for n, s in picked.items():
        lower = int((s == torch.tensor(exact, device="cuda")[:, None]).sum())
        result[n] = {
            "exact_lower_exponent": lower,
            "upper_exponent": int((s == torch.tensor(exact, device="cuda")[:, None] + 1).sum()),
        }
    result["base_vs_upstream"] = _equal("7·2^j base", _pool_of(runs["base"]), _pool_of(runs["upstream"]))
    result["optimized_vs_upstream"] = _equal(
        "7·2^j optimized", _pool_of(runs["optimized"]), _pool_of(runs["upstream"])
    )
    print(f"amax=7·2^j probe: {result}")
    return result


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
    if tokens in SWEEP_INSERT_AT:
        for bt, nw in INSERT_SWEEP:
            impls[f"optimized[T{bt},w{nw}]"] = call(kvi.launch_insert, block_t=bt, num_warps=nw)
    timings = {
        n: summarize(f"kv_insert T={tokens} {n}", time_graph(fn, n_sets), bytes_moved, ceilings)
        for n, fn in impls.items()
    }
    return _report(timings, tokens=tokens, block_size=bs, input_sets=n_sets)


def _report(timings: dict[str, Timing], **meta: object) -> dict[str, object]:
    opt = timings["optimized"]
    for n, t in timings.items():
        print(format_line(t, "" if n == "optimized" else f"optimized {t.us / opt.us:.2f}x faster"))
    speedups = {f"speedup_vs_{n}": round(t.us / opt.us, 3) for n, t in timings.items() if n != "optimized"}
    return {**meta, **{n: t.as_dict() for n, t in timings.items()}, **speedups}


# ----------------------------------------------------------------------------- gather
def gather_correctness(cu: object, gen: torch.Generator) -> dict[str, object]:
    out: dict[str, object] = {}
    cases = (  # (name, seq_lens, gather_lens or None, block_size, offset)
        ("swa-3req-offset", [40, 500, 7], [33, 127, 7], 32, 11),
        ("compressed-bs128", [3000], None, 128, 0),
        ("compressed-bs64-2req", [700, 129], None, 64, 0),
        ("zero-length", [0, 50], [0, 20], 32, 5),
        ("48K", [49_152], None, 128, 0),
    )
    for name, seq, gather, bs, offset in cases:
        num_blocks = sum(-(-s // bs) for s in seq) + 3
        cache = random_pool(num_blocks, bs, gen, valid=False)
        table = block_table_for(seq, num_blocks, bs, gen)
        lens = gather or seq
        rows = offset + max(lens) + 9
        poison = torch.randint(
            -(2**15), 2**15, (len(seq), rows, 512), dtype=torch.int16, device="cuda", generator=gen
        ).view(torch.bfloat16)
        seq_t = torch.tensor(seq, dtype=torch.int32, device="cuda")
        gl_t = None if gather is None else torch.tensor(gather, dtype=torch.int32, device="cuda")
        outs = {n: poison.clone() for n in ("upstream", "base", "optimized", "reference")}
        cu.dequantize_and_gather_k_cache_triton(  # type: ignore[attr-defined]
            outs["upstream"], cache, seq_t, gl_t, table, bs, offset, max_gather_len=max(lens)
        )
        kvg.base_dequantize_and_gather_k_cache(
            outs["base"], cache, seq_t, gl_t, table, bs, offset, max_gather_len=max(lens)
        )
        kvg.dequantize_and_gather_k_cache(outs["optimized"], cache, seq_t, gl_t, table, bs, offset)
        kvg.dequantize_and_gather_ref(outs["reference"], cache, seq_t, gl_t, table, bs, offset)
        out[name] = {
            n: _equal(f"gather {n} {name}", outs[n], outs["upstream"])
            for n in ("base", "optimized", "reference")
        }
    return out


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
    # the first tuned form (NoPE and RoPE stored apart, byte-wise scales), beside the default
    impls["optimized[split-store]"] = call(kvg.launch_gather, max_gather_len=tokens, one_store=False)
    if tokens in (49_152, 131_072):  # persistent-style grids: fewer programs looping over tiles
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for per_sm in (6, 12, 24):
            impls[f"optimized[{per_sm} programs/SM]"] = call(
                kvg.launch_gather, max_gather_len=tokens, max_programs=per_sm * sms
            )
    if tokens in SWEEP_GATHER_AT:
        for bt, nw in GATHER_SWEEP:
            impls[f"optimized[T{bt},w{nw}]"] = call(
                kvg.launch_gather, max_gather_len=tokens, block_t=bt, num_warps=nw
            )
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


def main(out_dir: Path, ceilings: Ceilings) -> dict[str, object]:
    import vllm.models.deepseek_v41.common.ops.cache_utils as cu  # the carried upstream tree

    gen = torch.Generator(device="cuda").manual_seed(20261129)
    result: dict[str, object] = {
        "upstream": "vllm 0.32.0 (official wheel's Python tree): quantize_and_insert_k_cache, "
        "dequantize_and_gather_k_cache_triton (CUDA path, per-group kernel)",
        "baseline": "base = SM80 ports of upstream's kernels (software e4m3, same grid and loops)",
        "seed_gather_48k": SEED_GATHER_48K,
        "config": {
            "gather": {"BLOCK_T": kvg.BLOCK_T, "num_warps": kvg.NUM_WARPS},
            "insert": {"BLOCK_T": kvi.BLOCK_T, "num_warps": kvi.NUM_WARPS},
        },
        "bytes_per_token": {
            "gather": GATHER_BYTES_PER_TOKEN,
            "insert": INSERT_BYTES_PER_TOKEN,
            "data": DATA_BYTES,
            "scale": SCALE_BYTES,
        },
    }
    for key, fn in (
        ("gather_mix_probe", lambda: mix_probe(ceilings)),
        ("insert_correctness", lambda: insert_correctness(cu, gen)),
        ("gather_correctness", lambda: gather_correctness(cu, gen)),
        ("gather", lambda: gather_timings(cu, ceilings, gen)),
        ("insert", lambda: insert_timings(cu, ceilings, gen)),
    ):
        try:
            result[key] = fn()
        except Exception:  # keep what the other sections measured; the error goes into the JSON
            traceback.print_exc()
            result[key] = {"error": traceback.format_exc()[-2000:]}
    _summary(result)
    return result


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
