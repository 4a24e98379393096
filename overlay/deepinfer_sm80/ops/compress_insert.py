"""The compressed-KV writer for the 584-byte V4 record on SM80/SM86 (upstream `_rope_quant_insert_kernel`).

vLLM 0.32.0's `rope_quant_insert` (models/deepseek_v41/common/ops/fused_compress_quant_cache.py) looks
its kernel up by record width at call time; for 584 B it launches `_rope_quant_insert_kernel`, which
casts to `tl.float8e4nv` (rejected by Triton below sm_89). The kernel here has the same parameters, so
the binding row replaces the kernel object and upstream's dispatcher launches it unchanged.

Semantics (docs/FP8_DS_MLA.md): only rows with `slot >= 0` and `(pos + 1) % ratio == 0` are written.
NoPE dims 0..447 in seven 64-groups: `amax = max(|x|, 1e-4)`, `e = ceil(log2(amax * fl32(1/448)))`,
bytes `e4m3_rne_satfinite(clamp(x * 2^-e, ±448))`, scale byte `clamp(e + 127, 0, 255)` (254 with
SANITIZE_CACHE_NANS), pad byte 0. RoPE dims 448..511: GPT-J rotation of the bf16 latent at the group
start `(pos // ratio) * ratio`, stored as bf16. `e` is taken from the bits of `amax * fl32(1/448)`
(exact), where upstream takes `ceil(log2(.))` of it on the GPU: the two agree wherever the hardware
log2 is exact at powers of two (checked against upstream on the H200). SANITIZE_CACHE_NANS is proven
against the reference only: upstream sets it on gfx950 alone, so its CUDA dispatcher has no sanitize
path to compare with (the upstream-comparison test leaves that case out rather than always skip it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_sm80.formats.fp8_ds_mla import (
    AMAX_FLOOR,
    DATA_BYTES,
    GROUP,
    N_GROUPS,
    NOPE_DIM,
    RECORD_BYTES,
    ROPE_DIM,
    SCALE_BYTES,
    UE8M0_BIAS,
    token_views,
)
from deepinfer_sm80.ops.fp8 import E4M3_MAX, clamp_e4m3_range, e4m3_encode_ref, f32_to_e4m3
from deepinfer_sm80.registry import CompileSpec, signature

_INV_448 = tl.constexpr(1.0 / 448.0)  # the fp32 constant upstream multiplies by
_HALF_ROPE = tl.constexpr(ROPE_DIM // 2)


# ----------------------------------------------------------------------------- reference
def rope_quant_insert_ref(
    latent: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    compress_ratio: int,
    sanitize_nans: bool = False,
) -> None:
    """The module docstring in torch, exact, in place on kv_cache [blocks, block_size, 584] (or pages)."""
    t = slot_mapping.numel()
    block_size = kv_cache.shape[1] if kv_cache.dim() == 3 else None
    if block_size is None:
        raise ValueError("the reference takes kv_cache as [blocks, block_size, 584]")
    x = latent[:t].float()  # [T, 512]
    pos = positions[:t].long()
    live = (slot_mapping.long() >= 0) & ((pos + 1) % compress_ratio == 0)
    nope = x[:, :NOPE_DIM].reshape(t, N_GROUPS, GROUP)  # [T, 7, 64]
    amax = nope.abs().amax(-1).clamp_min(AMAX_FLOOR)  # [T, 7]
    y = amax * torch.tensor(1.0 / 448.0, dtype=torch.float32)  # fp32 product, as upstream
    frac, exp = torch.frexp(y)  # y = frac * 2^exp, frac in [0.5, 1): ceil(log2 y) = exp - (frac == 0.5)
    e = (exp - (frac == 0.5).to(exp.dtype)).float()  # [T, 7]
    codes = e4m3_encode_ref(nope * torch.exp2(-e)[..., None]).reshape(t, NOPE_DIM)  # [T, 448] u8
    top = 254 if sanitize_nans else 255
    scales = torch.zeros(t, SCALE_BYTES, dtype=torch.uint8)
    scales[:, :N_GROUPS] = (e + UE8M0_BIAS).clamp(0, top).to(torch.uint8)
    group_pos = (pos // compress_ratio) * compress_ratio
    cs = cos_sin_cache[group_pos].float()  # [T, 64]: 32 cos, then 32 sin
    cos, sin = cs[:, : _HALF_ROPE.value], cs[:, _HALF_ROPE.value :]
    even, odd = x[:, NOPE_DIM::2], x[:, NOPE_DIM + 1 :: 2]  # [T, 32]
    rot = torch.stack([even * cos - odd * sin, odd * cos + even * sin], -1).reshape(t, ROPE_DIM)
    if sanitize_nans:
        rot = torch.where(rot == rot, rot, 0.0)
    rope = rot.bfloat16().view(torch.uint8)  # [T, 128]
    data_view, scale_view = token_views(kv_cache, block_size)
    slots = slot_mapping.long()[live]
    blk, off = slots // block_size, slots % block_size
    data_view[blk, off] = torch.cat([codes, rope], 1)[live].to(kv_cache.device)
    scale_view[blk, off] = scales[live].to(kv_cache.device)


# ----------------------------------------------------------------------------- kernel
@triton.jit
def _bf16_rne(x):
    """fp32 -> fp32 holding the nearest bf16 (ties to even); NaN kept. Then `.to(tl.bfloat16)` is exact
    everywhere: on the GPU it already rounds so, the interpreter's fp32->bf16 cast truncates."""
    bits = x.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536  # -65536 = 0xFFFF0000
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))


