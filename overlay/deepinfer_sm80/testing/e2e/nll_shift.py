"""A prompt's NLL shift between two sets of logit rows, split into what noise predicts and what it does not.

For one position with reference logits x (the oracle), other logits y (the engine, or the oracle in a
noise mode), d = y - x, reference distribution p = softmax(x) and label l, the NLL shift
    o = NLL_y(l) - NLL_x(l) = [lse(y) - lse(x)] - d_l
is, exactly, the sum of three terms (S: the labels' support, E_S the plain mean over it):
    c = lse(y) - lse(x) - E_p[d]  = KL(p || softmax(y)) >= 0   curvature
    f = E_p[d] - E_S[d]                                        first order
    g = E_S[d] - d_l                                           label lottery
All three are invariant to a per-row constant in d (log-softmax is). For d independent of the row and
of the label, E[f] = E[g] = 0 and E[o] = E[c] ~ 1/2 Var_p(d) (the second-order term 1/2 d^T H d with
H = diag(p) - p p^T): any such noise raises the mean NLL, by an amount set by its variance under p.
A systematic error does not hide in c: a logit scale y = a x moves f by (a - 1)(E_p[x] - E_S[x]) on
every position, with one sign. With a label drawn uniformly from S independently of the row, g has
mean zero whatever d is; c + f is the shift averaged over that lottery, known per position without it.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from deepinfer_sm80.testing.e2e.compare import shift_stats


def decompose(
    x: torch.Tensor, y: torch.Tensor, labels: torch.Tensor, support: tuple[int, int] | None = None
) -> dict[str, torch.Tensor]:
    """x, y: [N, V] logits; labels: [N] ids; support: the labels' range [lo, hi) (None: the vocabulary).
    Per position (float64 [N]): observed o, curvature c, its quadratic approximation q2 = 1/2 Var_p(d),
    first order f, label term g, and the per-row least-squares scale a (y - mean y ~ a (x - mean x))."""
    if x.shape != y.shape or x.dim() != 2 or labels.shape != (x.shape[0],):
        raise ValueError(f"decompose: x {tuple(x.shape)}, y {tuple(y.shape)}, labels {tuple(labels.shape)}")
    if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
        raise ValueError("decompose: a logit row holds a non-finite value")
    x, y = x.double(), y.double()
    lo, hi = support or (0, x.shape[1])
    if not (0 <= lo < hi <= x.shape[1]) or int(labels.min()) < lo or int(labels.max()) >= hi:
        raise ValueError(
            f"decompose: labels {int(labels.min())}..{int(labels.max())} outside support [{lo}, {hi})"
        )
    d = y - x
    logp = torch.log_softmax(x, dim=-1)
    p = logp.exp()
    lse_x, lse_y = torch.logsumexp(x, dim=-1), torch.logsumexp(y, dim=-1)
    ep = (p * d).sum(-1)
    es = d[:, lo:hi].mean(-1)
    d_l = d.gather(1, labels[:, None].long()).squeeze(1)
    xc, yc = x - x.mean(-1, keepdim=True), y - y.mean(-1, keepdim=True)
    return {
        "observed": (lse_y - lse_x) - d_l,
        "curvature": lse_y - lse_x - ep,
        "quadratic": 0.5 * (p * (d - ep[:, None]) ** 2).sum(-1),
        "first_order": ep - es,
        "label": es - d_l,
        "scale": (xc * yc).sum(-1) / (xc * xc).sum(-1),
        "offset": d.mean(-1),  # the per-row constant (no effect on any log-softmax)
        # what a pure scale (the row's a) would put into f: (a - 1)(E_p[x] - E_S[x])
        "peak_height": (p * x).sum(-1) - x[:, lo:hi].mean(-1),
        "sd_vocab": (d - d.mean(-1, keepdim=True)).pow(2).mean(-1).sqrt(),
        "sd_p": (p * (d - ep[:, None]) ** 2).sum(-1).sqrt(),
    }


def _stats(v: torch.Tensor) -> dict[str, float | None]:
    return shift_stats([float(a) for a in v])


def summarize(parts: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Per prompt: mean / SD / SE / z of each term over positions, the shift the noise predicts (mean c)
    next to the observed one, the residual o - c (zero mean when the difference is noise independent
    of the row), and the logit scale."""
    n = int(parts["observed"].numel())
    out: dict[str, Any] = {"positions": n}
    for key in ("observed", "curvature", "quadratic", "first_order", "label"):
        out[key] = _stats(parts[key])
    resid = parts["observed"] - parts["curvature"]
    out["residual"] = _stats(resid)  # f + g
    out["label_averaged"] = _stats(parts["curvature"] + parts["first_order"])  # c + f
    scale = parts["scale"]
    out["scale"] = _stats(scale - 1.0) | {"mean_scale": float(scale.mean())}
    # the scale that would put the whole mean first-order term into a logit scale
    height = float(parts["peak_height"].mean())
    out["peak_height_mean"] = height
    fo = out["first_order"]["mean"]
    out["scale_for_first_order"] = 1.0 + fo / height if fo is not None and height else None
    out["sd_vocab_mean"] = float(parts["sd_vocab"].mean())
    out["sd_p_mean"] = float(parts["sd_p"].mean())
    out["predicted_shift"] = out["curvature"]["mean"]
    out["observed_shift"] = out["observed"]["mean"]
    return out


def across(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Independent prompts' summaries -> the spread of their per-prompt means: mean / SD / SE / z over
    prompts of the observed, predicted (curvature), first-order and residual means, and the SD over
    prompts of each prompt's own residual z (1 when the per-position SE is honest: positions of one
    prompt share their hidden states, so it can be larger)."""
    out: dict[str, Any] = {"prompts": len(summaries)}
    for key in ("observed", "curvature", "first_order", "residual"):
        out[key] = shift_stats([float(s[key]["mean"]) for s in summaries])
    zs = [float(s["residual"]["z"]) for s in summaries if finite(s["residual"]["z"])]
    out["residual_z_sd"] = shift_stats(zs)["sd"]
    out["scale"] = shift_stats([float(s["scale"]["mean_scale"]) - 1.0 for s in summaries])
    out["predicted_shift"] = out["curvature"]["mean"]
    out["observed_shift"] = out["observed"]["mean"]
    return out


def gaussian_prediction(x: torch.Tensor, sd: float) -> float:
    """E[c] to second order for i.i.d. N(0, sd^2) logit noise on rows x: 1/2 sd^2 (1 - sum p^2), averaged."""
    p = torch.softmax(x.double(), dim=-1)
    return float((0.5 * sd * sd * (1.0 - (p * p).sum(-1))).mean())


def finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)
