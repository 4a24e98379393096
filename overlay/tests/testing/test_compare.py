"""The compare contracts fail where they must, and report coordinates and bytes."""

import pytest
import torch

from deepinfer_sm80.testing.compare import BF16_EPS, MismatchError, assert_bitwise_equal, assert_close


def test_bitwise_reports_first_mismatch_and_bytes():
    ref = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    out = ref.clone()
    out[1, 2] = 6.5
    out[2, 3] = 0.0
    with pytest.raises(
        MismatchError, match=r"2 of 12 elements differ; first at \(1, 2\).*0x40d00000.*0x40c00000"
    ):
        assert_bitwise_equal("t", out, ref)


def test_bitwise_distinguishes_signed_zero_and_dtype():
    with pytest.raises(MismatchError, match="0x8000"):
        assert_bitwise_equal(
            "z", torch.tensor([-0.0], dtype=torch.bfloat16), torch.tensor([0.0], dtype=torch.bfloat16)
        )
    with pytest.raises(MismatchError, match="dtype"):
        assert_bitwise_equal("d", torch.zeros(2), torch.zeros(2, dtype=torch.float64))


def test_nan_positions_must_match_first():
    ref = torch.tensor([1.0, float("nan"), 3.0])
    assert_bitwise_equal("same nan", torch.tensor([1.0, -float("nan"), 3.0]), ref)
    with pytest.raises(MismatchError, match=r"NaN positions differ at \(2,\)"):
        assert_bitwise_equal("nan", torch.tensor([1.0, float("nan"), float("nan")]), ref)
    with pytest.raises(MismatchError, match=r"\+inf positions"):
        assert_close(
            "inf", torch.tensor([float("inf")]), torch.tensor([1e30]), abs=1e40, rel_in_eps=0, why="t"
        )


def test_close_in_units_of_eps():
    ref = torch.tensor([1.0, 2.0, -4.0], dtype=torch.bfloat16)
    out = ref + torch.tensor([0.0, 2 * BF16_EPS * 2.0, 0.0], dtype=torch.bfloat16)
    assert_close("ok", out, ref, abs=0.0, rel_in_eps=2, why="two roundings")
    with pytest.raises(MismatchError, match=r"first at \(1,\)"):
        assert_close("tight", out, ref, abs=0.0, rel_in_eps=1, why="one rounding")
    with pytest.raises(ValueError, match="reason"):
        assert_close("nowhy", out, ref, abs=0.0, rel_in_eps=1, why="")


def test_within_ulps_counts_representable_values():
    from deepinfer_sm80.testing.compare import assert_within_ulps

    ref = torch.tensor([1.0, 1.0, -0.0, 3.0], dtype=torch.bfloat16)
    one_up = torch.tensor([1.0078125, 0.99609375, 0.0, 3.0], dtype=torch.bfloat16)  # +1, -1 ulp (below 2^0)
    assert_within_ulps("one", one_up, ref, ulps=1, abs=0.0, why="t")
    two_up = torch.tensor([1.015625, 1.0, 0.0, 3.0], dtype=torch.bfloat16)  # 1 + 2^-6: two bf16 ulp
    with pytest.raises(MismatchError, match=r"1 elements more than 1 ulp.*first at \(0,\).*2 ulp"):
        assert_within_ulps("two", two_up, ref, ulps=1, abs=0.0, why="t")
    assert_within_ulps("abs", two_up, ref, ulps=1, abs=2**-6, why="t")
    tiny = torch.tensor([-1e-38, 1e-38], dtype=torch.bfloat16)  # opposite signs near zero: many ulp
    with pytest.raises(MismatchError, match="2 elements"):
        assert_within_ulps("zero", tiny, torch.zeros(2, dtype=torch.bfloat16), ulps=1, abs=0.0, why="t")
    with pytest.raises(ValueError, match="bf16/fp16"):
        assert_within_ulps("f32", ref.float(), ref.float(), ulps=1, abs=0.0, why="t")
