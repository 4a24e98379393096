"""Software FP8: exhaustive decode/encode against torch's float8 types (docs/FP8_DS_MLA.md).
Cases and builders: testing/cases/fp8.py."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_sm80.ops import fp8
from deepinfer_sm80.testing.cases.fp8 import (
    E4M3_MAX,
    ENCODE_EDGES,
    RANDOM_FP32_EXAMPLES,
    all_bf16_as_fp32,
    all_bytes,
    e4m3_by_formula,
    hardware_decode,
    hardware_encode,
    poisoned,
    random_fp32,
)
from deepinfer_sm80.testing.compare import assert_bitwise_equal
from deepinfer_sm80.testing.gates import requires_cuda, test_device

DEV = test_device()


def test_e4m3_decode_all_256_codes():
    codes = all_bytes(DEV)
    assert_bitwise_equal(
        "e4m3 decode", fp8.e4m3_decode(codes, poisoned(256, torch.float32, DEV)), fp8.e4m3_decode_ref(codes)
    )


def test_e4m3_decode_reference_matches_spec_formula():
    # independent check of the reference itself: (8+M)·2^(E-10), M·2^-9, NaN at 0x7F/0xFF
    assert_bitwise_equal("e4m3 ref vs formula", fp8.e4m3_decode_ref(all_bytes("cpu")), e4m3_by_formula())
    assert fp8.e4m3_decode_ref(torch.tensor([0x7E], dtype=torch.uint8)).item() == 448.0


def test_ue8m0_decode_all_256_exponents():
    u = all_bytes(DEV)
    out = fp8.ue8m0_decode(u, poisoned(256, torch.float32, DEV))
    assert_bitwise_equal("ue8m0 decode", out, fp8.ue8m0_decode_ref(u))
    cpu = out.cpu()
    assert cpu[0].item() == 0.0 and cpu[255].item() == float("inf")  # the shift's edge codes (§2.3)
    exact = torch.pow(2.0, torch.arange(1, 255, dtype=torch.float64) - 127).float()
    assert_bitwise_equal("ue8m0 1..254 exact", cpu[1:255], exact)


def test_e4m3_encode_every_bf16_pattern():
    x = all_bf16_as_fp32(DEV)  # every bf16 value, ±0, ±inf, NaNs, subnormals
    assert_bitwise_equal(
        "e4m3 encode (all bf16)",
        fp8.e4m3_encode(x, poisoned(x.shape, torch.uint8, DEV)),
        fp8.e4m3_encode_ref(x),
    )


def test_e4m3_encode_round_trip_of_all_codes():
    codes = all_bytes(DEV)
    back = fp8.e4m3_encode(fp8.e4m3_decode(codes))
    finite = (codes & 0x7F) != 0x7F
    assert torch.equal(back[finite].cpu(), codes[finite].cpu())
    assert ((back[~finite] & 0x7F) == 0x7F).all()


@pytest.mark.parametrize(("value", "code"), ENCODE_EDGES)
def test_e4m3_encode_edges(value, code):
    out = fp8.e4m3_encode(torch.tensor([value], dtype=torch.float32, device=DEV)).cpu().item()
    assert out == code, f"encode({value!r}) = {out:#04x}, want {code:#04x}"


@settings(max_examples=RANDOM_FP32_EXAMPLES, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_e4m3_encode_random_fp32(seed):
    # fp32 inputs with full 24-bit mantissas: the direct-RNE contract holds beyond bf16 too
    x = random_fp32(seed, DEV)
    assert_bitwise_equal(
        "e4m3 encode (random fp32)",
        fp8.e4m3_encode(x, poisoned(x.shape, torch.uint8, DEV)),
        fp8.e4m3_encode_ref(x),
    )


@pytest.mark.parametrize("fn", [fp8.e4m3_decode, fp8.e4m3_encode, fp8.ue8m0_decode])
def test_launchers_reject_wrong_dtype(fn):
    with pytest.raises(ValueError, match="expects contiguous"):
        fn(torch.zeros(4, dtype=torch.float16, device=DEV))


@requires_cuda
def test_e4m3_matches_hardware_conversion_on_gpu():
    # On sm_89+ torch's cast is the hardware cvt: our software path must equal it bit for bit.
    codes = all_bytes("cuda")
    assert_bitwise_equal("decode vs hw", fp8.e4m3_decode(codes), hardware_decode(codes))
    x = all_bf16_as_fp32("cuda").clamp(-E4M3_MAX, E4M3_MAX)
    assert_bitwise_equal("encode vs hw", fp8.e4m3_encode(x), hardware_encode(x))
