"""Software FP8 for SM80/SM86: e4m3fn decode/encode and UE8M0 scale decode (docs/FP8_DS_MLA.md).

Triton on capability < 8.9 rejects `tl.float8e4nv`, so every SM80 kernel that touches the
fp8_ds_mla record imports the `@triton.jit` device functions below. References are plain torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_sm80.registry import CompileSpec, signature

E4M3_MAX = 448.0
# Triton reads module globals only as tl.constexpr
_E4M3_MAX = tl.constexpr(E4M3_MAX)
E4M3_NAN_MAG = tl.constexpr(0x7F)  # 0x7F / 0xFF are the only NaN codes of e4m3fn; there is no inf
E4M3_MAX_FINITE_CODE = tl.constexpr(0x7E)
# fp32 exponent bias 127 minus e4m3 bias 7, in the `code << 20` position used by the encoder
_REBIAS = tl.constexpr(120 << 3)


# ----------------------------------------------------------------------------- references
def e4m3_decode_ref(b: torch.Tensor) -> torch.Tensor:
    """uint8 codes [...] -> fp32 [...]; exact for all 256 codes, NaN for 0x7F/0xFF."""
    return b.view(torch.float8_e4m3fn).float()


def e4m3_encode_ref(x: torch.Tensor) -> torch.Tensor:
    """fp32 [...] -> uint8 codes [...]: clamp to ±448 (NaN kept), then torch's direct RNE cast.

    The clamp is the documented pre-clamp of every V4 writer (docs/FP8_DS_MLA.md) and keeps the
    reference independent of torch's device-specific saturation (§2.5).
    """
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def ue8m0_decode_ref(u: torch.Tensor) -> torch.Tensor:
    """uint8 exponents [...] -> fp32 2^(u-127) [...]; 0 -> 0.0 and 255 -> +inf (bit shift, §2.3)."""
    return (u.to(torch.int32) << 23).view(torch.float32)


# ----------------------------------------------------------------------------- device functions
@triton.jit
def e4m3_to_f32(b):
    """uint8 e4m3fn codes -> fp32, exact; NaN codes give NaN (callers that scrub do so after)."""
    bi = b.to(tl.int32)
    # Place sign and the 7 magnitude bits in fp16 (E at bits 14..10, M at 9..7): the fp16 value
    # is the e4m3 value times 2^-8, subnormals included, so one exact fp16->fp32 convert and a
    # power-of-two multiply decode every finite code.
    h = (((bi & 0x80) << 8) | ((bi & 0x7F) << 7)).to(tl.int16).to(tl.float16, bitcast=True)
    x = h.to(tl.float32) * 256.0
    return tl.where((bi & 0x7F) == E4M3_NAN_MAG, float("nan"), x)


@triton.jit
def ue8m0_to_f32(u):
    """uint8 UE8M0 exponents -> fp32 2^(u-127) by placing u in the exponent field (0 -> 0, 255 -> inf)."""
    return (u.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def f32_to_e4m3(x):
    """fp32 (pre-clamped to ±448) -> uint8 e4m3fn code by direct RNE; saturates, NaN -> 0x7F|sign."""
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = bits & 0x7FFFFFFF
    exp32 = a >> 23
    # normal e4m3 (|x| >= 2^-6, fp32 exponent >= 121): round the mantissa to 3 bits, ties to
    # even; a carry ripples into the exponent field by itself.
    rounded = (a + 0x7FFFF + ((a >> 20) & 1)) >> 20
    normal = rounded - _REBIAS
    # subnormal e4m3: rne(|x| * 2^9) = rne(mant * 2^(exp32 - 141)), a right shift by >= 21
    mant = (a & 0x7FFFFF) | 0x800000
    shift = tl.minimum(tl.maximum(141 - exp32, 1), 31)  # clamp keeps the unused lanes defined
    half = (1 << (shift - 1)) - 1
    sub = (mant + half + ((mant >> shift) & 1)) >> shift
    sub = tl.where(exp32 == 0, 0, sub)
    code = tl.where(exp32 >= 121, normal, sub)
    code = tl.minimum(code, E4M3_MAX_FINITE_CODE)
    code = tl.where(a > 0x7F800000, E4M3_NAN_MAG, code)
    return (code | sign).to(tl.uint8)


@triton.jit
def clamp_e4m3_range(x):
    """The writers' pre-clamp to ±448 with the input NaN kept, sign and all. Plain tl.minimum/maximum
    lower to PTX min/max, which return the non-NaN operand on the GPU (the interpreter's numpy
    propagates it), and propagate_nan=ALL returns a canonical +NaN: both lose what the hardware
    conversion keeps (H200 runs of 2026-11-29: 0xFE, then 0x7F, where the cast gives 0xFF)."""
    clamped = tl.minimum(tl.maximum(x, -_E4M3_MAX), _E4M3_MAX)
    return tl.where(x != x, x, clamped)


# ----------------------------------------------------------------------------- test kernels
@triton.jit
def _e4m3_decode_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, e4m3_to_f32(tl.load(src_ptr + offs, mask=mask)), mask=mask)


@triton.jit
def _e4m3_encode_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(src_ptr + offs, mask=mask)
    tl.store(dst_ptr + offs, f32_to_e4m3(clamp_e4m3_range(x)), mask=mask)


@triton.jit
def _ue8m0_decode_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, ue8m0_to_f32(tl.load(src_ptr + offs, mask=mask)), mask=mask)


_BLOCK = 1024


def _launch(
    kernel: triton.JITFunction, src: torch.Tensor, dst: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    if dst is None:
        dst = torch.empty(src.shape, dtype=dtype, device=src.device)
    elif dst.shape != src.shape or dst.dtype != dtype or not dst.is_contiguous():
        raise ValueError(f"out must be contiguous {dtype} of shape {tuple(src.shape)}")
    n = src.numel()
    if n:
        kernel[(triton.cdiv(n, _BLOCK),)](src, dst, n, BLOCK=_BLOCK)
    return dst


def e4m3_decode(b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton decode of contiguous uint8 codes [N] -> fp32 [N]."""
    if b.dtype != torch.uint8 or not b.is_contiguous():
        raise ValueError(f"e4m3_decode expects contiguous uint8, got {b.dtype}")
    return _launch(_e4m3_decode_kernel, b, out, torch.float32)