@triton.jit
def rope_quant_insert_kernel(
    latent,
    positions,
    cos_sin,
    cache,
    cache_slots,
    COS_STRIDE: tl.constexpr,
    CACHE_STRIDE: tl.constexpr,
    CACHE_BLOCK: tl.constexpr,
    COMPRESS_RATIO: tl.constexpr,
    SANITIZE_CACHE_NANS: tl.constexpr,
):
    """One program per token: latent [T, 512] bf16 -> one 584-byte record at cache_slots[t]."""
    t = tl.program_id(0)
    slot = tl.load(cache_slots + t)
    position = tl.load(positions + t)
    if (slot >= 0) & ((position + 1) % COMPRESS_RATIO == 0):
        row = latent + t.to(tl.int64) * 512
        page = cache + (slot // CACHE_BLOCK).to(tl.int64) * CACHE_STRIDE
        values = page + (slot % CACHE_BLOCK) * 576
        scales = page + CACHE_BLOCK * 576 + (slot % CACHE_BLOCK) * 8

        # NoPE: [8, 64] tile, group 7 (the RoPE dims) masked off
        g = tl.arange(0, 8)
        col = g[:, None] * 64 + tl.arange(0, 64)[None, :]  # [8, 64]
        is_nope = col < 448
        x = tl.load(row + col, mask=is_nope, other=0.0).to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(x), 1), 1e-4)  # [8]
        y = amax * _INV_448
        bits = y.to(tl.int32, bitcast=True)
        # ceil(log2 y) from the bits: the exponent, +1 unless y is a power of two
        exact = (((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)).to(tl.float32)
        finite = (bits & 0x7F800000) != 0x7F800000
        exponent = tl.where(finite, exact, tl.ceil(tl.log2(y)))  # inf/NaN amax: upstream's own formula
        scaled = x * tl.exp2(-exponent)[:, None]
        tl.store(values + col, f32_to_e4m3(clamp_e4m3_range(scaled)), mask=is_nope)
        top: tl.constexpr = 254.0 if SANITIZE_CACHE_NANS else 255.0
        encoded = tl.minimum(tl.maximum(exponent + 127.0, 0.0), top)
        tl.store(scales + g, tl.where(g < 7, encoded, 0.0).to(tl.uint8))

        # RoPE: 32 (even, odd) pairs rotated at the group start
        i = tl.arange(0, 32)
        even = tl.load(row + 448 + 2 * i).to(tl.float32)
        odd = tl.load(row + 449 + 2 * i).to(tl.float32)
        cs = cos_sin + (position // COMPRESS_RATIO * COMPRESS_RATIO) * COS_STRIDE
        c = tl.load(cs + i).to(tl.float32)
        s = tl.load(cs + 32 + i).to(tl.float32)
        rot_even = even * c - odd * s
        rot_odd = odd * c + even * s
        if SANITIZE_CACHE_NANS:
            rot_even = tl.where(rot_even == rot_even, rot_even, 0.0)
            rot_odd = tl.where(rot_odd == rot_odd, rot_odd, 0.0)
        rope = (values + 448).to(tl.pointer_type(tl.bfloat16))
        tl.store(rope + 2 * i, _bf16_rne(rot_even).to(tl.bfloat16))
        tl.store(rope + 2 * i + 1, _bf16_rne(rot_odd).to(tl.bfloat16))


# ----------------------------------------------------------------------------- launcher
def rope_quant_insert(
    latent: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    compress_ratio: int,
    sanitize_nans: bool = False,
) -> None:
    """Launch as upstream's dispatcher does for the 584-byte record (for tests and benches)."""
    if compress_ratio not in (1, 2):
        raise ValueError(f"compress_ratio must be 1 or 2, got {compress_ratio}")
    if (
        latent.dim() != 2
        or latent.shape[1] != 512
        or latent.dtype != torch.bfloat16
        or not latent.is_contiguous()
    ):
        raise ValueError(f"latent must be contiguous [T, 512] bf16, got {tuple(latent.shape)} {latent.dtype}")
    if kv_cache.dtype != torch.uint8 or kv_cache.shape[-1] != RECORD_BYTES or kv_cache.dim() != 3:
        raise ValueError(
            f"kv_cache must be uint8 [blocks, block_size, {RECORD_BYTES}], got {tuple(kv_cache.shape)}"
        )
    if cos_sin_cache.shape[-1] != ROPE_DIM:
        raise ValueError(f"cos_sin_cache must be [max_pos, {ROPE_DIM}], got {tuple(cos_sin_cache.shape)}")
    num_tokens = slot_mapping.numel()
    if num_tokens > min(latent.shape[0], positions.numel()):
        raise ValueError(f"{num_tokens} slots for {latent.shape[0]} rows / {positions.numel()} positions")
    if num_tokens:
        rope_quant_insert_kernel[(num_tokens,)](
            latent,
            positions,
            cos_sin_cache,
            kv_cache,
            slot_mapping,
            COS_STRIDE=cos_sin_cache.stride(0),
            CACHE_STRIDE=kv_cache.stride(0),
            CACHE_BLOCK=kv_cache.shape[1],
            COMPRESS_RATIO=compress_ratio,
            SANITIZE_CACHE_NANS=sanitize_nans,
            num_warps=4,
        )


assert DATA_BYTES == 576 and NOPE_DIM == 448 and E4M3_MAX == 448.0  # the kernel's literals

# upstream's argument names (no `_ptr` suffix): every pointer named with its dtype
_SIG = signature(
    rope_quant_insert_kernel,
    {"latent": "bf16", "positions": "i64", "cos_sin": "fp32", "cache": "u8", "cache_slots": "i64"},
)
# compressed caches: 128-token blocks hold 128 states at ratio 1, 64 at ratio 2 (page 74880 / 37440 B)
COMPILE_SPECS = tuple(
    CompileSpec(
        f"compress_insert.r{ratio}.bs{states}",
        rope_quant_insert_kernel,
        _SIG,
        {
            "COS_STRIDE": 64,
            "CACHE_STRIDE": page,
            "CACHE_BLOCK": states,
            "COMPRESS_RATIO": ratio,
            "SANITIZE_CACHE_NANS": False,
        },
        num_warps=4,
        divisible_by_16=("latent", "positions", "cos_sin", "cache", "cache_slots"),
    )
    for ratio, states, page in ((1, 128, 74880), (2, 64, 37440))
)
