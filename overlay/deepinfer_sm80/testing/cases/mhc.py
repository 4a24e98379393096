"""Cases of the mHC boundaries (rows `mhc_*`, ops/mhc/): random boundary inputs at V4.1-like magnitudes seeded
from the case name (crc32), the token counts and split configs the tests and bench/mhc.py run, the torch
spec call (`spec`) every kernel is held to, and the argument lists of the boundary functions, which are
upstream's own (vllm/model_executor/kernels/mhc/tilelang.py), so ours and theirs take the same call.

Equality contracts: fp32 outputs within TOL of the fp32 spec (WHY); bf16 outputs within one bf16 ulp, and
only a small fraction flipped (`bf16_close`); R' of the fused boundary and of post bitwise upstream's
(the same formula and order); vs upstream's fused path UPSTREAM_TOL (UPSTREAM_WHY)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from deepinfer_sm80.ops.mhc import splits
from deepinfer_sm80.ops.mhc.reference import HC_MULT, MIX_SLOTS, MixParams, boundary, sinkhorn
from deepinfer_sm80.testing.inputs import generator
from deepinfer_sm80.testing.shapes import V41

V41_PARAMS = MixParams(
    rms_eps=1e-20,
    hc_pre_eps=1e-6,
    hc_sinkhorn_eps=1e-6,
    hc_post_mult_value=2.0,
    sinkhorn_repeat=20,
    norm_eps=1e-20,
)
SCALARS = (
    V41_PARAMS.rms_eps,
    V41_PARAMS.hc_pre_eps,
    V41_PARAMS.hc_sinkhorn_eps,
    V41_PARAMS.hc_post_mult_value,
    V41_PARAMS.sinkhorn_repeat,
)  # the positional scalars after hc_base in upstream's boundary functions

HIDDEN = V41.hidden
SMALL_H = 1024  # CPU reference cases: the boundary is per token, so a short row exercises every step
SINKHORN_TOKENS = (1, 7, 1000)
OTHER_HIDDEN = (4096, 7168)  # other DeepSeek hidden sizes the split selector must align for
SM_COUNTS = (82, 84, 108, 132)  # RTX 3090, RTX A6000, A100/A800, H200
SELECTOR_TOKENS = (*range(1, 70), 127, 128, 1023, 1024, 1536, 4096)
TC_TOKENS = (splits.TC_MIN_TOKENS, 1000, 1536, 8192)

# GPU cases at HIDDEN (named gpu-<what>-T<tokens>)
GPU_TOKENS = (1, 5, 16, 33, 128, 1536)  # 128 and 1536: the tensor-core partials (fused variants)
VARIANTS = ("fused", "fused-aux", "first", "pre", "no-norm")
SMALL_T_TOKENS = (1, 7)
SMALL_T_CONFIGS = (  # the single-warp config of the first H200 run and the grouped ones the selector uses now
    splits.PartialsConfig(1, 32, 40, 4),
    splits.PartialsConfig(1, 128, 40, 4, n_groups=4),
    splits.PartialsConfig(2, 128, 20, 4, n_groups=4),
    splits.PartialsConfig(4, 128, 20, 2, n_groups=2),
)
PATH_TOKENS = (130, 1536)  # the selector picks tensor cores here; the CUDA-core partials must agree
POST_TOKENS = (1, 33, 1536)
UPSTREAM_TOKENS = (1, 6, 12, 16, 32, 33, 64, 1536)
UPSTREAM_FIRST_TOKENS = 8
UPSTREAM_POST_TOKENS = 40

TOL = dict(abs=2e-5, rel_in_eps=2**10)  # fp32: sum order over 20480 terms + rsqrtf/expf approximations
WHY = "split-h partial sums in another order; rsqrtf/expf vs torch's; 20 Sinkhorn divisions"
# upstream's fused path (T <= 32) projects fp32 R', ours the stored bf16 R' (as its T > 32 path)
UPSTREAM_TOL = dict(abs=5e-5, rel_in_eps=2**12)
UPSTREAM_WHY = "fp32 vs bf16 R' in the projection at T <= 32; split order; approximate rsqrt/exp"


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


# ----------------------------------------------------------------------------- the spec and the calls
def spec(
    inp: BoundaryInputs,
    *,
    fused: bool,
    first: bool = False,
    pre: bool = True,
    norm: bool = True,
    aux: bool = False,
    dtype: torch.dtype = torch.float32,
) -> Any:
    """The torch spec (ops/mhc/reference.py `boundary`) of one boundary: fused (post of the previous
    sublayer + pre) or pre alone; `first`: the first layer's pre, on the embedding repeated 4 times."""
    return boundary(
        inp.residual if not first else inp.x.unsqueeze(1).expand(-1, 4, -1).contiguous(),
        inp.fn if not first else inp.fn_broadcast,
        inp.hc_scale,
        inp.hc_base,
        V41_PARAMS,
        x=inp.x if fused else None,
        post=inp.post if fused else None,
        comb=inp.comb if fused else None,
        pre_mix=inp.pre_mix if pre and not first else None,
        gemm_input=inp.x if first else None,
        norm_weight=inp.norm_weight if norm else None,
        capture_aux=aux,
        dtype=dtype,
    )


