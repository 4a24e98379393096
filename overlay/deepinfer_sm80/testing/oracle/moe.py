"""The V4.1 MoE sublayer: sqrt-softplus routing with a selection bias, MXFP4 experts, one shared expert.

Router logits `x . gate` in fp32; weights `sqrt(softplus(logit))`; the top-k experts by weight + bias
(`gate.bias`, the noaux_tc correction: it steers the choice only); the chosen weights renormalised to
sum 1 and times `routed_scaling_factor`. Each expert (and the shared one) is a clamped SwiGLU:
`w2(silu(min(w1 x, L)) * clamp(w3 x, -L, L))` with L = swiglu_limit, bf16 at each GEMM output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .checkpoint import Checkpoint, linear
from .quant import bf16


def route(
    logits: torch.Tensor, bias: torch.Tensor, k: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 router logits [T, E] -> (weights [T, k], expert ids [T, k])."""
    w = torch.sqrt(F.softplus(logits))
    ids = (w + bias).topk(k, dim=-1).indices
    chosen = w.gather(1, ids)
    return chosen / chosen.sum(dim=-1, keepdim=True) * scale, ids


def swiglu(
    x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor, limit: float
) -> torch.Tensor:
    g, u = linear(x, w1), linear(x, w3)
    g, u = g.clamp(max=limit), u.clamp(-limit, limit)
    return linear(bf16(F.silu(g) * u), w2)


class MoE:
    def __init__(self, ck: Checkpoint, name: str, backbone: bool) -> None:
        t = ck.text
        self.ck, self.f = ck, f"{name}.ffn"
        self.n = (
            t["n_routed_experts"] if backbone else (t.get("dspark_n_routed_experts") or t["n_routed_experts"])
        )
        self.k = (
            t["num_experts_per_tok"]
            if backbone
            else (t.get("dspark_num_experts_per_tok") or t["num_experts_per_tok"])
        )
        self.scale, self.limit = float(t["routed_scaling_factor"]), float(t["swiglu_limit"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ck, f = self.ck, self.f
        logits = linear(x, ck.dense(f"{f}.gate"), round_out=False)
        weights, ids = route(logits, ck.vec(f"{f}.gate.bias"), self.k, self.scale)
        out = torch.zeros_like(x)
        for e in range(self.n):
            rows, slot = (ids == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            p = f"{f}.experts.{e}"
            y = swiglu(x[rows], ck.expert(f"{p}.w1"), ck.expert(f"{p}.w3"), ck.expert(f"{p}.w2"), self.limit)
            out[rows] += y * weights[rows, slot][:, None]  # a token picks an expert at most once
        s = f"{f}.shared_experts"
        shared = swiglu(x, ck.dense(f"{s}.w1"), ck.dense(f"{s}.w3"), ck.dense(f"{s}.w2"), self.limit)
        return bf16(bf16(out) + shared)
