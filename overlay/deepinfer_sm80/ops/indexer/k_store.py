"""`indexer_k_norm_rope_store` (FP8 cache) for SM80: k_norm -> GPT-J RoPE at the group start -> e4m3 record.

Upstream's kernel casts to `tl.float8e4nv` (sm_89+). This port keeps its structure (one program per
token, one warp, a [128] vector, the same reduction and expressions, so the GPU compiler produces the
same rounding) and encodes e4m3 in software:
rows with slot >= 0 and (pos+1) % ratio == 0; `k = bf16(k·rsqrt(mean(k²)+eps)·w)`; RoPE on dims 64..127
at `(pos//ratio)·ratio`, rounded to bf16; `e = ceil(log2(max(amax,1e-4)·fl32(1/448)))` (read off the
fp32 bits, exact); codes `e4m3(clamp(k·2^-e, ±448))`, scale fp32 `2^e` (docs/INDEXER.md).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from deepinfer_sm80.formats.indexer_k import (
    AMAX_FLOOR,
    CODE_BYTES,
    INDEX_DIM,
    ROPE_DIM,
    check_k_cache,
    state_views,
)
from deepinfer_sm80.ops.fp8 import E4M3_MAX, e4m3_encode_ref, f32_to_e4m3
from deepinfer_sm80.ops.indexer.q_quant import exp2_int, pow2_ceil_exponent, rope_gptj_ref, round_to_bf16
from deepinfer_sm80.registry import CompileSpec, signature

_E4M3_MAX = tl.constexpr(E4M3_MAX)
_INV_E4M3_MAX = tl.constexpr(1.0 / E4M3_MAX)


# ----------------------------------------------------------------------------- reference
def rms_norm_bf16_ref(k: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """bf16(k·rsqrt(mean(k²)+eps)·w) in fp32 with the interpreter's arithmetic: numpy's fp32 pairwise
    sum of squares (what `tl.sum` is under TRITON_INTERPRET=1) and rsqrt as 1/sqrt in fp32. On the
    GPU the sum order and `rsqrt.approx` differ, which is why the GPU check is against upstream's own
    kernel (same compiler, same expressions), not against this."""
    kf = k.float()
    sq = (kf * kf).cpu().numpy()
    var = torch.from_numpy(np.sum(sq, axis=-1)).to(k.device) / torch.tensor(float(k.shape[-1]))
    r = 1 / torch.sqrt(var + torch.tensor(eps, dtype=torch.float32))
    return (kf * r[:, None] * weight.float()).bfloat16().float()


def indexer_k_store_ref(
    k_pre: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    k_cache: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    compress_ratio: int,
) -> None:
    """Torch emulation of upstream's FP8 writer, into k_cache's pages (uint8 [blocks, bs, 132])."""
    t = kv_slot_mapping.shape[0]
    slots = kv_slot_mapping.long()
    pos = positions[:t].long()
    live = (slots >= 0) & ((pos + 1) % compress_ratio == 0)
    if not bool(live.any()):
        return
    k = rms_norm_bf16_ref(k_pre[:t][live], rms_norm_weight, rms_norm_eps)  # [L, 128]
    start = (pos[live] // compress_ratio) * compress_ratio
    cs = cos_sin_cache[start].float()
    half = ROPE_DIM // 2
    rot = rope_gptj_ref(k[:, INDEX_DIM - ROPE_DIM :], cs[:, :half], cs[:, half:])
    x = torch.cat([k[:, : INDEX_DIM - ROPE_DIM], rot], dim=-1)
    amax = x.abs().amax(-1).clamp_min(AMAX_FLOOR)
    e = pow2_ceil_exponent(amax * torch.tensor(1.0 / E4M3_MAX, dtype=torch.float32))
    codes = e4m3_encode_ref(x * exp2_int(-e)[:, None])
    codes_view, scales_view = state_views(k_cache)
    bs = codes_view.shape[1]
    blk, off = slots[live] // bs, slots[live] % bs
    codes_view[blk, off] = codes
    scales_view[blk, off] = exp2_int(e)


# ----------------------------------------------------------------------------- kernel
@triton.jit
def _k_store_kernel(
    k_ptr,
    k_stride,
    pos_ptr,
    w_ptr,
    eps,
    cs_ptr,
    cs_stride,
    cache_ptr,
    slot_ptr,
    block_size,
    page_stride,
    HEAD: tl.constexpr,
    ROPE: tl.constexpr,
    RATIO: tl.constexpr,
):
    tok = tl.program_id(0)
    slot = tl.load(slot_ptr + tok)
    if slot < 0:
        return
    pos = tl.load(pos_ptr + tok)
    if (pos + 1) % RATIO != 0:
        return
    d = tl.arange(0, HEAD)
    k = tl.load(k_ptr + tok.to(tl.int64) * k_stride + d).to(tl.float32)
    w = tl.load(w_ptr + d).to(tl.float32)
    var = tl.sum(k * k, axis=0) / HEAD
    k = round_to_bf16(k * tl.rsqrt(var + eps) * w)
    PAIRS: tl.constexpr = HEAD // 2
    NOPE_PAIRS: tl.constexpr = (HEAD - ROPE) // 2
    even, odd = tl.split(tl.reshape(k, (PAIRS, 2)))
    p = tl.arange(0, PAIRS) - NOPE_PAIRS
    is_rope = p >= 0
    cs_idx = tl.maximum(p, 0)
    start = (pos // RATIO) * RATIO
    cs_row = cs_ptr + start.to(tl.int64) * cs_stride
    cos = tl.load(cs_row + cs_idx, mask=is_rope, other=1.0)
    sin = tl.load(cs_row + ROPE // 2 + cs_idx, mask=is_rope, other=0.0)
    new_even = round_to_bf16(even * cos - odd * sin)
    new_odd = round_to_bf16(odd * cos + even * sin)
    x = tl.interleave(new_even, new_odd)
    amax = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-4)
    bits = (amax * _INV_E4M3_MAX).to(tl.int32, bitcast=True)
    e = (bits >> 23) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)  # ceil(log2(.)), exact
    inv_scale = ((127 - e) << 23).to(tl.float32, bitcast=True)
    codes = f32_to_e4m3(tl.clamp(x * inv_scale, -_E4M3_MAX, _E4M3_MAX))
    page = cache_ptr + (slot // block_size).to(tl.int64) * page_stride
    off = slot % block_size
    tl.store(page + off * HEAD + d, codes)
    scale_ptr = (page + block_size * HEAD + off * 4).to(tl.pointer_type(tl.float32))
    tl.store(scale_ptr, ((e + 127) << 23).to(tl.float32, bitcast=True))


# ----------------------------------------------------------------------------- launcher
def indexer_k_norm_rope_store(
    k_pre: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    k_cache: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    compress_ratio: int,
    use_fp4_cache: bool,
) -> None:
    """Upstream's signature: write indexer-K records for the group-boundary rows of k_pre [T, 128] bf16.

    k_cache uint8 [blocks, block_size, 132] (pages at stride(0)); kv_slot_mapping [T'] (-1 skips).
    """
    if use_fp4_cache:
        raise NotImplementedError("the MXFP4 indexer K cache is SM100-only; SM80 writes the FP8 record")
    if (
        k_pre.dim() != 2
        or k_pre.shape[1] != INDEX_DIM
        or k_pre.dtype != torch.bfloat16
        or k_pre.stride(1) != 1
    ):
        raise ValueError(
            f"k_pre must be [T, {INDEX_DIM}] bf16 with unit last stride, got {tuple(k_pre.shape)}"
        )
    if compress_ratio not in (1, 2):
        raise ValueError(f"compress_ratio must be 1 or 2, got {compress_ratio}")
    t = kv_slot_mapping.numel()
    if t > k_pre.shape[0] or t > positions.numel():
        raise ValueError(f"{t} slots for {k_pre.shape[0]} rows / {positions.numel()} positions")
    block_size = check_k_cache(k_cache)
    if t == 0:
        return
    _k_store_kernel[(t,)](
        k_pre,
        k_pre.stride(0),
        positions,
        rms_norm_weight,
        float(rms_norm_eps),
        cos_sin_cache,
        cos_sin_cache.stride(0),
        k_cache,
        kv_slot_mapping,
        block_size,
        k_cache.stride(0),
        HEAD=INDEX_DIM,
        ROPE=ROPE_DIM,
        RATIO=compress_ratio,
        num_warps=1,
    )


def _sig() -> dict[str, str]:
    pointers = {
        "k_ptr": "bf16",
        "pos_ptr": "i64",
        "w_ptr": "bf16",
        "cs_ptr": "fp32",
        "cache_ptr": "u8",
        "slot_ptr": "i64",
    }
    return signature(_k_store_kernel, pointers, eps="fp32")


_ALIGNED = ("k_ptr", "k_stride", "w_ptr", "cs_ptr", "cs_stride", "cache_ptr", "block_size", "page_stride")
COMPILE_SPECS = tuple(
    CompileSpec(
        f"indexer.k_store.r{ratio}",
        _k_store_kernel,
        _sig(),
        {"HEAD": INDEX_DIM, "ROPE": ROPE_DIM, "RATIO": ratio},
        num_warps=1,
        divisible_by_16=_ALIGNED,
    )
    for ratio in (1, 2)
)

assert CODE_BYTES == INDEX_DIM
