"""`quantize_and_insert_k_cache` for the 584-byte fp8_ds_mla record (docs/FP8_DS_MLA.md).

SM80 baseline: upstream's `quantize_and_insert_k_kernel` casts to `tl.float8e4nv`, which Triton
rejects below sm_89, so `base` is a port of it (one program per token, seven 64-wide groups, `x / 2^e`
with `e = ceil(log2(amax/448))` in floats) with the software e4m3 encoder. `optimized` tiles several
tokens per program, derives `e` exactly from the amax bits and scales by a multiply.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_sm80.formats.fp8_ds_mla import (
    AMAX_FLOOR,
    GROUP,
    N_GROUPS,
    NOPE_DIM,
    RECORD_BYTES,
    SCALE_BYTES,
    UE8M0_BIAS,
    check_k_cache,
    token_views,
)
from deepinfer_sm80.ops.fp8 import E4M3_MAX, e4m3_encode_ref, f32_to_e4m3
from deepinfer_sm80.ops.record_constexprs import DATA as _DATA
from deepinfer_sm80.ops.record_constexprs import GROUP_SIZE as _GROUP
from deepinfer_sm80.ops.record_constexprs import GROUPS as _N_GROUPS
from deepinfer_sm80.ops.record_constexprs import NOPE as _NOPE
from deepinfer_sm80.ops.record_constexprs import SCALE as _SCALE
from deepinfer_sm80.registry import CompileSpec, signature

_E4M3_MAX = tl.constexpr(E4M3_MAX)
# 448 = 1.75·2^8: amax = 1.f·2^E needs e = E-8 when 1.f <= 1.75 (fp32 fraction bits <= 0x600000), else E-7
_FRAC_1_75 = tl.constexpr(0x600000)


# ----------------------------------------------------------------------------- reference
def quantize_and_insert_ref(
    k: torch.Tensor, k_cache: torch.Tensor, slot_mapping: torch.Tensor, block_size: int
) -> None:
    """docs/FP8_DS_MLA.md in plain torch, exact: per 64-group amax=max(|x|,1e-4), e=ceil(log2(amax/448)),
    q=e4m3(x·2^-e), scale byte clamp(e+127,0,255), pad 0, RoPE bf16 bytes copied; slot -1 skipped."""
    t = slot_mapping.shape[0]
    x = k[:t].float()  # [T, 512]
    nope = x[:, :NOPE_DIM].reshape(t, N_GROUPS, GROUP)  # [T, 7, 64]
    amax = nope.abs().amax(-1).clamp_min(AMAX_FLOOR)  # [T, 7]
    # e = ceil(log2(amax/448)) without a log: amax/448 = f·2^E, f in [0.5, 1), is exact enough in fp64
    # to never land on a power of two it is not, and CUDA's log2 misses exact powers (amax = 7·2^k)
    frac, exp = torch.frexp(amax.double() / E4M3_MAX)
    e = (exp - (frac == 0.5).to(exp.dtype)).double()
    codes = e4m3_encode_ref(nope * torch.exp2(-e).float()[..., None]).reshape(t, NOPE_DIM)
    rope = k[:t, NOPE_DIM:].contiguous().view(torch.uint8)  # [T, 128]
    scales = torch.zeros(t, SCALE_BYTES, dtype=torch.uint8, device=k.device)
    scales[:, :N_GROUPS] = (e + UE8M0_BIAS).clamp(0, 255).to(torch.uint8)
    data_view, scale_view = token_views(k_cache, block_size)
    slots = slot_mapping.long()
    live = slots != -1
    blk, pos = slots[live] // block_size, slots[live] % block_size
    data_view[blk, pos] = torch.cat([codes, rope], 1)[live]
    scale_view[blk, pos] = scales[live]


# ----------------------------------------------------------------------------- base (upstream port)
@triton.jit
def _insert_base_kernel(
    k_ptr,
    k_stride0,
    slot_mapping_ptr,
    k_cache_ptr,
    page_stride,
    num_tokens,
    BLOCK_SIZE: tl.constexpr,
):
    """One program per token, upstream's loop over eight 64-groups (the eighth is RoPE, skipped)."""
    pid = tl.program_id(0)
    if pid >= num_tokens:
        return
    slot = tl.load(slot_mapping_ptr + pid)
    if slot == -1:
        return
    page = k_cache_ptr + (slot // BLOCK_SIZE).to(tl.int64) * page_stride
    pos = slot % BLOCK_SIZE
    data_ptr = page + pos * _DATA
    scale_ptr = page + BLOCK_SIZE * _DATA + pos * _SCALE
    row_ptr = k_ptr + pid.to(tl.int64) * k_stride0
    for q in tl.static_range(_N_GROUPS + 1):
        if q * _GROUP < _NOPE:
            offs = q * _GROUP + tl.arange(0, _GROUP)
            x = tl.load(row_ptr + offs)  # bf16, as upstream: amax and its floor stay bf16
            amax = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-4)
            exponent = tl.ceil(tl.log2(amax / _E4M3_MAX))
            scale = tl.exp2(exponent)
            x_scaled = tl.clamp(x / scale, -_E4M3_MAX, _E4M3_MAX)
            tl.store(data_ptr + offs, f32_to_e4m3(x_scaled))
            encoded = tl.maximum(tl.minimum(exponent + 127.0, 255.0), 0.0)
            tl.store(scale_ptr + q, encoded.to(tl.uint8))
    tl.store(scale_ptr + _N_GROUPS, tl.zeros((), dtype=tl.uint8))
    rope_out = (data_ptr + _NOPE).to(tl.pointer_type(tl.bfloat16))
    for c in tl.static_range(4):  # 64 RoPE values in chunks of 16, as upstream
        offs = c * 16 + tl.arange(0, 16)
        tl.store(rope_out + offs, tl.load(row_ptr + _NOPE + offs))


