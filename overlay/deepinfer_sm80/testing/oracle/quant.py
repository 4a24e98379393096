"""Number formats the checkpoint and the served engine use, decoded and encoded in plain PyTorch.

Decoders work on raw bytes (uint8 views), never on torch's float8 conversions of the scale bytes:
UE8M0 byte u means 2^(u - 127), built as the fp32 bit pattern `u << 23` (0 -> 0.0, 255 -> inf, as the
engine's shift decode; torch's float8_e8m0fnu gives 2^-127 and NaN there).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

E4M3_MAX = 448.0
BLOCK = 32  # FP8 weight blocks (32 x 32) and MXFP4 groups (1 x 32)
# e2m1 magnitudes of codes 0..7; bit 3 is the sign
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


class _Mode:
    round_activations = True  # False: every bf16 storage point keeps fp32 (the upper-bound run, ORACLE.md)
    bf16_gemm = True  # False: GEMMs upcast to fp32 before rounding (another summation order, ORACLE.md)


@contextmanager
def fp32_activations() -> Iterator[None]:
    """Within: no bf16 rounding of activations and fp32 GEMMs (weights and fp8 records unchanged)."""
    _Mode.round_activations = False
    try:
        yield
    finally:
        _Mode.round_activations = True


@contextmanager
def fp32_gemms() -> Iterator[None]:
    """Within: the same bf16 storage points, but GEMMs accumulate in torch's fp32 GEMM (another order)."""
    _Mode.bf16_gemm = False
    try:
        yield
    finally:
        _Mode.bf16_gemm = True


def rounding() -> bool:
    return _Mode.round_activations


def bf16_gemm() -> bool:
    return _Mode.round_activations and _Mode.bf16_gemm


def bf16(x: torch.Tensor) -> torch.Tensor:
    """Round to bf16 (nearest even) and hold the value in fp32: the engine's bf16 storage points."""
    return x.to(torch.bfloat16).to(torch.float32) if _Mode.round_activations else x


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
    """fp32 -> nearest e4m3fn value (ties to even, saturating at +-448), returned as fp32.

    Rounds with the value's own spacing: 2^(floor(log2|x|) - 3) for normals (frexp gives the binade
    exactly), 2^-9 below 2^-6 (subnormals)."""
    a = x.abs().clamp_max(E4M3_MAX)
    _, e = torch.frexp(a.clamp_min(2.0**-6))  # a = m * 2^e, m in [0.5, 1): floor(log2 a) = e - 1
    step = torch.exp2((e - 4).to(torch.float32))
    q = torch.round(a / step) * step  # torch.round is half-to-even; a / step is exact (power of two)
    return torch.copysign(q.clamp_max(E4M3_MAX), x)


def ceil_log2(y: torch.Tensor) -> torch.Tensor:
    """ceil(log2(y)) for positive fp32, exactly (frexp instead of a rounded log2)."""
    m, e = torch.frexp(y)
    return torch.where(m == 0.5, e - 1, e).to(torch.float32)


def pow2_quant(x: torch.Tensor, group: int, amax_floor: float = 1e-4) -> torch.Tensor:
    """The V4.1 writers' e4m3 quantization with one power-of-two scale per `group` trailing values:
    `e = ceil(log2(max(amax, 1e-4) * fl32(1/448)))`, `q = e4m3(clamp(x * 2^-e, +-448))`; returns the
    dequantized values `q * 2^e` (fp32), what a reader of the record sees."""
    shape = x.shape
    g = x.reshape(*shape[:-1], shape[-1] // group, group)
    amax = g.abs().amax(dim=-1, keepdim=True).clamp_min(amax_floor)
    inv448 = torch.tensor(1.0 / E4M3_MAX, dtype=torch.float32)  # fl32(1/448), as the kernels multiply
    s = torch.exp2(ceil_log2(amax * inv448))
    return (e4m3_encode(g / s) * s).reshape(shape)


def e4m3_values(codes: torch.Tensor) -> torch.Tensor:
    """e4m3fn codes -> bf16 values by torch's conversion (fast; equal to `e4m3_decode` on all 256 codes,
    tests/oracle/test_pieces.py). Every finite e4m3 value is exact in bf16."""
    return codes.view(torch.uint8).view(torch.float8_e4m3fn).to(torch.bfloat16)


def fp8_block_dequant(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """e4m3 weight [out, in] with UE8M0 scales [ceil(out/32), ceil(in/32)] -> bf16 [out, in] (exact:
    a bf16 value times a power of two inside bf16's range)."""
    w = e4m3_values(codes)
    s = ue8m0(scales).to(torch.bfloat16).repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    return w * s[: w.shape[0], : w.shape[1]]


def fp8_row_dequant(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """e4m3 rows [n, dim] with one UE8M0 per 32 values [n, dim/32] (the Engram tables) -> bf16 (exact)."""
    return e4m3_values(codes) * ue8m0(scales).to(torch.bfloat16).repeat_interleave(BLOCK, 1)


def mxfp4_dequant(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 [out, in/2] int8 (two e2m1 per byte, low nibble = even column; bit 3 of a nibble is the sign)
    with UE8M0 [out, in/32] -> bf16 [out, in] (exact)."""
    b = packed.view(torch.uint8)
    nib = torch.stack([b & 15, b >> 4], dim=-1).reshape(b.shape[0], -1).to(torch.int64)
    mag = torch.tensor(E2M1, dtype=torch.bfloat16)
    lut = torch.cat([mag, -mag])  # codes 0..15
    return lut[nib] * ue8m0(scales).to(torch.bfloat16).repeat_interleave(BLOCK, 1)
