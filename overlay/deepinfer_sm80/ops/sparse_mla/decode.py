"""`rocm_sparse_attn_decode` for SM80/SM86: base (upstream's split-K algorithm, software e4m3) and optimized.

Both read the dense or ragged slot lists as given (no compaction pass), allocate only by shape and never
read device values on the host, so they capture in CUDA graphs. The heuristics are in docs/SPARSE_MLA.md.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton

from deepinfer_sm80.device import sm_count
from deepinfer_sm80.formats.fp8_ds_mla import NOPE_DIM, RECORD_BYTES, ROPE_DIM
from deepinfer_sm80.ops.sparse_mla.decode_kernels import _decode_kernel, _partial_base_kernel, _reduce_kernel
from deepinfer_sm80.ops.sparse_mla.tiles import HEAD_DIM
from deepinfer_sm80.registry import CompileSpec, signature

# base: upstream's split-K kernel and reduce (BLOCK_H 16, 4 warps, one stage; reduce one head a program)
# with its CUDA kernel's BLOCK_K 16: at its split-K BLOCK_K 32 the port spills 32 B on sm_80 (255 regs)
BASE_BLOCK_H = 16
BASE_BLOCK_K = 16
BASE_WARPS = 4
BASE_STAGES = 1
BASE_MAX_SPLITS = 16
# optimized: 16-row tiles, 4 warps, 2 stages: 255 regs, 0 spills, 58 KB smem -> 2 CTAs per SM80 SM (sm_80
# cross-compile, Triton 3.7.1). The write-up's 64 rows need 189 KB here (two bf16 K copies, one per
# product); 32 rows x 4 warps spill 16 B; 32 rows x 8 warps fit once a SM (248 regs). docs/SPARSE_MLA.md
BLOCK_N = 16
NUM_WARPS = 4
NUM_STAGES = 2
CTAS_PER_SM = 2
MAX_SPLITS = 40  # 640 rows / 16: one tile a split at most
REDUCE_BLOCK_H = 1  # a program per (query, head): 16 heads a program left one CTA reading all splits


@dataclass(frozen=True)
class Variant:
    """One optimized-decode configuration: tile rows, warps, stages, next-tile prefetch, CTAs per SM80 SM
    (the split heuristic's slots). The prefetch moves loads, not arithmetic: under the interpreter a
    prefetch variant is bitwise its twin without it; on a GPU the compiler may schedule the products
    differently (within the tolerance, tested). Other tiles reorder the online softmax (tolerance)."""

    rows: int
    warps: int
    stages: int
    prefetch: bool
    ctas_per_sm: int


# the tiles (DEEPINFER_SM80_SPARSE_MLA_DECODE=<name> forces one everywhere), timed against each other at
# every decode shape on the H200 (docs/SPARSE_MLA.md "Variants"). The prefetch at 4 warps spills 40-64 B
# on sm_80/86 (the next tile's bytes on top of 255 registers), so it is not offered.
VARIANTS = {
    "r16-w4": Variant(BLOCK_N, NUM_WARPS, NUM_STAGES, False, CTAS_PER_SM),
    "w8": Variant(BLOCK_N, 8, NUM_STAGES, False, 1),
    "prefetch-w8": Variant(BLOCK_N, 8, 1, True, 1),
    "r32-w8": Variant(32, 8, 1, False, 1),  # 2 stages: 102,912 B smem, over sm_86
    "prefetch-r32-w8": Variant(32, 8, 1, True, 1),
}
VARIANT_ENV = "DEEPINFER_SM80_SPARSE_MLA_DECODE"
# unset (or "auto"): SMALL_TILE while Tq·head_blocks <= SMs / SMALL_WORK_PER_SM, else LARGE_TILE. H200
# (torch 2.11 / Triton 3.6, 132 SMs): prefetch-r32-w8 is 1.04-1.22x r16-w4 up to 32 (query, head-block)
# CTAs and 0.92-1.02x from 48, r16-w4's two CTAs per SM then filling more of the GPU
# (results/gpu/sparse_mla-h200.json, results.variants)
SMALL_TILE = "prefetch-r32-w8"
LARGE_TILE = "r16-w4"
SMALL_WORK_PER_SM = 4


def variant_from_env(work: int = 0, sms: int = 108) -> Variant:
    """The variant DEEPINFER_SM80_SPARSE_MLA_DECODE names; unset or "auto": the work-based choice above
    for `work` = Tq·head_blocks CTAs on `sms` SMs. An unknown name is an error."""
    name = os.environ.get(VARIANT_ENV, "auto") or "auto"
    if name == "auto":
        name = SMALL_TILE if work * SMALL_WORK_PER_SM <= sms else LARGE_TILE
    if name not in VARIANTS:
        raise ValueError(f"{VARIANT_ENV}={name!r}: expected auto or one of {sorted(VARIANTS)}")
    return VARIANTS[name]


def _sm_count(device: torch.device) -> int:
    # the interpreter (CPU tensors) has no SM count: 108 = A100/A800 (docs/MODEL.md), for the heuristics only
    return sm_count(device.index or 0) if device.type == "cuda" else 108


def base_num_splits(num_queries: int, heads_blocks: int, avg_main: float, avg_extra: float, sms: int) -> int:
    """Upstream's `_decode_num_splits` model: minimise waves·(1/s + 0.04) over s = 1..16, ties to fewer
    splits, then the fewest splits with the same waves and BLOCK_K iterations."""
    work = max(1, num_queries * heads_blocks)

    def iters(s: int) -> int:
        return sum(math.ceil(math.ceil(n / s) / BASE_BLOCK_K) for n in (avg_main, avg_extra) if n > 0)

    best, best_cost = 1, None
    for s in range(1, BASE_MAX_SPLITS + 1):
        cost = -(-work * s // sms) * (1.0 / s + 0.04)
        if best_cost is None or cost < best_cost - 1e-9:
            best, best_cost = s, cost
    if best > 1 and (avg_main > 0 or avg_extra > 0):
        waves = -(-work * best // sms)
        for s in range(1, best):
            if -(-work * s // sms) == waves and iters(s) == iters(best):
                return s
    return best


def num_splits(
    num_queries: int,
    heads_blocks: int,
    avg_rows: float,
    sms: int,
    block_n: int = BLOCK_N,
    ctas_per_sm: int = CTAS_PER_SM,
) -> int:
    """Splits for the optimized kernel: cost(s) = waves(s)·(tiles per split + 1) + [s > 1]·(1 + s/16),
    waves = ceil(Tq·head_blocks·s / (CTAS_PER_SM·SMs)); the +1 is a CTA's fixed work
    (Q load, epilogue) and the last term the reduce launch. Ties go to fewer splits."""
    tiles = max(1, math.ceil(avg_rows / block_n))
    slots = ctas_per_sm * sms
    work = max(1, num_queries * heads_blocks)
    if work >= slots:
        # a full wave already: splitting would only even out the last wave, while each split adds a
        # 32 KB fp32 partial written and read back per (query, head block), ~17% of the 374 KB of
        # records a query reads, per split (the model above does not count bytes)
        return 1
    best, best_cost = 1, None
    for s in range(1, min(MAX_SPLITS, tiles) + 1):
        per_split = math.ceil(tiles / s)
        if s > 1 and math.ceil(tiles / (s - 1)) == per_split:
            continue  # same tiles per split as s - 1: only more reduce work
        cost = math.ceil(work * s / slots) * (per_split + 1) + ((1 + s / 16) if s > 1 else 0)
        if best_cost is None or cost < best_cost:
            best, best_cost = s, cost
    return best


def block_h_for(num_heads: int) -> int:
    """16 heads a CTA at every TP degree: 32 doubles the fp32 accumulator, past the register file at
    BLOCK_N 32; 8-head ranks leave half of the M=16 MMA rows masked."""
    return 16


@dataclass(frozen=True)
class _Segment:
    idx: torch.Tensor  # ragged [nnz] or dense [Tq, W] slots
    off: torch.Tensor  # ragged indptr [Tq + 1] (dense: any int32 tensor, unread)
    lens: torch.Tensor  # dense lengths [Tq] int32 (ragged: unread)
    row_stride: int
    width: int
    ragged: bool
    avg_rows: float  # per query, from shapes only


def _segment(
    name: str,
    dense: torch.Tensor | None,
    lens: torch.Tensor | None,
    ragged_idx: torch.Tensor | None,
    ragged_ptr: torch.Tensor | None,
    num_queries: int,
) -> _Segment:
    if ragged_idx is not None and ragged_ptr is not None:
        idx = ragged_idx.reshape(-1)
        ptr = ragged_ptr.reshape(-1)
        if ptr.numel() != num_queries + 1:
            raise ValueError(f"{name}: ragged indptr has {ptr.numel()} entries, expected {num_queries + 1}")
        idx = idx if idx.dtype == torch.int32 and idx.is_contiguous() else idx.to(torch.int32).contiguous()
        ptr = ptr if ptr.dtype == torch.int32 and ptr.is_contiguous() else ptr.to(torch.int32).contiguous()
        return _Segment(idx, ptr, ptr, 0, 0, True, idx.numel() / max(1, num_queries))
    if dense is None:
        raise ValueError(f"{name}: neither dense indices nor a ragged (indices, indptr) pair")
    dense = dense.reshape(dense.shape[0], -1)
    if dense.shape[0] < num_queries:
        raise ValueError(f"{name}: {dense.shape[0]} index rows for {num_queries} queries")
    if dense.stride(1) != 1 and dense.shape[1] > 1:
        dense = dense.contiguous()
    if dense.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: indices must be int32/int64, got {dense.dtype}")
    if lens is None:  # upstream's default: the count of non-negative entries (a device op, no sync)
        lens = (dense[:num_queries] >= 0).sum(dim=-1, dtype=torch.int32)
    lens = lens.reshape(-1)
    lens = lens if lens.dtype == torch.int32 and lens.is_contiguous() else lens.to(torch.int32).contiguous()
    return _Segment(dense, lens, lens, dense.stride(0), dense.shape[1], False, float(dense.shape[1]))


def _check_cache(name: str, cache: torch.Tensor) -> None:
    if (
        cache.dtype != torch.uint8
        or cache.dim() != 3
        or cache.shape[2] != RECORD_BYTES
        or cache.stride(2) != 1
    ):
        raise ValueError(f"{name} must be a uint8 [blocks, block_size, {RECORD_BYTES}] fp8_ds_mla cache")


def _cache_args(cache: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    return cache, cache.stride(0), cache.shape[0] * cache.shape[1]


def _seg_args(seg: _Segment) -> tuple[object, ...]:
    return (seg.idx, seg.off, seg.lens, seg.row_stride, seg.width)


def decode_into(
    q: torch.Tensor,
    main_cache: torch.Tensor,
    main: _Segment,
    extra_cache: torch.Tensor | None,
    extra: _Segment | None,
    attn_sink: torch.Tensor | None,
    scale: float,
    out: torch.Tensor,
    positions: torch.Tensor | None,
    cos_sin: torch.Tensor | None,
    *,
    level: str,
    splits: int | None = None,
    force_reduce: bool = False,
    tile: tuple[int, int, int] | None = None,
    variant: Variant | None = None,
) -> None:
    """Launch one level's kernels into `out` [Tq, H, 512] bf16. `splits`, `force_reduce`, the optimized
    kernel's `tile` (rows, warps, stages) and `variant` (default: `variant_from_env`) are test and bench
    knobs; `tile` overrides the variant's tile."""
    num_queries, num_heads = q.shape[0], q.shape[1]
    if num_queries == 0 or num_heads == 0:
        return
    dev = q.device
    has_extra = extra_cache is not None and extra is not None
    x_cache, x_seg = (extra_cache, extra) if has_extra else (main_cache, main)
    sink = attn_sink if attn_sink is not None else q.new_empty(1, dtype=torch.float32)
    pos = positions if positions is not None else sink
    cs = cos_sin if cos_sin is not None else sink
    cs_stride = cos_sin.stride(0) if cos_sin is not None else 0
    common = (
        q,
        q.stride(0),
        q.stride(1),
        *_cache_args(main_cache),
        *_seg_args(main),
        *_cache_args(x_cache),
        *_seg_args(x_seg),
    )
    flags = {
        "HAS_EXTRA": has_extra,
        "MAIN_RAGGED": main.ragged,
        "EXTRA_RAGGED": x_seg.ragged,
        "MAIN_BS": main_cache.shape[1],
        "EXTRA_BS": x_cache.shape[1],
    }
    avg_extra = x_seg.avg_rows if has_extra else 0.0
    if level == "base":
        block_h = BASE_BLOCK_H
        heads_blocks = triton.cdiv(num_heads, block_h)
        s = splits or base_num_splits(num_queries, heads_blocks, main.avg_rows, avg_extra, _sm_count(dev))
    else:
        block_h = block_h_for(num_heads)
        heads_blocks = triton.cdiv(num_heads, block_h)
        var = variant or variant_from_env(num_queries * heads_blocks, _sm_count(dev))
        if tile is None:
            tile = (var.rows, var.warps, var.stages)
        s = splits or num_splits(
            num_queries, heads_blocks, main.avg_rows + avg_extra, _sm_count(dev), tile[0], var.ctas_per_sm
        )
    direct = level != "base" and s == 1 and not force_reduce
    if direct:
        part_m = part_l = part_acc = sink
    else:
        part_m = torch.empty((num_queries, s, num_heads), dtype=torch.float32, device=dev)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty((num_queries, s, num_heads, HEAD_DIM), dtype=torch.float32, device=dev)
    grid = (num_queries, s, heads_blocks)
    tail = (sink, out, out.stride(0), out.stride(1), pos, cs, cs_stride)
    if level == "base":
        _partial_base_kernel[grid](
            *common,
            part_m,
            part_l,
            part_acc,
            s,
            num_heads,
            float(scale),
            **flags,
            BLOCK_H=block_h,
            BLOCK_K=BASE_BLOCK_K,
            num_warps=BASE_WARPS,
            num_stages=BASE_STAGES,
        )
    else:
        _decode_kernel[grid](
            *common,
            part_m,
            part_l,
            part_acc,
            s,
            num_heads,
            float(scale),
            *tail,
            **flags,
            BLOCK_H=block_h,
            BLOCK_N=tile[0],
            DIRECT=direct,
            HAS_SINK=attn_sink is not None,
            FUSE_INV_ROPE=positions is not None,
            PREFETCH=var.prefetch,
            num_warps=tile[1],
            num_stages=tile[2],
        )
    if not direct:
        reduce_h = REDUCE_BLOCK_H
        _reduce_kernel[(num_queries, triton.cdiv(num_heads, reduce_h))](
            part_m,
            part_l,
            part_acc,
            s,
            num_heads,
            *tail,
            HAS_SINK=attn_sink is not None,
            FUSE_INV_ROPE=positions is not None,
            BLOCK_H=reduce_h,
            num_warps=4,
        )


def _decode(
    level: str,
    q: torch.Tensor,
    kv_cache: torch.Tensor | None,
    swa_k_cache: torch.Tensor,
    swa_only: bool,
    topk_indices: torch.Tensor | None,
    topk_lens: torch.Tensor | None,
    swa_indices: torch.Tensor,
    swa_lens: torch.Tensor,
    swa_ragged_indices: torch.Tensor | None,
    swa_ragged_indptr: torch.Tensor | None,
    topk_ragged_indices: torch.Tensor | None,
    topk_ragged_indptr: torch.Tensor | None,
    attn_sink: torch.Tensor | None,
    scale: float,
    head_dim: int,
    nope_head_dim: int,
    rope_head_dim: int,
    output: torch.Tensor | None,
    inv_rope_positions: torch.Tensor | None,
    inv_rope_cos_sin_cache: torch.Tensor | None,
    output_mxfp8: tuple[torch.Tensor, torch.Tensor] | None,
) -> int:
    if (head_dim, nope_head_dim, rope_head_dim) != (HEAD_DIM, NOPE_DIM, ROPE_DIM):
        raise ValueError(
            f"sparse MLA decode expects dims (512, 448, 64), got {(head_dim, nope_head_dim, rope_head_dim)}"
        )
    if output_mxfp8 is not None:
        raise NotImplementedError("output_mxfp8 is gfx950-only (MXFP8 wo_a); SM80 writes bf16 output")
    if output is None:
        raise ValueError("output is required (output_mxfp8 is not supported on SM80)")
    if q.dim() != 3 or q.shape[2] != HEAD_DIM or q.dtype != torch.bfloat16 or q.stride(2) != 1:
        raise ValueError(f"q must be [Tq, H, 512] bf16 with unit last stride, got {tuple(q.shape)} {q.dtype}")
    if output.shape != q.shape:
        raise ValueError(f"output must have q's shape {tuple(q.shape)}, got {tuple(output.shape)}")
    if inv_rope_positions is not None and (
        inv_rope_cos_sin_cache is None or inv_rope_cos_sin_cache.shape[-1] != ROPE_DIM
    ):
        raise ValueError(f"inv_rope_positions needs inv_rope_cos_sin_cache [P, {ROPE_DIM}] (cos | sin)")
    _check_cache("swa_k_cache", swa_k_cache)
    num_queries = q.shape[0]
    main = _segment("swa", swa_indices, swa_lens, swa_ragged_indices, swa_ragged_indptr, num_queries)
    extra = None
    if not swa_only:
        if kv_cache is None:
            raise ValueError("kv_cache is required unless swa_only")
        _check_cache("kv_cache", kv_cache)
        extra = _segment(
            "topk", topk_indices, topk_lens, topk_ragged_indices, topk_ragged_indptr, num_queries
        )
    sink = None
    if attn_sink is not None:
        sink = attn_sink[: q.shape[1]]
        sink = sink if sink.dtype == torch.float32 and sink.is_contiguous() else sink.float().contiguous()
    direct = output.dtype == torch.bfloat16 and output.stride(2) == 1
    out = output if direct else torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    decode_into(
        q,
        swa_k_cache,
        main,
        None if swa_only else kv_cache,
        extra,
        sink,
        scale,
        out,
        inv_rope_positions,
        inv_rope_cos_sin_cache,
        level=level,
    )
    if not direct:
        output.copy_(out)
    return output.shape[0] if inv_rope_positions is not None else 0


def _public(level: str):
    def sparse_attn_decode(
        q: torch.Tensor,
        kv_cache: torch.Tensor | None,
        swa_k_cache: torch.Tensor,
        swa_only: bool,
        topk_indices: torch.Tensor | None,
        topk_lens: torch.Tensor | None,
        swa_indices: torch.Tensor,
        swa_lens: torch.Tensor,
        swa_ragged_indices: torch.Tensor | None,
        swa_ragged_indptr: torch.Tensor | None,
        topk_ragged_indices: torch.Tensor | None,
        topk_ragged_indptr: torch.Tensor | None,
        attn_sink: torch.Tensor | None,
        scale: float,
        head_dim: int,
        nope_head_dim: int,
        rope_head_dim: int,
        output: torch.Tensor | None,
        extra_cache_nan_free: bool = False,
        adaptive_splits: bool = False,
        inv_rope_positions: torch.Tensor | None = None,
        inv_rope_cos_sin_cache: torch.Tensor | None = None,
        output_mxfp8: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> int:
        """Sparse MLA decode into `output` [Tq, H, 512] bf16; returns how many leading rows came back
        inverse-RoPE'd (all when inv_rope_positions is given, else 0). `extra_cache_nan_free` and
        `adaptive_splits` are gfx950 tuning flags: accepted and ignored (K values are always NaN-scrubbed)."""
        del extra_cache_nan_free, adaptive_splits
        return _decode(
            level,
            q,
            kv_cache,
            swa_k_cache,
            swa_only,
            topk_indices,
            topk_lens,
            swa_indices,
            swa_lens,
            swa_ragged_indices,
            swa_ragged_indptr,
            topk_ragged_indices,
            topk_ragged_indptr,
            attn_sink,
            scale,
            head_dim,
            nope_head_dim,
            rope_head_dim,
            output,
            inv_rope_positions,
            inv_rope_cos_sin_cache,
            output_mxfp8,
        )

    sparse_attn_decode.__name__ = sparse_attn_decode.__qualname__ = (
        "base_sparse_attn_decode" if level == "base" else "sparse_attn_decode"
    )
    return sparse_attn_decode


base_sparse_attn_decode = _public("base")
sparse_attn_decode = _public("optimized")


# ----------------------------------------------------------------------------- compile specs
# the query and the two segments' fp8_ds_mla caches and int32 index lists; the split partials
# (fp32); the epilogue's sink (fp32), output (bf16), positions (int64) and cos/sin table (fp32)
_SEGMENTS = {"q_ptr": "bf16"} | {
    f"{seg}_{what}_ptr": dtype
    for seg in ("main", "extra")
    for what, dtype in (("cache", "u8"), ("idx", "i32"), ("off", "i32"), ("len", "i32"))
}
_PARTIALS = {"part_m_ptr": "fp32", "part_l_ptr": "fp32", "part_acc_ptr": "fp32"}
_EPILOGUE = {"sink_ptr": "fp32", "out_ptr": "bf16", "pos_ptr": "i64", "cos_sin_ptr": "fp32"}
_ALIGNED = (
    "q_ptr",
    "q_stride0",
    "q_stride1",
    "main_cache_ptr",
    "extra_cache_ptr",
    "main_page_stride",
    "extra_page_stride",
    "part_acc_ptr",
    "out_ptr",
    "out_stride0",
    "out_stride1",
)


_BASE_SIG = signature(_partial_base_kernel, _SEGMENTS | _PARTIALS, scale="fp32")
_OPT_SIG = signature(_decode_kernel, _SEGMENTS | _PARTIALS | _EPILOGUE, scale="fp32")
_RED_SIG = signature(_reduce_kernel, _PARTIALS | _EPILOGUE)
# production: ragged SWA lists over 32-token SWA pages + ragged top-k over 32-state compressed pages
_PROD = {"HAS_EXTRA": True, "MAIN_RAGGED": True, "EXTRA_RAGGED": True, "MAIN_BS": 32, "EXTRA_BS": 32}
COMPILE_SPECS = (
    CompileSpec(
        "sparse_mla.decode.base.partial",
        _partial_base_kernel,
        _BASE_SIG,
        {**_PROD, "BLOCK_H": BASE_BLOCK_H, "BLOCK_K": BASE_BLOCK_K},
        num_warps=BASE_WARPS,
        num_stages=BASE_STAGES,
        divisible_by_16=tuple(a for a in _ALIGNED if a in _BASE_SIG),
    ),
    *(
        CompileSpec(
            f"sparse_mla.decode.opt.{'direct' if direct else 'split'}{'.swa_only' if not extra else ''}",
            _decode_kernel,
            _OPT_SIG,
            {
                **_PROD,
                "HAS_EXTRA": extra,
                "BLOCK_H": 16,
                "BLOCK_N": BLOCK_N,
                "DIRECT": direct,
                "HAS_SINK": True,
                "FUSE_INV_ROPE": True,
                "PREFETCH": False,
            },
            num_warps=NUM_WARPS,
            num_stages=NUM_STAGES,
            divisible_by_16=_ALIGNED,
        )
        for direct, extra in ((True, True), (False, True), (True, False))
    ),
    # the opt-in variants (VARIANTS), direct and split, both segments
    *(
        CompileSpec(
            f"sparse_mla.decode.opt.{name}.{'direct' if direct else 'split'}{'' if extra else '.swa_only'}",
            _decode_kernel,
            _OPT_SIG,
            {
                **_PROD,
                "HAS_EXTRA": extra,
                "BLOCK_H": 16,
                "BLOCK_N": var.rows,
                "DIRECT": direct,
                "HAS_SINK": True,
                "FUSE_INV_ROPE": True,
                "PREFETCH": var.prefetch,
            },
            num_warps=var.warps,
            num_stages=var.stages,
            divisible_by_16=_ALIGNED,
        )
        for name, var in VARIANTS.items()
        if name != LARGE_TILE  # its specs are the three above
        for direct, extra in ((True, True), (False, True), *(((True, False),) if name == SMALL_TILE else ()))
    ),
    *(
        CompileSpec(
            f"sparse_mla.decode.reduce.s{splits}",
            _reduce_kernel,
            _RED_SIG,
            {"num_splits": splits, "HAS_SINK": True, "FUSE_INV_ROPE": True, "BLOCK_H": REDUCE_BLOCK_H},
            num_warps=4,
            divisible_by_16=tuple(a for a in _ALIGNED if a in _RED_SIG),
        )
        for splits in (BASE_MAX_SPLITS, MAX_SPLITS)
    ),
)
