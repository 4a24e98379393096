"""wo_a on SM8x: the load-time bf16 dequant is exact (bitwise vs upstream's own bf16 dequant of the same
fp8 weight), the grouped bf16 bmm is within one bf16 rounding plus the fp32 accumulation bound of the
fp32 einsum, the memory figures follow the shapes. The whole o_proj front (inverse RoPE + wo_a) vs
upstream's bf16 branch is tests/integration/test_o_proj_upstream.py (interpreter, every CI machine).
Cases, builders and the bound: testing/cases/o_proj.py."""

from __future__ import annotations

import pytest
import torch

from deepinfer_sm80.ops import o_proj as op
from deepinfer_sm80.testing.cases.o_proj import (
    BAD,
    BLOCK,
    BMM_TOKENS,
    BMM_TP,
    BMM_WHY,
    DEQUANT,
    R,
    bmm_bound,
    bmm_inputs,
    fp8_weight,
    upstream_dequant,
)
from deepinfer_sm80.testing.compare import MismatchError, assert_bitwise_equal, assert_within_bound


def test_dequant_is_exact_and_equals_upstreams_bf16_dequant() -> None:
    try:
        from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rms
    except ImportError as exc:  # the GPU bundle lacks some of vLLM's optional imports
        pytest.skip(f"upstream module does not import here: {exc}")
    groups, k = DEQUANT.groups, DEQUANT.k
    w, s = fp8_weight(DEQUANT)
    ours = op.dequant_block_fp8(w, s)
    exact = w.float() * s.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    assert_bitwise_equal("dequant vs fp32 product", ours, exact.bfloat16())
    theirs = upstream_dequant(rms, w, s, groups)
    assert_bitwise_equal("dequant vs upstream _get_cached_wo_a_bf16", ours.view(groups, R, k), theirs)


def test_ue8m0_scales_decode_by_exponent() -> None:
    u = torch.tensor([[1, 127, 130, 254]], dtype=torch.uint8)
    assert op.decode_scale(u).tolist() == [[2.0**-126, 1.0, 8.0, 2.0**127]]
    if op.E8M0 is not None:
        assert op.decode_scale(u.view(op.E8M0)).tolist() == [[2.0**-126, 1.0, 8.0, 2.0**127]]


@pytest.mark.parametrize("tp", BMM_TP)
def test_bmm_within_one_rounding_and_the_accumulation_bound(tp: int) -> None:
    o, wb, groups = bmm_inputs(tp)
    z = op.wo_a_bmm(o, wb, groups)
    assert z.shape == (BMM_TOKENS, groups, R) and z.dtype == torch.bfloat16
    ref, bound = bmm_bound(o, wb, groups)
    assert_within_bound(f"wo_a tp{tp}", z.float(), ref, bound, why=BMM_WHY)
    with pytest.raises(MismatchError):  # the bound is tight enough that a 2^-6 relative error shows
        assert_within_bound("z*(1+2^-6)", z.float() * (1 + 2**-6), ref, bound, why="t")


def test_memory_per_rank() -> None:
    mib = 2**20
    # per layer bf16: G_local x 1024 x 4096 x 2 B
    assert [op.wo_a_bytes(tp)["bf16_per_layer"] // mib for tp in (2, 4, 8)] == [32, 16, 8]
    assert op.wo_a_bytes(8)["layers"] == 43
    assert op.wo_a_bytes(8)["bf16_total"] == 43 * 8 * mib


def test_bad_scale_shape_is_one_line_error() -> None:
    w, s = fp8_weight(BAD)
    with pytest.raises(ValueError, match="does not tile"):
        op.dequant_block_fp8(w, s[:, :1].repeat(1, 3))
