"""Software FP8: exhaustive decode/encode against torch's float8 types (docs/FP8_DS_MLA.md)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_sm80.ops import fp8
from deepinfer_sm80.testing.compare import assert_bitwise_equal
from deepinfer_sm80.testing.gates import requires_cuda, test_device

DEV = test_device()


def _poisoned(shape, dtype):
    out = torch.empty(shape, dtype=dtype, device=DEV)
    return out.fill_(0xA5) if dtype == torch.uint8 else out.fill_(float("nan"))


def test_e4m3_decode_all_256_codes():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).to(DEV)
    assert_bitwise_equal(
        "e4m3 decode", fp8.e4m3_decode(codes, _poisoned(256, torch.float32)), fp8.e4m3_decode_ref(codes)
    )


def test_e4m3_decode_reference_matches_spec_formula():
    # independent check of the reference itself: (8+M)·2^(E-10), M·2^-9, NaN at 0x7F/0xFF
    b = torch.arange(256)
    sign = torch.where(b >= 128, -1.0, 1.0).double()
    e, m = (b >> 3) & 15, b & 7
    mag = torch.where(e == 0, m * 2.0**-9, (8 + m) * torch.pow(2.0, (e - 10).double()))
    expect = (sign * mag).float()
    expect[(b & 0x7F) == 0x7F] = float("nan")
    assert_bitwise_equal("e4m3 ref vs formula", fp8.e4m3_decode_ref(b.to(torch.uint8)), expect)
    assert fp8.e4m3_decode_ref(torch.tensor([0x7E], dtype=torch.uint8)).item() == 448.0


def test_ue8m0_decode_all_256_exponents():
    u = torch.arange(256, dtype=torch.int32).to(torch.uint8).to(DEV)
    out = fp8.ue8m0_decode(u, _poisoned(256, torch.float32))
    assert_bitwise_equal("ue8m0 decode", out, fp8.ue8m0_decode_ref(u))
    cpu = out.cpu()
    assert cpu[0].item() == 0.0 and cpu[255].item() == float("inf")  # the shift's edge codes (§2.3)
    exact = torch.pow(2.0, torch.arange(1, 255, dtype=torch.float64) - 127).float()
    assert_bitwise_equal("ue8m0 1..254 exact", cpu[1:255], exact)


def test_e4m3_encode_every_bf16_pattern():
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    x = bits.view(torch.bfloat16).float().to(DEV)  # every bf16 value, ±0, ±inf, NaNs, subnormals
    assert_bitwise_equal(
        "e4m3 encode (all bf16)", fp8.e4m3_encode(x, _poisoned(x.shape, torch.uint8)), fp8.e4m3_encode_ref(x)
    )


def test_e4m3_encode_round_trip_of_all_codes():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).to(DEV)
    back = fp8.e4m3_encode(fp8.e4m3_decode(codes))
    finite = (codes & 0x7F) != 0x7F
    assert torch.equal(back[finite].cpu(), codes[finite].cpu())
    assert ((back[~finite] & 0x7F) == 0x7F).all()


@pytest.mark.parametrize(
    ("value", "code"),
    [
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
    ],
)
def test_e4m3_encode_edges(value, code):
    out = fp8.e4m3_encode(torch.tensor([value], dtype=torch.float32, device=DEV)).cpu().item()
    assert out == code, f"encode({value!r}) = {out:#04x}, want {code:#04x}"


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_e4m3_encode_random_fp32(seed):
    # fp32 inputs with full 24-bit mantissas: the direct-RNE contract holds beyond bf16 too
    gen = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31 - 1, (4096,), generator=gen, dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32)
    x = torch.where(x.abs() > 1e3, x * 1e-36, x)  # most random patterns are huge or tiny; keep both
    x = x.to(DEV)
    assert_bitwise_equal(
        "e4m3 encode (random fp32)",
        fp8.e4m3_encode(x, _poisoned(x.shape, torch.uint8)),
        fp8.e4m3_encode_ref(x),
    )


@pytest.mark.parametrize("fn", [fp8.e4m3_decode, fp8.e4m3_encode, fp8.ue8m0_decode])
def test_launchers_reject_wrong_dtype(fn):
    with pytest.raises(ValueError, match="expects contiguous"):
        fn(torch.zeros(4, dtype=torch.float16, device=DEV))


@requires_cuda
def test_e4m3_matches_hardware_conversion_on_gpu():
    # On sm_89+ torch's cast is the hardware cvt: our software path must equal it bit for bit.
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).cuda()
    assert_bitwise_equal("decode vs hw", fp8.e4m3_decode(codes), codes.view(torch.float8_e4m3fn).float())
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).cuda()
    x = bits.view(torch.bfloat16).float().clamp(-448, 448)
    hw = x.to(torch.float8_e4m3fn).view(torch.uint8)
    assert_bitwise_equal("encode vs hw", fp8.e4m3_encode(x), hw)