def e4m3_encode(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton clamp-and-encode of contiguous fp32 [N] -> uint8 codes [N]."""
    if x.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError(f"e4m3_encode expects contiguous float32, got {x.dtype}")
    return _launch(_e4m3_encode_kernel, x, out, torch.uint8)


def ue8m0_decode(u: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton decode of contiguous uint8 exponents [N] -> fp32 [N]."""
    if u.dtype != torch.uint8 or not u.is_contiguous():
        raise ValueError(f"ue8m0_decode expects contiguous uint8, got {u.dtype}")
    return _launch(_ue8m0_decode_kernel, u, out, torch.float32)


_U8_TO_F32 = {"src_ptr": "u8", "dst_ptr": "fp32"}
COMPILE_SPECS = (
    CompileSpec(
        "fp8.e4m3_decode",
        _e4m3_decode_kernel,
        signature(_e4m3_decode_kernel, _U8_TO_F32),
        {"BLOCK": _BLOCK},
    ),
    CompileSpec(
        "fp8.e4m3_encode",
        _e4m3_encode_kernel,
        signature(_e4m3_encode_kernel, {"src_ptr": "fp32", "dst_ptr": "u8"}),
        {"BLOCK": _BLOCK},
    ),
    CompileSpec(
        "fp8.ue8m0_decode",
        _ue8m0_decode_kernel,
        signature(_ue8m0_decode_kernel, _U8_TO_F32),
        {"BLOCK": _BLOCK},
    ),
)
