"""`fused_indexer_q_rope_quant` (FP8 path) for SM80: GPT-J RoPE on dims 64..127, per-head e4m3 Q,
folded weights.

Upstream's Triton kernel stores with `.to(tl.float8e4nv)` (sm_89+) and its default path is a CuTeDSL
kernel that needs `cvt.e4m3x2.f32` (sm_89+). This port keeps upstream's arithmetic in the same order
(fp32 RoPE rounded to bf16, amax over the head, `s = 2^ceil(log2(div_rn(max(amax, 1e-4), 448)))`,
`q8 = e4m3(div_rn(x, s))`, `w' = w·s·softmax_scale·head_scale`) and encodes e4m3 in software.

The exponent is read off the fp32 bits of `div_rn(amax, 448)` instead of `ceil(log2(.))`: the two
agree wherever log2 is exact at powers of two, and the bit form is exact everywhere (interpreter and
GPU alike). The direct RNE encoder equals the hardware's f32->f16->e4m3 double rounding here because
every value it sees is a bf16 times a power of two (<= 8 significant bits).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_sm80.formats.indexer_k import AMAX_FLOOR, INDEX_DIM, ROPE_DIM
from deepinfer_sm80.ops.fp8 import E4M3_MAX, e4m3_encode_ref, f32_to_e4m3
from deepinfer_sm80.registry import CompileSpec, signature

_E4M3_MAX = tl.constexpr(E4M3_MAX)


# ----------------------------------------------------------------------------- reference
def pow2_ceil_exponent(x: torch.Tensor) -> torch.Tensor:
    """ceil(log2(x)) of positive normal fp32 x, exactly, as int32 (frexp: x = f·2^E, f in [0.5, 1))."""
    frac, exp = torch.frexp(x.float())
    return (exp - (frac == 0.5).to(exp.dtype)).to(torch.int32)


def exp2_int(e: torch.Tensor) -> torch.Tensor:
    """2^e as fp32 for int32 e in [-126, 127], by placing e in the exponent field."""
    return ((e + 127) << 23).view(torch.float32)


def rope_gptj_ref(x_rot: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved RoPE in fp32, each product and sum rounded once (no FMA), result rounded to bf16.

    x_rot [..., 64] fp32; cos/sin [..., 32] fp32 broadcastable. Returns fp32 holding bf16 values."""
    even, odd = x_rot[..., 0::2], x_rot[..., 1::2]
    r_even = even * cos - odd * sin
    r_odd = odd * cos + even * sin
    out = torch.stack([r_even, r_odd], dim=-1).flatten(-2)
    return out.bfloat16().float()


