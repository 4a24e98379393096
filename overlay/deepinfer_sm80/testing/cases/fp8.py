"""Cases of the software FP8 conversions (ops/fp8.py): the exhaustive inputs (all 256 e4m3 codes and UE8M0
bytes, every bf16 bit pattern), the encoder's rounding and saturation edges, the random fp32 draws, and
the hardware conversions they are held to on a GPU.

Equality contract: bitwise. Decoding is exact for every code; encoding is the direct round-to-nearest-
even of the clamped value, so each input has exactly one right code (docs/FP8_DS_MLA.md). The upstream
counterpart is the hardware cvt that torch's float8_e4m3fn cast compiles to on sm_89+.
No binding row, so no ENTRY_POINT_CASES. Importing it defines no Triton kernel.
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0  # the writers' pre-clamp (ops/fp8.py)
RANDOM_FP32 = 4096  # values per random draw
RANDOM_FP32_EXAMPLES = 20  # hypothesis seeds per run

# (fp32 value, e4m3fn code): saturation to ±448 (no inf in e4m3fn), -0, subnormals and their rounding,
# the largest subnormal's carry into the first normal, a tie to even and just past it, NaN
ENCODE_EDGES = [
    (448.0, 0x7E),
    (464.0, 0x7E),
    (1e30, 0x7E),
    (float("inf"), 0x7E),
    (-448.0, 0xFE),
    (-0.0, 0x80),
    (2.0**-10, 0x00),
    (3 * 2.0**-11, 0x01),
    (2.0**-6 - 2.0**-11, 0x08),
    (1.0625, 0x38),
    (1.0625 + 2.0**-20, 0x39),
    (float("nan"), 0x7F),
]


def poisoned(shape: int | tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    """An output that starts as 0xA5 bytes (uint8) or NaN (floats): a skipped element shows."""
    out = torch.empty(shape, dtype=dtype, device=device)
    return out.fill_(0xA5) if dtype == torch.uint8 else out.fill_(float("nan"))


def all_bytes(device: str) -> torch.Tensor:
    """The 256 byte values 0..255 as uint8: every e4m3 code, every UE8M0 exponent."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).to(device)


def all_bf16_bits() -> torch.Tensor:
    """Every bf16 bit pattern as int16 (±0, ±inf, NaNs, subnormals)."""
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)


def all_bf16_as_fp32(device: str) -> torch.Tensor:
    """Every bf16 value widened exactly to fp32."""
    return all_bf16_bits().view(torch.bfloat16).float().to(device)


def e4m3_by_formula() -> torch.Tensor:
    """The 256 codes decoded from SPEC's formula, independent of torch's float8 type: (8+M)·2^(E-10),
    M·2^-9 for E = 0, NaN at 0x7F/0xFF."""
    b = torch.arange(256)
    sign = torch.where(b >= 128, -1.0, 1.0).double()
    e, m = (b >> 3) & 15, b & 7
    mag = torch.where(e == 0, m * 2.0**-9, (8 + m) * torch.pow(2.0, (e - 10).double()))
    expect = (sign * mag).float()
    expect[(b & 0x7F) == 0x7F] = float("nan")
    return expect


def random_fp32(seed: int, device: str) -> torch.Tensor:
    """RANDOM_FP32 fp32 values with full 24-bit mantissas from `seed` (hypothesis draws it): random bit
    patterns, those of magnitude > 1e3 scaled by 1e-36 so both huge-to-saturate and tiny values occur."""
    gen = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31 - 1, (RANDOM_FP32,), generator=gen, dtype=torch.int64)
    x = bits.to(torch.int32).view(torch.float32)
    x = torch.where(x.abs() > 1e3, x * 1e-36, x)  # most random patterns are huge or tiny; keep both
    return x.to(device)


def hardware_decode(codes: torch.Tensor) -> torch.Tensor:
    """torch's float8_e4m3fn -> fp32 cast (the hardware cvt on sm_89+)."""
    return codes.view(torch.float8_e4m3fn).float()


def hardware_encode(x: torch.Tensor) -> torch.Tensor:
    """torch's fp32 -> float8_e4m3fn cast (the hardware cvt on sm_89+) of x within ±E4M3_MAX: beyond it
    torch's saturation is device-specific (ops/fp8.py e4m3_encode_ref), so the caller clamps first."""
    return x.to(torch.float8_e4m3fn).view(torch.uint8)
