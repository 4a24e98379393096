"""The spec of one mHC boundary in PyTorch: post-map, projection, gates, Sinkhorn, collapse, RMSNorm.

Math runs in `dtype` (float32 by default; float64 to check the float32 spec against); the bf16
boundaries are where the kernels store bf16: R', the collapse y, the normalised layer input and
the stream mean. docs/MHC.md writes the formulas out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

HC_MULT = 4
MIX_SLOTS = HC_MULT * (HC_MULT + 2)  # 4 pre + 4 post + 16 comb


@dataclass(frozen=True)
class MixParams:
    """The scalars of one boundary (V4.1: rms_eps = norm_eps = 1e-20, hc_eps 1e-6, alpha 2, 20 iterations)."""

    rms_eps: float
    hc_pre_eps: float
    hc_sinkhorn_eps: float
    hc_post_mult_value: float
    sinkhorn_repeat: int
    norm_eps: float


def _bf16(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.to(torch.bfloat16).to(dtype)


def post_map(
    x: torch.Tensor,
    residual: torch.Tensor,
    post: torch.Tensor,
    comb: torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """R'[j] = post[j]*x + sum_k comb[k,j]*R[k], k in order, in `dtype`; returned unrounded.

    Args: x [T, H] bf16, residual [T, 4, H] bf16, post [T, 4] or [T, 4, 1], comb [T, 4, 4] fp32.
    """
    num_tokens, hc, _ = residual.shape
    r = residual.to(dtype)  # [T, 4, H]
    p = post.reshape(num_tokens, hc, 1).to(dtype)  # [T, 4, 1]
    c = comb.to(dtype)  # [T, 4(k), 4(j)]
    out = p * x.to(dtype).unsqueeze(1)  # [T, 4, H]
    for k in range(hc):
        out = out + c[:, k, :].unsqueeze(-1) * r[:, k : k + 1, :]
    return out


def sinkhorn(logits: torch.Tensor, eps: float, repeat: int) -> torch.Tensor:
    """softmax over rows + eps, columns normalised, then (repeat-1) x (rows, columns); [T, 4, 4]."""
    c = torch.softmax(logits, dim=-1) + eps
    c = c / (c.sum(dim=-2, keepdim=True) + eps)
    for _ in range(repeat - 1):
        c = c / (c.sum(dim=-1, keepdim=True) + eps)
        c = c / (c.sum(dim=-2, keepdim=True) + eps)
    return c


def gates(
    mixes: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor, p: MixParams
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(next pre-mix [T,4], post [T,4], comb [T,4,4]) from RMS-scaled projections mixes [T, 24]."""
    hc = HC_MULT
    s, b = hc_scale.to(mixes.dtype), hc_base.to(mixes.dtype)
    pre = torch.sigmoid(mixes[:, :hc] * s[0] + b[:hc]) + p.hc_pre_eps
    post = torch.sigmoid(mixes[:, hc : 2 * hc] * s[1] + b[hc : 2 * hc]) * p.hc_post_mult_value
    logits = mixes[:, 2 * hc :].reshape(-1, hc, hc) * s[2] + b[2 * hc :].reshape(1, hc, hc)
    return pre, post, sinkhorn(logits, p.hc_sinkhorn_eps, p.sinkhorn_repeat)


@dataclass(frozen=True)
class BoundaryOut:
    residual: torch.Tensor  # [T, 4, H] bf16: R' (the input residual when there is no post)
    post: torch.Tensor  # [T, 4] (dtype)
    comb: torch.Tensor  # [T, 4, 4]
    layer_input: torch.Tensor  # [T, H] bf16, RMS-normalised when a norm weight is given
    pre_mix: torch.Tensor  # [T, 4]: the pre-mix the next sublayer collapses with
    aux: torch.Tensor | None  # [T, H] bf16 stream mean of R'


def boundary(
    residual: torch.Tensor,
    fn: torch.Tensor,
    hc_scale: torch.Tensor,
    hc_base: torch.Tensor,
    p: MixParams,
    *,
    x: torch.Tensor | None = None,
    post: torch.Tensor | None = None,
    comb: torch.Tensor | None = None,
    pre_mix: torch.Tensor | None = None,
    gemm_input: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    capture_aux: bool = False,
    dtype: torch.dtype = torch.float32,
) -> BoundaryOut:
    """One boundary. With x/post/comb: post-map first (fused post + pre); without: pre only.

    The projection and its RMS read `gemm_input` [T, K] when given (the first layer's embedding
    against fn_broadcast [24, H]), else the bf16 streams flattened [T, 4H] against fn [24, 4H].
    The collapse uses `pre_mix` (the previous sublayer's) or stream 0 when it is None.
    """
    num_tokens, hc, hidden = residual.shape
    if post is not None:
        assert x is not None and comb is not None
        streams = post_map(x, residual, post, comb, dtype).to(torch.bfloat16)  # [T, 4, H] bf16
    else:
        streams = residual
    rs = streams.to(dtype)  # [T, 4, H]
    proj_in = (gemm_input if gemm_input is not None else streams.reshape(num_tokens, hc * hidden)).to(dtype)
    sumsq = proj_in.square().sum(dim=-1, keepdim=True)  # [T, 1]
    rms = torch.rsqrt(sumsq / proj_in.shape[1] + p.rms_eps)
    mixes = (proj_in @ fn.to(dtype).t()) * rms  # [T, 24]
    next_pre, new_post, new_comb = gates(mixes, hc_scale, hc_base, p)
    if pre_mix is None:
        y = rs[:, 0]  # stream 0 selected: exactly 1*R[0] + 0*R[1..3]
    else:
        pm = pre_mix.to(dtype)
        y = pm[:, 0:1] * rs[:, 0]
        for j in range(1, hc):
            y = y + pm[:, j : j + 1] * rs[:, j]
    y = _bf16(y, dtype)  # [T, H]
    if norm_weight is not None:
        rnorm = torch.rsqrt(y.square().sum(dim=-1, keepdim=True) / hidden + p.norm_eps)
        layer_input = ((y * rnorm) * norm_weight.to(dtype)).to(torch.bfloat16)
    else:
        layer_input = y.to(torch.bfloat16)
    aux = (rs.sum(dim=1) / hc).to(torch.bfloat16) if capture_aux else None
    return BoundaryOut(streams, new_post, new_comb, layer_input, next_pre, aux)


def collapse(
    residual: torch.Tensor, pre_mix: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The final collapse: bf16(sum_j pre[j] * R[j]), j in order; [T, 4, H] -> [T, H]."""
    r, pm = residual.to(dtype), pre_mix.to(dtype)
    y = pm[:, 0:1] * r[:, 0]
    for j in range(1, r.shape[1]):
        y = y + pm[:, j : j + 1] * r[:, j]
    return y.to(torch.bfloat16)
