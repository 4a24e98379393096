"""Number formats the checkpoint and the served engine use, decoded and encoded in plain PyTorch.

Decoders work on raw bytes (uint8 views), never on torch's float8 conversions of the scale bytes:
UE8M0 byte u means 2^(u - 127), built as the fp32 bit pattern `u << 23` (0 -> 0.0, 255 -> inf, as the
engine's shift decode; torch's float8_e8m0fnu gives 2^-127 and NaN there).
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0
BLOCK = 32  # FP8 weight blocks (32 x 32) and MXFP4 groups (1 x 32)
# e2m1 magnitudes of codes 0..7; bit 3 is the sign
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def bf16(x: torch.Tensor) -> torch.Tensor:
    """Round to bf16 (nearest even) and hold the value in fp32: the engine's bf16 storage points."""
    return x.to(torch.bfloat16).to(torch.float32)


def ue8m0(u: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes (uint8 or float8_e8m0fnu) -> fp32 powers of two by the exponent-field shift."""
    if u.dtype != torch.uint8:
        u = u.view(torch.uint8)
    return (u.to(torch.int32) << 23).view(torch.float32)


def e4m3_decode(b: torch.Tensor) -> torch.Tensor:
    """e4m3fn bytes -> fp32 from the bit fields (sign, 4-bit exponent bias 7, 3-bit mantissa); 0x7F / 0xFF
    are NaN. Independent of torch's own float8 conversion, so a test can hold the two against each other."""
    if b.dtype != torch.uint8:
        b = b.view(torch.uint8)
    i = b.to(torch.int32)
    e, m = (i >> 3) & 15, (i & 7).to(torch.float32)
    mag = torch.where(e == 0, m * 2.0**-9, (8 + m) * torch.exp2((e - 10).to(torch.float32)))
    mag = torch.where((i & 0x7F) == 0x7F, torch.full_like(mag, float("nan")), mag)
    return torch.where((i & 0x80) != 0, -mag, mag)


def e4m3_encode(x: torch.Tensor) -> torch.Tensor:
    """fp32 (already clamped to +-448) -> nearest e4m3fn value (ties to even), returned as fp32.

    Rounds with the value's own spacing: 2^(floor(log2|x|) - 3) for normals, 2^-9 below 2^-6."""
    a = x.abs()
    exp = torch.floor(torch.log2(a.clamp_min(2.0**-6)))
    step = torch.exp2(exp - 3)
    q = torch.round(a / step) * step  # torch.round: half to even, and a / step is exact (power of two)
    return torch.copysign(q.clamp_max(E4M3_MAX), x)


def fp8_block_dequant(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """e4m3 weight [out, in] with UE8M0 scales [ceil(out/32), ceil(in/32)] -> fp32 [out, in]."""
    w = e4m3_decode(codes)
    s = ue8m0(scales).repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    return w * s[: w.shape[0], : w.shape[1]]


def fp8_row_dequant(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """e4m3 rows [n, dim] with one UE8M0 per 32 values [n, dim/32] (the Engram tables) -> fp32."""
    return e4m3_decode(codes) * ue8m0(scales).repeat_interleave(BLOCK, 1)


def mxfp4_dequant(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 [out, in/2] int8 (two e2m1 per byte, low nibble = even column) with UE8M0 [out, in/32]."""
    b = packed.view(torch.uint8).to(torch.int32)
    nib = torch.stack([b & 15, b >> 4], dim=-1).reshape(b.shape[0], -1)
    lut = torch.tensor(E2M1, dtype=torch.float32)
    v = lut[nib & 7]
    v = torch.where((nib & 8) != 0, -v, v)
    return v * ue8m0(scales).repeat_interleave(BLOCK, 1)