def fused_args(inp: BoundaryInputs) -> tuple[Any, ...]:
    """The positional arguments of `mhc_fused_post_pre_delayed_tilelang` (after a config, of ours
    `fused_post_pre_with_config`)."""
    return (
        inp.x,
        inp.residual,
        inp.post.unsqueeze(-1),
        inp.comb,
        inp.fn,
        inp.hc_scale,
        inp.hc_base,
        *SCALARS,
    )


def fused_kw(inp: BoundaryInputs, *, norm: bool = True) -> dict[str, Any]:
    return dict(
        pre_mix=inp.pre_mix, norm_weight=inp.norm_weight if norm else None, norm_eps=V41_PARAMS.norm_eps
    )


def pre_call(
    inp: BoundaryInputs, *, first: bool, norm: bool = True, residual: torch.Tensor | None = None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) of `mhc_pre_delayed_tilelang`: a later layer's pre (the carried pre_mix), or the
    first layer's (`residual`: the embedding repeated 4 times, built here unless given)."""
    if first and residual is None:
        residual = inp.x.unsqueeze(1).expand(-1, 4, -1).contiguous()
    args = (
        residual if first else inp.residual,
        inp.fn_broadcast if first else inp.fn,
        inp.hc_scale,
        inp.hc_base,
        *SCALARS,
    )
    kw = dict(
        pre_mix=None if first else inp.pre_mix,
        x=inp.x if first else None,
        norm_weight=inp.norm_weight if norm else None,
        norm_eps=V41_PARAMS.norm_eps,
    )
    return args, kw


def post_args(inp: BoundaryInputs) -> tuple[Any, ...]:
    """The arguments of `mhc_post_tilelang` (the last layer's post)."""
    return (inp.x, inp.residual, inp.post.unsqueeze(-1), inp.comb)


def bf16_close(name: str, out: torch.Tensor, want: torch.Tensor, frac: float = 2e-3) -> None:
    """bf16 outputs: equal bytes but for one-ulp roundings where the fp32 inputs differed in the last bits.

    One ulp is counted on the bf16 bit patterns (the neighbouring value), not as a relative bound: the
    earlier `2**17·eps_fp32·|ref|` was 2^-6 relative, two to four bf16 ulps, under a "one ulp" label.
    """
    from deepinfer_sm80.testing.compare import assert_within_ulps

    assert_within_ulps(name, out, want, ulps=1, abs=1e-6, why="one bf16 ulp: last-bit rounding flips")
    differ = (out != want).float().mean().item()
    assert differ < frac, f"{name}: {differ:.2%} of bf16 values differ"
