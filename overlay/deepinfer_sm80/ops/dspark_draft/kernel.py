"""One Triton launch per DSpark draft position (docs/DSPARK.md): bias add, Gumbel noise, argmax, next row.

Program (row b, block j) reduces 1,024 vocabulary entries on chip and publishes its partial
maximum; the last program of row b to arrive (acquire/release counter, reset in the same launch, so
graph replays need no memset) reduces the row's partials, writes the token and copies the Markov
embedding row of that token for the next position's bias GEMM.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from deepinfer_sm80.ops.dspark_draft.reference import DRAFT_POS_SALT, SAMPLE_BLOCK
from deepinfer_sm80.registry import CompileSpec, signature

# Upstream's sampler reduces 1,024-wide blocks with 4 warps; the Gumbel block reduction here is the
# same shape so that a NaN inside a block resolves as upstream's does (docs/DSPARK.md, "NaN").
NUM_WARPS = 4
LOGIT_DTYPES = (torch.bfloat16, torch.float32)  # the draft head's dtype: the model's bf16 or an fp32 head
_SALT = tl.constexpr(DRAFT_POS_SALT)


@triton.jit
def _rotl32(x, r: tl.constexpr):
    return (x << r) | (x >> (32 - r))


@triton.jit
def _mix32(h, word):
    word = _rotl32(word * 0xCC9E2D51, 15) * 0x1B873593
    return _rotl32(h ^ word, 13) * 5 + 0xE6546B64


@triton.jit
def _draft_noise(seed, pos, token):
    """Gumbel noise of (seed, salted pos, token id): murmur3-32, exact 16-bit split, -log(-log(1-u))."""
    seed = seed.to(tl.int64)
    pos = pos.to(tl.int64)
    h = (seed & 0).to(tl.uint32)  # the request prefix stays scalar until the token is mixed
    h = _mix32(h, (seed & 0xFFFFFFFF).to(tl.uint32))
    h = _mix32(h, ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
    h = _mix32(h, (pos & 0xFFFFFFFF).to(tl.uint32))
    h = _mix32(h, token.to(tl.uint32)) ^ 16
    h ^= h >> 16
    h *= 0x85EBCA6B
    h ^= h >> 13
    h *= 0xC2B2AE35
    h ^= h >> 16
    u = (h >> 16).to(tl.int32).to(tl.float32) * 1.52587890625e-05 + (
        (h & 0xFFFF).to(tl.int32).to(tl.float32) + 0.5
    ) * 2.3283064365386963e-10
    # log(1 - u): Horner series below 0.25 (the tail that wins the argmax), direct log above
    p = 1.0 / 8.0
    p = 1.0 / 7.0 + u * p
    p = 1.0 / 6.0 + u * p
    p = 1.0 / 5.0 + u * p
    p = 1.0 / 4.0 + u * p
    p = 1.0 / 3.0 + u * p
    p = 1.0 / 2.0 + u * p
    p = 1.0 + u * p
    log1m = tl.where(u < 0.25, -u * p, tl.log(tl.maximum(1.0 - u, 5.960464477539063e-08)))
    return -tl.log(-log1m)


@triton.jit
def round_to_bf16(x):
    """fp32 -> bf16 round-to-nearest-even in integer ops: (bf16 value, the same value as fp32).

    Written out because the interpreter's fp32 -> bf16 cast truncates; compiled, this is the
    same rounding as cvt.rn.bf16.f32 (and as torch's bf16 add), NaN kept quiet.
    """
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    bits = tl.where(x != x, 0x7FC00000, bits)
    wide = bits.to(tl.float32, bitcast=True)
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True), wide


@triton.jit
def block_best(v, token, mask, lane, temp, seed, pos, GUMBEL: tl.constexpr, BLOCK: tl.constexpr):
    """(best value, lane) of one 1,024-wide block of fp32 logits (masked lanes -inf).

    Gumbel: upstream's rule, temperature then noise then tl.max with first-index ties; the block has
    upstream's shape and warps so a NaN resolves as there. Greedy: torch.argmax's rule, the first
    NaN, else the first maximum.
    """
    if GUMBEL:
        if temp != 0.0:
            v = v / temp
            v = tl.where(mask, v + _draft_noise(seed, pos + _SALT, token), float("-inf"))
        val, idx = tl.max(v, axis=0, return_indices=True)
    else:
        is_nan = v != v
        nan_lane = tl.min(tl.where(is_nan, lane, BLOCK), axis=0)
        top, top_lane = tl.max(tl.where(is_nan, float("-inf"), v), axis=0, return_indices=True)
        has_nan = nan_lane < BLOCK
        val = tl.where(has_nan, float("nan"), top)
        idx = tl.where(has_nan, nan_lane, top_lane)
    return val, idx


@triton.jit
def _draft_step_kernel(
    base_ptr,
    base_stride,
    bias_ptr,
    bias_stride,
    part_val_ptr,
    part_idx_ptr,
    part_stride,
    count_ptr,
    tok_ptr,
    tok_stride,
    best_ptr,
    w1_ptr,
    w1_stride,
    row_ptr,
    row_stride,
    idx_map_ptr,
    idx_map_stride,
    temp_ptr,
    seed_ptr,
    pos_ptr,
    pos_stride,
    pos_offset,
    cache_ptr,
    cache_stride_req,
    cache_stride_col,
    cache_col,
    vocab,
    vocab_start,
    BLOCK: tl.constexpr,
    NUM_BLOCKS: tl.constexpr,
    PART_BLOCK: tl.constexpr,
    RANK: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    GUMBEL: tl.constexpr,
    WRITE_CACHE: tl.constexpr,
    FETCH_ROW: tl.constexpr,
    WRITE_BEST: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    lane = tl.arange(0, BLOCK)
    offs = j * BLOCK + lane
    mask = offs < vocab
    x = tl.load(base_ptr + b * base_stride + offs, mask=mask, other=0.0)
    y = tl.load(bias_ptr + b * bias_stride + offs, mask=mask, other=0.0)
    total = x.to(tl.float32) + y.to(tl.float32)
    if ROUND_BF16:
        logits, total = round_to_bf16(total)  # one rounding, as the eager bf16 add
    else:
        logits = total
    v = tl.where(mask, total, float("-inf"))
    temp = 0.0
    seed = 0
    pos = 0
    if GUMBEL:
        req = tl.load(idx_map_ptr + b * idx_map_stride).to(tl.int64)
        valid = req >= 0
        if WRITE_CACHE:
            # the pre-temperature sum, the value the rejection sampler divides on load
            dst = cache_ptr + req * cache_stride_req + cache_col * cache_stride_col + offs
            tl.store(dst, logits, mask=mask & valid)
        temp = tl.load(temp_ptr + req, mask=valid, other=0.0).to(tl.float32)
        seed = tl.load(seed_ptr + req, mask=valid, other=0)
        pos = tl.load(pos_ptr + b * pos_stride).to(tl.int64) + pos_offset
    val, idx = block_best(v, vocab_start + offs, mask, lane, temp, seed, pos, GUMBEL, BLOCK)
    tl.store(part_val_ptr + b * part_stride + j, val)
    tl.store(part_idx_ptr + b * part_stride + j, j * BLOCK + idx)
    # release: this block's partial is visible before the count; acquire: the last sees them all
    arrived = tl.atomic_add(count_ptr + b, 1, sem="acq_rel")
    if arrived == NUM_BLOCKS - 1:
        k = tl.arange(0, PART_BLOCK)
        k_ok = k < NUM_BLOCKS
        vals = tl.load(
            part_val_ptr + b * part_stride + k, mask=k_ok, other=float("-inf"), cache_modifier=".cg"
        )
        k_nan = vals != vals
        first_nan = tl.min(tl.where(k_nan & k_ok, k, PART_BLOCK), axis=0)
        clean = tl.where(k_nan, float("-inf"), vals)
        _, first_top = tl.max(clean, axis=0, return_indices=True)
        pick = tl.where(first_nan < PART_BLOCK, first_nan, first_top)
        token = vocab_start + tl.load(part_idx_ptr + b * part_stride + pick, cache_modifier=".cg").to(
            tl.int64
        )
        tl.store(tok_ptr + b * tok_stride, token)
        if WRITE_BEST:
            tl.store(best_ptr + b, tl.load(part_val_ptr + b * part_stride + pick, cache_modifier=".cg"))
        if FETCH_ROW:
            r = tl.arange(0, RANK)
            tl.store(row_ptr + b * row_stride + r, tl.load(w1_ptr + token * w1_stride + r))
        tl.store(count_ptr + b, 0)  # ready for the next launch (and the next graph replay)


# ----------------------------------------------------------------------------- launcher
@dataclass(frozen=True)
class DraftScratch:
    """Per-row partial maxima and arrival counters; counters must be zero between launches."""

    part_val: torch.Tensor  # [rows, blocks] fp32
    part_idx: torch.Tensor  # [rows, blocks] int32, shard-local token ids
    counters: torch.Tensor  # [rows] int32

    @classmethod
    def allocate(cls, rows: int, vocab: int, device: torch.device | str) -> DraftScratch:
        blocks = triton.cdiv(vocab, SAMPLE_BLOCK)
        return cls(
            torch.empty(rows, blocks, dtype=torch.float32, device=device),
            torch.empty(rows, blocks, dtype=torch.int32, device=device),
            torch.zeros(rows, dtype=torch.int32, device=device),
        )


def _need(ok: bool, message: str | Callable[[], str]) -> None:
    """One launcher check; f-string messages come as lambdas so a passing check formats nothing."""
    if not ok:
        raise ValueError(message if isinstance(message, str) else message())


def draft_step(
    base: torch.Tensor,
    bias: torch.Tensor,
    tokens_out: torch.Tensor,
    scratch: DraftScratch,
    *,
    gumbel: bool,
    idx_map: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
    seeds: torch.Tensor | None = None,
    sample_pos: torch.Tensor | None = None,
    pos_offset: int = -1,
    logits_cache: torch.Tensor | None = None,
    cache_col: int = 0,
    markov_w1: torch.Tensor | None = None,
    row_out: torch.Tensor | None = None,
    best_out: torch.Tensor | None = None,
    vocab_start: int = 0,
) -> None:
    """One draft position in one launch; no host sync, CUDA-graph safe.

    Args:
        base: [B, V] bf16/fp16/fp32 base logits of this position (a row-strided view is fine).
        bias: [B, V] same dtype, the Markov bias for the same vocabulary columns.
        tokens_out: [B] int64, any stride (e.g. draft_tokens[:B, i]); global token ids.
        scratch: DraftScratch with at least B rows and cdiv(V, 1024) blocks.
        gumbel: upstream's gumbel_sample semantics (is_drafting, temperature applied); else argmax.
        idx_map, temperature, seeds, sample_pos: [B] int64 slots (-1 = padding, any stride), [slots]
            fp32, [slots] int64, [B] int64 (any stride); the noise position is sample_pos + pos_offset.
        logits_cache: [slots, cols, >= V] in base.dtype; receives the summed logits at cache_col.
        markov_w1, row_out: [V, R] table and [B, R] buffer: row_out[b] = markov_w1[token[b]]
            (whole vocabulary only).
        best_out: [B] fp32, the winning (perturbed) value: a TP rank's partial maximum.
        vocab_start: global id of column 0 (a TP rank's shard offset).
    """
    B, V = base.shape
    _need(base.dtype in LOGIT_DTYPES, lambda: f"base must be bf16 or fp32, got {base.dtype}")
    _need(
        bias.shape == base.shape and bias.dtype == base.dtype,
        lambda: f"bias must be {tuple(base.shape)} {base.dtype}",
    )
    _need(base.stride(1) == 1 and bias.stride(1) == 1, "base and bias need unit column stride")
    _need(
        tokens_out.dtype == torch.int64 and tokens_out.shape == (B,),
        lambda: f"tokens_out must be [{B}] int64",
    )
    blocks = triton.cdiv(V, SAMPLE_BLOCK)
    _need(
        scratch.part_val.shape[0] >= B and scratch.part_val.shape[1] >= blocks,
        lambda: f"scratch holds {tuple(scratch.part_val.shape)}, need >= [{B}, {blocks}]",
    )
    dummy = scratch.counters
    if gumbel:
        for name, t, dtype in (("idx_map", idx_map, torch.int64), ("sample_pos", sample_pos, torch.int64)):
            _need(
                t is not None and t.dtype == dtype and t.shape == (B,),
                lambda name=name, dtype=dtype: f"{name} must be [{B}] {dtype}",
            )
        _need(
            temperature is not None and temperature.dtype == torch.float32, "temperature must be fp32 [slots]"
        )
        _need(seeds is not None and seeds.dtype == torch.int64, "seeds must be int64 [slots]")
    if logits_cache is not None:
        _need(gumbel, "logits_cache is written in Gumbel mode only (upstream's greedy path keeps none)")
        _need(
            logits_cache.dtype == base.dtype and logits_cache.shape[-1] >= V and logits_cache.stride(2) == 1,
            lambda: f"logits_cache must be [slots, cols, >= {V}] {base.dtype}, unit last stride",
        )
    fetch = markov_w1 is not None
    if fetch:
        _need(row_out is not None, "markov_w1 needs row_out")
        _need(
            vocab_start == 0 and markov_w1.shape[0] == V,
            "the Markov row is fetched only over the whole vocabulary",
        )
        _need(
            markov_w1.stride(1) == 1 and row_out.stride(1) == 1 and row_out.dtype == markov_w1.dtype,
            "markov_w1 and row_out need unit column stride and one dtype",
        )
        _need(
            row_out.shape == (B, markov_w1.shape[1]), lambda: f"row_out must be [{B}, {markov_w1.shape[1]}]"
        )
        _need(
            triton.next_power_of_2(markov_w1.shape[1]) == markov_w1.shape[1],
            "Markov rank must be a power of 2",
        )
    if best_out is not None:
        _need(
            best_out.dtype == torch.float32 and best_out.shape == (B,), lambda: f"best_out must be [{B}] fp32"
        )
    if B == 0:
        return
    cache = logits_cache if logits_cache is not None else base
    _draft_step_kernel[(B, blocks)](
        base,
        base.stride(0),
        bias,
        bias.stride(0),
        scratch.part_val,
        scratch.part_idx,
        scratch.part_val.stride(0),
        scratch.counters,
        tokens_out,
        tokens_out.stride(0),
        best_out if best_out is not None else scratch.part_val,
        markov_w1 if fetch else base,
        markov_w1.stride(0) if fetch else 0,
        row_out if fetch else base,
        row_out.stride(0) if fetch else 0,
        idx_map if gumbel else dummy,
        idx_map.stride(0) if gumbel else 0,
        temperature if gumbel else dummy,
        seeds if gumbel else dummy,
        sample_pos if gumbel else dummy,
        sample_pos.stride(0) if gumbel else 0,
        pos_offset,
        cache,
        cache.stride(0) if logits_cache is not None else 0,
        cache.stride(1) if logits_cache is not None else 0,
        cache_col,
        V,
        vocab_start,
        BLOCK=SAMPLE_BLOCK,
        NUM_BLOCKS=blocks,
        PART_BLOCK=triton.next_power_of_2(blocks),
        RANK=markov_w1.shape[1] if fetch else 1,
        ROUND_BF16=base.dtype == torch.bfloat16,
        GUMBEL=gumbel,
        WRITE_CACHE=logits_cache is not None,
        FETCH_ROW=fetch,
        WRITE_BEST=best_out is not None,
        num_warps=NUM_WARPS,
    )


# ----------------------------------------------------------------------------- compile specs
_SIG = signature(
    _draft_step_kernel,
    {
        "base_ptr": "bf16", "bias_ptr": "bf16", "part_val_ptr": "fp32", "part_idx_ptr": "i32",
        "count_ptr": "i32", "tok_ptr": "i64", "best_ptr": "fp32", "w1_ptr": "bf16", "row_ptr": "bf16",
        "idx_map_ptr": "i64", "temp_ptr": "fp32", "seed_ptr": "i64", "pos_ptr": "i64", "cache_ptr": "bf16",
    },
)  # fmt: skip
# logits rows of 129,280 / 16,160 bf16 and rank-256 rows are 16-element multiples in production
_ALIGNED = (
    "base_ptr", "base_stride", "bias_ptr", "bias_stride", "part_val_ptr", "part_idx_ptr", "w1_ptr",
    "w1_stride", "row_ptr", "row_stride", "cache_ptr", "cache_stride_req", "cache_stride_col",
)  # fmt: skip


def _spec(name: str, vocab: int, gumbel: bool, fetch: bool) -> CompileSpec:
    blocks = triton.cdiv(vocab, SAMPLE_BLOCK)
    constexprs = {
        "BLOCK": SAMPLE_BLOCK,
        "NUM_BLOCKS": blocks,
        "PART_BLOCK": triton.next_power_of_2(blocks),
        "RANK": 256 if fetch else 1,
        "ROUND_BF16": True,
        "GUMBEL": gumbel,
        "WRITE_CACHE": gumbel,
        "FETCH_ROW": fetch,
        "WRITE_BEST": not fetch,
    }
    return CompileSpec(
        f"dspark_draft.{name}", _draft_step_kernel, _SIG, constexprs, NUM_WARPS, divisible_by_16=_ALIGNED
    )


COMPILE_SPECS = (
    _spec("greedy.tp1", 129_280, False, True),
    _spec("gumbel.tp1", 129_280, True, True),
    _spec("greedy.tp8-shard", 16_160, False, False),
    _spec("gumbel.tp8-shard", 16_160, True, False),
)
