"""Cases of wo_a on SM8x (ops/o_proj.py): the block-scaled fp8 weights its test dequantizes, the grouped
bmm's activations at V4.1's TP8 and TP4 group counts, and the comparison with upstream's own bf16
dequant (`_get_cached_wo_a_bf16`, vllm/v1/attention/ops/rocm_aiter_mla_sparse.py).

Equality contracts: the dequant is bitwise (an e4m3 value times a power-of-two scale is exact in fp32, then
one rounding to bf16, as upstream's branch does); the bmm is within one bf16 rounding of the fp32 sum plus
the fp32 accumulation bound K·2^-24·Σ|a·w| (2^-24: fp32's unit roundoff, eps/2) of the fp32 einsum, since
torch's bf16 bmm sums in an order of its own. The whole o_proj front vs upstream's bf16 branch
(tests/integration/test_o_proj_upstream.py; its inputs, upstream's call and the bound are `front_*`
below): the rotations within one bf16 ulp of each other, the outputs within `front_bound`. The row is a
load-time hook, so it has no ENTRY_POINT_CASES.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import torch

from deepinfer_sm80.testing.inputs import generator
from deepinfer_sm80.testing.shapes import V41

R, HPG, D = V41.o_lora, V41.heads_per_o_group, V41.head_dim
BLOCK = 128  # the FP8 checkpoints' 128x128 weight-scale blocks


@dataclass(frozen=True)
class Weight:
    name: str  # the seed
    groups: int
    k: int  # input width: HPG * D = 4096 in the model


DEQUANT = Weight("dequant", 1, 2 * BLOCK)  # one group, two scale columns: small enough for upstream's copy
BAD = Weight("bad", 1, 2 * BLOCK)  # whose scale is made not to tile it
BMM_TP = (8, 4)  # V41.per_rank(tp).o_groups: 1 and 2 groups
BMM_TOKENS = 5
BMM_SCALE = 2.0**10  # lifts the weights to ~N(0, 1) size
BMM_WHY = "one bf16 rounding of the fp32 sum + fp32 accumulation order, K = 4096 (K·2^-24·Σ|a·w|)"


def fp8_weight(case: Weight, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """[G * R, k] e4m3 with every code but NaN, and [G * R / 128, k / 128] fp32 power-of-two scales."""
    gen = generator(case.name)
    codes = torch.randint(0, 256, (case.groups * R, case.k), dtype=torch.uint8, generator=gen)
    codes[(codes & 0x7F) == 0x7F] = 0x3C
    blocks = (case.groups * R // BLOCK, case.k // BLOCK)
    scale = torch.exp2(torch.randint(-20, 4, blocks, generator=gen).float())
    return codes.view(torch.float8_e4m3fn).to(device), scale.to(device)


def bmm_inputs(tp: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """o [T, G * HPG, D] bf16 ~N(0, 1), wo_a [G * R, HPG * D] bf16 dequantized, G = this rank's groups."""
    from deepinfer_sm80.ops import o_proj as op

    groups = V41.per_rank(tp).o_groups
    o = torch.randn(BMM_TOKENS, groups * HPG, D, generator=generator(f"bmm-tp{tp}")).bfloat16()
    w, s = fp8_weight(Weight(f"bmm-w-tp{tp}", groups, HPG * D))
    return o, op.dequant_block_fp8(w, s * BMM_SCALE), groups


def bmm_bound(o: torch.Tensor, wo_a: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp32 reference [T, G, R] and each output's bound: bf16 ulp + K·2^-24·Σ|a·w| (BMM_WHY)."""
    from deepinfer_sm80.ops import o_proj as op
    from deepinfer_sm80.testing.compare import bf16_ulp

    ref = op.wo_a_ref(o, wo_a, groups)
    mag = op.wo_a_ref(o.abs(), wo_a.abs(), groups)  # Σ|a·w| per output
    return ref, bf16_ulp(ref) + HPG * D * 2.0**-24 * mag


def upstream_dequant(rms: Any, weight: torch.Tensor, scale: torch.Tensor, groups: int) -> torch.Tensor:
    """Upstream's `_get_cached_wo_a_bf16` (module `rms`) on a layer holding `weight` / `scale`: [G, R, k]."""
    layer = types.SimpleNamespace(weight=weight, weight_scale_inv=scale)
    return rms._get_cached_wo_a_bf16(layer, groups, R, weight.shape[1])


# ----------------------------------------------------------------------------- the front vs upstream
FRONT_TP = (8, 4)
FRONT_TOKENS = 7
FRONT_POSITIONS = 4096  # rows of the cos/sin cache
FRONT_WHY = "Σ|Δ·w| of the rotations + fp32 accumulation order over K = 4096, both sides + one bf16 rounding"


def front_inputs(tp: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(o [T, G * HPG, D] bf16, positions [T], cos_sin [4096, 64] fp32, wo_a [G * R, HPG * D] bf16 ~0.03,
    G) for this rank's groups, drawn on the CPU."""
    groups = V41.per_rank(tp).o_groups
    gen = generator(f"o-proj-front-tp{tp}")
    o = torch.randn(FRONT_TOKENS, groups * HPG, D, generator=gen).bfloat16().to(device)
    positions = torch.randint(0, FRONT_POSITIONS, (FRONT_TOKENS,), generator=gen).to(device)
    cos_sin = torch.randn(FRONT_POSITIONS, 64, generator=gen).to(device)
    wb = (torch.randn(groups * R, HPG * D, generator=gen) * 0.03).bfloat16().to(device)
    return o, positions, cos_sin, wb, groups


def upstream_front(
    oproj: Any, o: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, wb: torch.Tensor, groups: int
) -> torch.Tensor:
    """Upstream's `deep_gemm_fp8_o_proj` (module `oproj`) down its bf16 branch: [T, G * R]."""
    return oproj.deep_gemm_fp8_o_proj(
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


def upstream_rotation(
    oproj: Any, o: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, groups: int
) -> Any:
    """What upstream's bf16 branch multiplies: `fused_inv_rope_fp8_quant` with quantize=False, shaped as o."""
    rotated, _ = oproj.fused_inv_rope_fp8_quant(
        o.clone(), positions, cos_sin, n_groups=groups, heads_per_group=HPG, quantize=False
    )
    return rotated.reshape(o.shape)


def front_bound(
    ours_rot: torch.Tensor,
    theirs_rot: torch.Tensor,
    wb: torch.Tensor,
    ours: torch.Tensor,
    theirs: torch.Tensor,
    groups: int,
) -> torch.Tensor:
    """Per element: one bf16 ulp + the rotations' measured difference Δ carried exactly (Σ|Δ·w|) + the
    fp32 accumulation bound of both bmms (2·K·2^-24·Σ|a·w|)."""
    from deepinfer_sm80.ops import o_proj as op
    from deepinfer_sm80.testing.compare import bf16_ulp

    delta = (ours_rot.float() - theirs_rot.float()).abs()
    carried = op.wo_a_ref(delta, wb.abs(), groups).flatten(1)  # Σ|Δ·w|
    mag = op.wo_a_ref(ours_rot.abs(), wb.abs(), groups).flatten(1)  # Σ|a·w| per output, fp32
    k = HPG * D
    rounding = bf16_ulp(torch.maximum(ours.float().abs(), theirs.float().abs()))
    return rounding + carried + 2 * k * 2.0**-24 * mag
