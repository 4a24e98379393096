"""mHC hyper-connections: 4 residual streams mixed at every sublayer boundary (docs/MHC.md).

A boundary turns the previous sublayer's output x and the streams R into new streams
`R'[j] = post[j] * x + sum_i comb[i, j] * R[i]` (stored bf16), projects R' to 24 mixes
(`fn`, scaled by the RMS of R'), and from them gates for the *next* boundary:
`pre = sigmoid(.) + eps`, `post = 2 * sigmoid(.)` and a Sinkhorn-normalised 4 x 4 `comb`. The next
sublayer's input collapses R' with the pre-mix computed at the previous boundary ("delayed"):
`y = bf16(sum_j pm_in[j] * R'[j])`, then RMSNorm with the sublayer's weight. The model's first
boundary sees the embedding as 4 equal streams and selects stream 0 (y = the embedding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .quant import bf16

POST_ALPHA = 2.0  # hard-coded upstream (hc_post_alpha)


@dataclass(frozen=True)
class HcParams:
    fn: torch.Tensor  # fp32 [24, 4H]
    scale: torch.Tensor  # fp32 [3]
    base: torch.Tensor  # fp32 [24]


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """[T, n, n] -> row softmax + eps, then column / row normalisations (iters - 1 full rounds after
    the first column step): columns sum to 1 up to eps, rows nearly (a 20-step Sinkhorn)."""
    c = torch.softmax(logits, dim=-1) + eps
    c = c / (c.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(dim=-1, keepdim=True) + eps)
        c = c / (c.sum(dim=-2, keepdim=True) + eps)
    return c


def gates(mixes: torch.Tensor, p: HcParams, hc: int, iters: int, eps: float) -> tuple[torch.Tensor, ...]:
    """Normalised mixes [T, 24] -> pre [T, hc], post [T, hc], comb [T, hc, hc]."""
    pre = torch.sigmoid(mixes[:, :hc] * p.scale[0] + p.base[:hc]) + eps
    post = torch.sigmoid(mixes[:, hc : 2 * hc] * p.scale[1] + p.base[hc : 2 * hc]) * POST_ALPHA
    logits = mixes[:, 2 * hc :].reshape(-1, hc, hc) * p.scale[2] + p.base[2 * hc :].reshape(1, hc, hc)
    return pre, post, sinkhorn(logits, iters, eps)


def project(r: torch.Tensor, fn: torch.Tensor, rms_eps: float) -> torch.Tensor:
    """Streams (or the embedding) flattened [T, K] -> mixes [T, 24] scaled by rsqrt(mean square + eps)."""
    flat = r.reshape(r.shape[0], -1)
    return (flat @ fn.T) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + rms_eps)


def post_map(x: torch.Tensor, r: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """x [T, H], R [T, hc, H], post [T, hc], comb [T, hc, hc] -> bf16-rounded R' [T, hc, H]."""
    return bf16(torch.einsum("tij,tih->tjh", comb, r) + post[..., None] * x[:, None, :])


def collapse(r: torch.Tensor, pm: torch.Tensor) -> torch.Tensor:
    """bf16(sum_j pm[j] * R[j]): [T, hc, H], [T, hc] -> [T, H]."""
    return bf16((pm[..., None] * r).sum(dim=1))


def rms_norm(y: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """bf16(y * rsqrt(mean(y^2) + eps) * w) over the last dim (every RMSNorm of the model)."""
    return bf16(y * torch.rsqrt(y.square().mean(-1, keepdim=True) + eps) * w)


def boundary(
    r: torch.Tensor, p: HcParams, pm_in: torch.Tensor | None, cfg: dict
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Streams R' (already post-mapped, bf16) -> (post, comb, unnormalised input y, pre for the next one).

    pm_in None selects stream 0 (the first boundary of the model and of the DSpark stack)."""
    hc, iters, eps = cfg["hc_mult"], cfg["hc_sinkhorn_iters"], cfg["hc_eps"]
    pre, post, comb = gates(project(r, p.fn, cfg["rms_norm_eps"]), p, hc, iters, eps)
    y = r[:, 0] if pm_in is None else collapse(r, pm_in)
    return post, comb, y, pre


def first_boundary(
    x: torch.Tensor, p: HcParams, cfg: dict
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The embedding x [T, H] as 4 equal streams: the mixes project x with the 4 column slices of fn
    summed (`fn_broadcast`, RMS over H), the input is x itself. Returns (R, post, comb, y, pre)."""
    hc = cfg["hc_mult"]
    fn_b = p.fn.reshape(p.fn.shape[0], hc, -1).sum(dim=1)
    pre, post, comb = gates(
        project(x, fn_b, cfg["rms_norm_eps"]), p, hc, cfg["hc_sinkhorn_iters"], cfg["hc_eps"]
    )
    return x[:, None, :].expand(-1, hc, -1).contiguous(), post, comb, x, pre