# ----------------------------------------------------------------------------- optimized
@triton.jit
def _e4m3_in_range(v):
    """fp32 with |v| <= 448 -> e4m3fn code by direct RNE (fp8.f32_to_e4m3's contract for this range) in
    about a third of its instructions: no saturation or NaN lanes, subnormals by a magic-number round."""
    bits = v.to(tl.int32, bitcast=True)
    a = bits & 0x7FFFFFFF
    # |v| >= 2^-6: drop 20 mantissa bits, ties to even; a carry ripples into the exponent; rebias 127 -> 7
    normal = (a + (0x7FFFF - (120 << 23)) + ((a >> 20) & 1)) >> 20
    # |v| < 2^-6: rne(|v|·2^9) is the low mantissa of |v|·2^9 + 1.5·2^23 (one rounding, exact product)
    sub = (tl.abs(v) * 512.0 + 12582912.0).to(tl.int32, bitcast=True) - 0x4B400000
    code = tl.where(a >= (121 << 23), normal, sub)
    return (code | ((bits >> 24) & 0x80)).to(tl.uint8)


@triton.jit
def _insert_kernel(
    k_ptr,
    k_stride0,
    slot_mapping_ptr,
    k_cache_ptr,
    page_stride,
    num_tokens,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """BLOCK_T tokens per program as a [BLOCK_T, 8, 64] tile; group 7 is the RoPE tail, copied as bf16."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    in_range = t < num_tokens
    slot = tl.load(slot_mapping_ptr + t, mask=in_range, other=-1).to(tl.int64)
    live = slot >= 0  # -1 marks padded tokens; no negative slot is ever written
    page = k_cache_ptr + (slot // BLOCK_SIZE) * page_stride
    pos = slot % BLOCK_SIZE
    data_ptr = page + pos * _DATA  # [BLOCK_T]
    scale_ptr = page + BLOCK_SIZE * _DATA + pos * _SCALE

    g = tl.arange(0, _N_GROUPS + 1)
    col = g[None, :, None] * _GROUP + tl.arange(0, _GROUP)[None, None, :]  # [1, 8, 64]
    live3 = live[:, None, None]
    # masked by the token count only, not by the slot: the row load then need not wait for the slot load
    x = tl.load(
        k_ptr + t.to(tl.int64)[:, None, None] * k_stride0 + col, mask=in_range[:, None, None], other=0.0
    )
    amax = tl.maximum(tl.max(tl.abs(x.to(tl.float32)), axis=2), 1e-4)  # [BLOCK_T, 8]
    bits = amax.to(tl.int32, bitcast=True)
    e = (bits >> 23) - (127 + 8) + ((bits & 0x7FFFFF) > _FRAC_1_75).to(tl.int32)
    inv_scale = ((127 - e) << 23).to(tl.float32, bitcast=True)  # 2^-e, e in [-22, 120]
    # |x|·2^-e <= 448 by the choice of e, so the writers' ±448 clamp is a no-op here
    codes = _e4m3_in_range(x.to(tl.float32) * inv_scale[:, :, None])
    is_nope = (g < _N_GROUPS)[None, :, None]
    tl.store(data_ptr[:, None, None] + col, codes, mask=live3 & is_nope)
    rope_out = (data_ptr + _NOPE).to(tl.pointer_type(tl.bfloat16))
    tl.store(rope_out[:, None, None] + (col - _NOPE), x, mask=live3 & ~is_nope)
    encoded = tl.where(g[None, :] < _N_GROUPS, e + 127, 0).to(tl.uint8)  # pad byte 0
    tl.store(scale_ptr[:, None] + g[None, :], encoded, mask=live[:, None])


# ----------------------------------------------------------------------------- launchers
# 4 tokens x 4 warps: 40 regs. On the H200 8x4 was 10% faster at 8192 tokens but (with the previous
# encoder) 35% slower at 64; 1x1 and 2x2 were within 7% at 8192 (the H200 sweep at bbda5ef: git history,
# results/gpu/kv_cache-h200.json).
# So the tile follows the batch: decode-sized batches keep 4 tokens a program, prefill takes 8.
BLOCK_T = 4
NUM_WARPS = 4
PREFILL_BLOCK_T = 8
PREFILL_MIN_TOKENS = 2048


def _check(
    k: torch.Tensor,
    k_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_size: int,
    is_ue8m0: bool,
    use_fnuz: bool,
    bytes_per_token: int,
) -> None:
    if k.dim() != 2 or k.shape[1] != 512 or k.dtype != torch.bfloat16 or k.stride(1) != 1:
        raise ValueError(
            f"k must be [num_tokens, 512] bf16 with unit last stride, got {tuple(k.shape)} {k.dtype}"
        )
    if not is_ue8m0:
        raise ValueError("only UE8M0 scales are supported")
    if use_fnuz:
        raise ValueError("use_fnuz=True is ROCm-only (FNUZ e4m3)")
    if bytes_per_token != RECORD_BYTES:
        raise NotImplementedError(
            f"only the {RECORD_BYTES}-byte V4 record runs on SM80 (got {bytes_per_token})"
        )
    if slot_mapping.dim() != 1 or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot_mapping must be 1-D int32/int64, got {slot_mapping.dtype}")
    if slot_mapping.shape[0] > k.shape[0]:
        raise ValueError(f"{slot_mapping.shape[0]} slots for {k.shape[0]} rows of k")
    if not slot_mapping.is_contiguous():
        raise ValueError("slot_mapping must be contiguous")
    check_k_cache(k_cache, block_size)


def base_quantize_and_insert_k_cache(
    k: torch.Tensor,
    k_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_size: int = 64,
    is_ue8m0: bool = True,
    use_fnuz: bool = False,
    bytes_per_token: int = RECORD_BYTES,
):
    """SM80 port of upstream's writer: k [T, 512] bf16 -> records at slot_mapping [T'] (T' <= T)."""
    _check(k, k_cache, slot_mapping, block_size, is_ue8m0, use_fnuz, bytes_per_token)
    num_tokens = slot_mapping.shape[0]
    if num_tokens:
        _insert_base_kernel[(num_tokens,)](
            k, k.stride(0), slot_mapping, k_cache, k_cache.stride(0), num_tokens, BLOCK_SIZE=block_size
        )


def quantize_and_insert_k_cache(
    k: torch.Tensor,
    k_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_size: int = 64,
    is_ue8m0: bool = True,
    use_fnuz: bool = False,
    bytes_per_token: int = RECORD_BYTES,
):
    """Quantize k [T, 512] bf16 into the 584-byte records at slot_mapping [T'] (T' <= T; -1 skipped).

    k_cache: uint8 [blocks, page bytes] or [blocks, block_size, 584], pages at stride(0).
    """
    _check(k, k_cache, slot_mapping, block_size, is_ue8m0, use_fnuz, bytes_per_token)
    block_t = PREFILL_BLOCK_T if slot_mapping.shape[0] >= PREFILL_MIN_TOKENS else BLOCK_T
    launch_insert(k, k_cache, slot_mapping, block_size, block_t=block_t)


def launch_insert(
    k: torch.Tensor,
    k_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_size: int,
    *,
    block_t: int = BLOCK_T,
    num_warps: int = NUM_WARPS,
) -> None:
    """The optimized kernel's launch, unchecked; the tile shape is a knob for the benchmark sweep."""
    num_tokens = slot_mapping.shape[0]
    if num_tokens:
        _insert_kernel[(triton.cdiv(num_tokens, block_t),)](
            k,
            k.stride(0),
            slot_mapping,
            k_cache,
            k_cache.stride(0),
            num_tokens,
            BLOCK_SIZE=block_size,
            BLOCK_T=block_t,
            num_warps=num_warps,
        )


_POINTERS = {"k_ptr": "bf16", "slot_mapping_ptr": "i64", "k_cache_ptr": "u8"}


# what production launches pass 16-divisible: torch allocations, 512-element rows, 576-multiple pages
_ALIGNED = ("k_ptr", "k_stride0", "slot_mapping_ptr", "k_cache_ptr", "page_stride")
# SWA pages hold 32 tokens, compressed pages 128 (ratio 1) or 64 (ratio 2): docs/FP8_DS_MLA.md
COMPILE_SPECS = tuple(
    spec
    for bs in (32, 64, 128)
    for spec in (
        CompileSpec(
            f"kv_quant_insert.base.bs{bs}",
            _insert_base_kernel,
            signature(_insert_base_kernel, _POINTERS),
            {"BLOCK_SIZE": bs},
            divisible_by_16=_ALIGNED,
        ),
        *(
            CompileSpec(
                f"kv_quant_insert.opt.bs{bs}.t{block_t}",
                _insert_kernel,
                signature(_insert_kernel, _POINTERS),
                {"BLOCK_SIZE": bs, "BLOCK_T": block_t},
                num_warps=NUM_WARPS,
                divisible_by_16=_ALIGNED,
            )
            for block_t in (BLOCK_T, PREFILL_BLOCK_T)
        ),
    )
)