def fused_indexer_q_rope_quant_ref(
    positions: torch.Tensor,
    index_q: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    index_weights: torch.Tensor,
    softmax_scale: float,
    head_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch emulation of upstream's rounding: (q8 uint8 [T, H, 128], weights' fp32 [T, H])."""
    q = index_q.float()  # [T, H, 128]
    cs = cos_sin_cache[positions.long()].float()  # [T, 64]
    half = ROPE_DIM // 2
    cos, sin = cs[:, None, :half], cs[:, None, half:]  # [T, 1, 32]
    nope = q[..., : INDEX_DIM - ROPE_DIM]
    rot = rope_gptj_ref(q[..., INDEX_DIM - ROPE_DIM :], cos, sin)
    x = torch.cat([nope, rot], dim=-1)  # [T, H, 128]
    amax = x.abs().amax(-1).clamp_min(AMAX_FLOOR)  # [T, H]
    ratio = amax / torch.tensor(E4M3_MAX, dtype=torch.float32)  # IEEE fp32 division = div_rn
    e = pow2_ceil_exponent(ratio)
    s = exp2_int(e)
    q8 = e4m3_encode_ref(x * exp2_int(-e)[..., None])  # x / 2^e is exact (or one rounding if subnormal)
    f32 = torch.float32
    w = index_weights.float() * s
    w = w * torch.tensor(softmax_scale, dtype=f32)
    w = w * torch.tensor(head_scale, dtype=f32)
    return q8, w


# ----------------------------------------------------------------------------- kernel
@triton.jit
def round_to_bf16(x):
    """fp32 -> the nearest bf16 (ties to even), returned as fp32; NaN kept. The same value as the
    hardware `cvt.rn.bf16.f32` that `.to(tl.bfloat16)` compiles to on the GPU, but also exact under
    TRITON_INTERPRET=1, whose fp32->bf16 cast truncates (triton 3.7 `_convert_float`)."""
    bits = x.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536  # -65536 = 0xFFFF0000
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))


@triton.jit
def _q_quant_kernel(
    pos_ptr,
    q_ptr,
    q_stride0,
    q_stride1,
    cs_ptr,
    cs_stride,
    q8_ptr,
    q8_stride0,
    q8_stride1,
    w_ptr,
    w_stride,
    softmax_scale,
    head_scale,
    w_out_ptr,
    w_out_stride,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF_ROT: tl.constexpr,
):
    """One program per token: a [HEADS, HEAD_DIM] tile, amax per head."""
    tok = tl.program_id(0).to(tl.int64)
    NOPE: tl.constexpr = HEAD_DIM - 2 * HALF_ROT
    h = tl.arange(0, HEADS)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    j = tl.arange(0, HALF_ROT)
    cos = tl.load(cs_ptr + pos * cs_stride + j).to(tl.float32)[None, :]
    sin = tl.load(cs_ptr + pos * cs_stride + HALF_ROT + j).to(tl.float32)[None, :]
    row = q_ptr + tok * q_stride0 + h[:, None] * q_stride1  # [HEADS, 1]
    x_even = tl.load(row + NOPE + 2 * j[None, :]).to(tl.float32)
    x_odd = tl.load(row + NOPE + 2 * j[None, :] + 1).to(tl.float32)
    # upstream's expression, so the GPU compiler contracts it the same way
    r_even = round_to_bf16(x_even * cos - x_odd * sin)
    r_odd = round_to_bf16(x_odd * cos + x_even * sin)
    n = tl.arange(0, NOPE)
    x_nope = tl.load(row + n[None, :]).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(r_even), axis=1), tl.max(tl.abs(r_odd), axis=1))
    amax = tl.maximum(amax, tl.max(tl.abs(x_nope), axis=1))
    ratio = tl.div_rn(tl.maximum(amax, 1e-4), _E4M3_MAX)  # [HEADS], positive normal
    bits = ratio.to(tl.int32, bitcast=True)
    e = (bits >> 23) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)  # ceil(log2(ratio)), exact
    s = ((e + 127) << 23).to(tl.float32, bitcast=True)
    out = q8_ptr + tok * q8_stride0 + h[:, None] * q8_stride1
    s2 = s[:, None]
    tl.store(out + n[None, :], f32_to_e4m3(tl.div_rn(x_nope, s2)))
    tl.store(out + NOPE + 2 * j[None, :], f32_to_e4m3(tl.div_rn(r_even, s2)))
    tl.store(out + NOPE + 2 * j[None, :] + 1, f32_to_e4m3(tl.div_rn(r_odd, s2)))
    w = tl.load(w_ptr + tok * w_stride + h).to(tl.float32)
    w = w * s
    w = w * softmax_scale
    w = w * head_scale
    tl.store(w_out_ptr + tok * w_out_stride + h, w)


# ----------------------------------------------------------------------------- launcher
def fused_indexer_q_rope_quant(
    positions: torch.Tensor,
    index_q: torch.Tensor,
    index_q_cos_sin_cache: torch.Tensor,
    index_weights: torch.Tensor,
    index_weights_softmax_scale: float,
    index_weights_head_scale: float,
    use_fp4: bool = False,
    weights_out_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream's signature. Returns (q8 float8_e4m3fn [T, H, 128], weights' fp32 [T, H]).

    positions [T] int; index_q [T, H, 128] bf16 (unit last stride); cos_sin_cache [max_pos, 64]
    (32 cos, then 32 sin); index_weights [T, H]. Only the FP8 path exists on SM80 (MXFP4 is SM100).
    """
    if use_fp4:
        raise NotImplementedError("the MXFP4 indexer Q (use_fp4=True) is SM100-only; SM80 runs the FP8 path")
    if weights_out_dtype != torch.float32:
        raise ValueError(f"the FP8 indexer path takes fp32 weights, got {weights_out_dtype}")
    if index_q.dim() != 3 or index_q.shape[2] != INDEX_DIM or index_q.stride(2) != 1:
        raise ValueError(
            f"index_q must be [T, H, {INDEX_DIM}] with unit last stride, got {tuple(index_q.shape)}"
        )
    t, heads, _ = index_q.shape
    if heads & (heads - 1):
        raise ValueError(f"the number of indexer heads must be a power of two, got {heads}")
    if positions.dim() != 1 or positions.shape[0] != t:
        raise ValueError(f"positions must be [{t}], got {tuple(positions.shape)}")
    if index_q_cos_sin_cache.dim() != 2 or index_q_cos_sin_cache.shape[1] != ROPE_DIM:
        raise ValueError(
            f"cos_sin_cache must be [max_pos, {ROPE_DIM}], got {tuple(index_q_cos_sin_cache.shape)}"
        )
    if index_weights.shape != (t, heads) or index_weights.stride(1) != 1:
        raise ValueError(f"index_weights must be [{t}, {heads}] with unit last stride")
    q8 = torch.empty((t, heads, INDEX_DIM), dtype=torch.float8_e4m3fn, device=index_q.device)
    w_out = torch.empty((t, heads), dtype=torch.float32, device=index_q.device)
    if t:
        q8_u8 = q8.view(torch.uint8)
        _q_quant_kernel[(t,)](
            positions,
            index_q,
            index_q.stride(0),
            index_q.stride(1),
            index_q_cos_sin_cache,
            index_q_cos_sin_cache.stride(0),
            q8_u8,
            q8_u8.stride(0),
            q8_u8.stride(1),
            index_weights,
            index_weights.stride(0),
            float(index_weights_softmax_scale),
            float(index_weights_head_scale),
            w_out,
            w_out.stride(0),
            HEADS=heads,
            HEAD_DIM=INDEX_DIM,
            HALF_ROT=ROPE_DIM // 2,
            num_warps=4,
        )
    return q8, w_out


def _sig() -> dict[str, str]:
    pointers = {
        "pos_ptr": "i64",
        "q_ptr": "bf16",
        "cs_ptr": "fp32",
        "q8_ptr": "u8",
        "w_ptr": "bf16",
        "w_out_ptr": "fp32",
    }
    return signature(_q_quant_kernel, pointers, softmax_scale="fp32", head_scale="fp32")


_ALIGNED = ("q_ptr", "q_stride0", "q_stride1", "cs_ptr", "cs_stride", "q8_ptr", "q8_stride0", "q8_stride1")
COMPILE_SPECS = (
    CompileSpec(
        "indexer.q_quant.h32",
        _q_quant_kernel,
        _sig(),
        {"HEADS": 32, "HEAD_DIM": INDEX_DIM, "HALF_ROT": ROPE_DIM // 2},
        num_warps=4,
        divisible_by_16=_ALIGNED,
    ),
)
