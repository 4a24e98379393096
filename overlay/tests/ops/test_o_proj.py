"""wo_a on SM8x: the load-time bf16 dequant is exact (bitwise vs upstream's own bf16 dequant of the same
fp8 weight), the grouped bf16 bmm is within one bf16 rounding plus the fp32 accumulation bound of the
fp32 einsum, the memory figures follow the shapes. The whole o_proj front (inverse RoPE + wo_a) vs
upstream's bf16 branch is tests/integration/test_o_proj_upstream.py (interpreter, every CI machine)."""

from __future__ import annotations

import types

import pytest
import torch

from deepinfer_sm80.ops import o_proj as op
from deepinfer_sm80.testing.compare import MismatchError, assert_bitwise_equal, assert_within_bound, bf16_ulp
from deepinfer_sm80.testing.inputs import generator
from deepinfer_sm80.testing.shapes import V41

R, HPG, D = V41.o_lora, V41.heads_per_o_group, V41.head_dim


def fp8_weight(name: str, groups: int, k: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """[G * R, k] e4m3 with every code but NaN, and [G * R / 128, k / 128] fp32 power-of-two scales."""
    gen = generator(name)
    codes = torch.randint(0, 256, (groups * R, k), dtype=torch.uint8, generator=gen)
    codes[(codes & 0x7F) == 0x7F] = 0x3C
    scale = torch.exp2(torch.randint(-20, 4, (groups * R // 128, k // 128), generator=gen).float())
    return codes.view(torch.float8_e4m3fn).to(device), scale.to(device)


def test_dequant_is_exact_and_equals_upstreams_bf16_dequant() -> None:
    try:
        from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rms
    except ImportError as exc:  # the GPU bundle lacks some of vLLM's optional imports
        pytest.skip(f"upstream module does not import here: {exc}")
    groups, k = 1, 2 * 128
    w, s = fp8_weight("dequant", groups, k)
    ours = op.dequant_block_fp8(w, s)
    exact = w.float() * s.repeat_interleave(128, 0).repeat_interleave(128, 1)
    assert_bitwise_equal("dequant vs fp32 product", ours, exact.bfloat16())
    layer = types.SimpleNamespace(weight=w, weight_scale_inv=s)
    theirs = rms._get_cached_wo_a_bf16(layer, groups, R, k)
    assert_bitwise_equal("dequant vs upstream _get_cached_wo_a_bf16", ours.view(groups, R, k), theirs)


def test_ue8m0_scales_decode_by_exponent() -> None:
    u = torch.tensor([[1, 127, 130, 254]], dtype=torch.uint8)
    assert op.decode_scale(u).tolist() == [[2.0**-126, 1.0, 8.0, 2.0**127]]
    if op.E8M0 is not None:
        assert op.decode_scale(u.view(op.E8M0)).tolist() == [[2.0**-126, 1.0, 8.0, 2.0**127]]


@pytest.mark.parametrize("tp", (8, 4))
def test_bmm_within_one_rounding_and_the_accumulation_bound(tp: int) -> None:
    groups = V41.per_rank(tp).o_groups
    gen = generator(f"bmm-tp{tp}")
    o = torch.randn(5, groups * HPG, D, generator=gen).bfloat16()  # [T, H, 512]
    w, s = fp8_weight(f"bmm-w-tp{tp}", groups, HPG * D)
    wb = op.dequant_block_fp8(w, s * 2.0**10)  # weights ~N(0, 1)-sized
    z = op.wo_a_bmm(o, wb, groups)
    assert z.shape == (5, groups, R) and z.dtype == torch.bfloat16
    ref = op.wo_a_ref(o, wb, groups)
    mag = op.wo_a_ref(o.abs(), wb.abs(), groups)  # Σ|a·w| per output
    bound = bf16_ulp(ref) + HPG * D * 2.0**-24 * mag
    assert_within_bound(
        f"wo_a tp{tp}",
        z.float(),
        ref,
        bound,
        why="one bf16 rounding of the fp32 sum + fp32 accumulation order, K = 4096 (K·2^-24·Σ|a·w|)",
    )
    with pytest.raises(MismatchError):  # the bound is tight enough that a 2^-6 relative error shows
        assert_within_bound("z*(1+2^-6)", z.float() * (1 + 2**-6), ref, bound, why="t")


def test_memory_per_rank() -> None:
    mib = 2**20
    # per layer bf16: G_local x 1024 x 4096 x 2 B
    assert [op.wo_a_bytes(tp)["bf16_per_layer"] // mib for tp in (2, 4, 8)] == [32, 16, 8]
    assert op.wo_a_bytes(8)["layers"] == 43
    assert op.wo_a_bytes(8)["bf16_total"] == 43 * 8 * mib


def test_bad_scale_shape_is_one_line_error() -> None:
    w, s = fp8_weight("bad", 1, 256)
    with pytest.raises(ValueError, match="does not tile"):
        op.dequant_block_fp8(w, s[:, :1].repeat(1, 3))
