"""Random mHC boundary inputs at V4.1-like magnitudes, seeded from the case name (crc32)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer_sm80.ops.mhc.reference import HC_MULT, MIX_SLOTS, MixParams, sinkhorn
from deepinfer_sm80.testing.inputs import generator

V41_PARAMS = MixParams(
    rms_eps=1e-20,
    hc_pre_eps=1e-6,
    hc_sinkhorn_eps=1e-6,
    hc_post_mult_value=2.0,
    sinkhorn_repeat=20,
    norm_eps=1e-20,
)


@dataclass(frozen=True)
class BoundaryInputs:
    x: torch.Tensor  # [T, H] bf16 sublayer output (or the embedding at the first layer)
    residual: torch.Tensor  # [T, 4, H] bf16
    post: torch.Tensor  # [T, 4] fp32 in (0, 2)
    comb: torch.Tensor  # [T, 4, 4] fp32, doubly stochastic
    pre_mix: torch.Tensor  # [T, 4] fp32 in (0, 1)
    fn: torch.Tensor  # [24, 4H] fp32
    fn_broadcast: torch.Tensor  # [24, H] fp32: the 4 column slices of fn summed
    hc_scale: torch.Tensor  # [3] fp32
    hc_base: torch.Tensor  # [24] fp32
    norm_weight: torch.Tensor  # [H] bf16

    def to(self, device: str | torch.device) -> BoundaryInputs:
        return BoundaryInputs(**{k: v.to(device) for k, v in self.__dict__.items()})


def boundary_inputs(name: str, num_tokens: int, hidden: int, *, zero_rows: int = 0) -> BoundaryInputs:
    """fn ~ N(0, 1/4H) so the RMS-scaled projections are O(1); `zero_rows` leading tokens all zero."""
    gen = generator(name)
    hc = HC_MULT
    x = torch.randn(num_tokens, hidden, generator=gen)
    residual = torch.randn(num_tokens, hc, hidden, generator=gen)
    if zero_rows:
        x[:zero_rows] = 0
        residual[:zero_rows] = 0
    post = 2 * torch.sigmoid(torch.randn(num_tokens, hc, generator=gen))
    comb = sinkhorn(torch.randn(num_tokens, hc, hc, generator=gen), 1e-6, 20)
    pre_mix = torch.sigmoid(torch.randn(num_tokens, hc, generator=gen)) + 1e-6
    fn = torch.randn(MIX_SLOTS, hc * hidden, generator=gen) / (hc * hidden) ** 0.5
    hc_scale = 0.5 + torch.rand(3, generator=gen)
    hc_base = 0.5 * torch.randn(MIX_SLOTS, generator=gen)
    norm_weight = 1 + 0.1 * torch.randn(hidden, generator=gen)
    return BoundaryInputs(
        x=x.to(torch.bfloat16),
        residual=residual.to(torch.bfloat16),
        post=post,
        comb=comb,
        pre_mix=pre_mix,
        fn=fn,
        fn_broadcast=fn.view(MIX_SLOTS, hc, hidden).sum(dim=1),
        hc_scale=hc_scale,
        hc_base=hc_base,
        norm_weight=norm_weight.to(torch.bfloat16),
    )
