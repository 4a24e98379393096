"""The lightning indexer of V4.1 (docs/INDEXER.md) with the engine's fp8 Q / K, and the top-k it feeds.

- K (kv sources only): `wk(latent)` of each compressed state, RMSNorm (bf16), RoPE on dims 64.. at the
  group start (bf16), one power-of-two scale per state: e4m3 codes times 2^e (`quant.pow2_quant`).
- Q: `wq_b(qr)` [T, 32, 128] (bf16), RoPE at the token's position (bf16), per (token, head) scale
  `s = 2^ceil(log2(max(amax, 1e-4) / 448))`, `q8 = e4m3(q / s)`; s is folded into the head weights
  `w' = weights_proj(x) * s * 128^-0.5 * 32^-0.5`.
- score of state n for token t: `sum_h w'[t, h] * relu(q8[t, h] . k[n])` (fp32).
- selection: a token at position p sees n = (p + 1) // ratio states; all of them when n <= index_topk
  (attention.py's short-context fill and the top-k agree there), else the top index_topk scores.
  The candidate source (candidate_source_layer_id) keeps, per token, the best `candidate_topk_blocks`
  blocks of `candidate_block_size` states (block score = max over its visible states, the block of the
  newest state pinned); later index sources score only states inside those blocks.
"""

from __future__ import annotations

import torch

from .checkpoint import Checkpoint, linear
from .mhc import rms_norm
from .quant import bf16, ceil_log2, e4m3_encode, pow2_quant
from .rope import rotate

CANDIDATES = -1  # key of the candidate-block mask in the picks dict


def quantize_q(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 q [T, H, D] -> (e4m3 values q / s, s [T, H]): s = 2^ceil(log2(max(amax, 1e-4) / 448))."""
    amax = q.abs().amax(dim=-1).clamp_min(1e-4)
    s = torch.exp2(ceil_log2(amax / 448.0))
    return e4m3_encode(q / s[..., None]), s


def scores(q8: torch.Tensor, w: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q8 [T, H, D], folded weights [T, H], keys as read [N, D] -> fp32 [T, N]."""
    return torch.einsum("th,thn->tn", w, torch.relu(torch.einsum("thd,nd->thn", q8, k)))


def block_mask(s: torch.Tensor, visible: torch.Tensor, n_blocks: int, block: int) -> torch.Tensor:
    """Candidate blocks as a state mask [T, N]: per row the top n_blocks blocks by max visible score,
    the block holding the row's newest visible state pinned (+inf)."""
    t_, n = s.shape
    nb = -(-n // block)
    pad = nb * block - n
    sv = torch.nn.functional.pad(s.masked_fill(~visible, float("-inf")), (0, pad), value=float("-inf"))
    bs = sv.reshape(t_, nb, block).amax(dim=-1)  # [T, nb]
    newest = visible.sum(dim=1) - 1  # index of the newest visible state (-1: none)
    rows = torch.arange(t_)
    has = newest >= 0
    bs[rows[has], newest[has] // block] = float("inf")
    keep = torch.zeros(t_, nb, dtype=torch.bool)
    top = bs.topk(min(n_blocks, nb), dim=-1)
    keep.scatter_(1, top.indices, top.values > float("-inf"))
    return keep.repeat_interleave(block, dim=1)[:, :n] & visible


def topk_mask(s: torch.Tensor, allowed: torch.Tensor, k: int) -> torch.Tensor:
    """The k best allowed states per row (all allowed ones when there are at most k)."""
    out = allowed.clone()
    many = allowed.sum(dim=1) > k
    if many.any():
        sub = s[many].masked_fill(~allowed[many], float("-inf"))
        top = sub.topk(k, dim=-1).indices
        m = torch.zeros_like(sub, dtype=torch.bool).scatter_(1, top, True)
        out[many] = m & allowed[many]
    return out


class Indexer:
    def __init__(self, ck: Checkpoint, attn: str, layer: int, ratio: int, table: torch.Tensor) -> None:
        t = ck.text
        self.ck, self.p, self.layer, self.ratio, self.table = ck, f"{attn}.indexer", layer, ratio, table
        self.heads, self.dim, self.topk = t["index_n_heads"], t["index_head_dim"], t["index_topk"]
        self.eps = t["rms_norm_eps"]
        self.cand_src = t.get("candidate_source_layer_id", -1)
        self.cand_blocks, self.cand_size = t.get("candidate_topk_blocks", 0), t.get("candidate_block_size", 0)

    def keys(self, latent: torch.Tensor) -> torch.Tensor:
        """bf16 latents [N, 512] of this kv source -> indexer keys as read [N, 128]."""
        k = linear(latent, self.ck.dense(f"{self.p}.wk"))
        k = rms_norm(k, self.ck.vec(f"{self.p}.k_norm.weight"), self.eps)
        k = bf16(rotate(k, self.table, torch.arange(k.shape[0]) * self.ratio))
        return pow2_quant(k, self.dim)

    def select(
        self,
        qr: torch.Tensor,
        x: torch.Tensor,
        pos: torch.Tensor,
        k: torch.Tensor | None,
        picks: dict[int, torch.Tensor],
    ) -> torch.Tensor:
        """Which compressed states each token reads: bool [T, N]."""
        assert k is not None, f"layer {self.layer}: its kv source published no indexer keys"
        n = k.shape[0]
        visible = torch.arange(n)[None, :] < ((pos + 1) // self.ratio)[:, None]
        q = bf16(
            rotate(
                linear(qr, self.ck.dense(f"{self.p}.wq_b")).reshape(-1, self.heads, self.dim), self.table, pos
            )
        )
        q8, s = quantize_q(q)
        w = linear(x, self.ck.dense(f"{self.p}.weights_proj")) * s * self.dim**-0.5 * self.heads**-0.5
        sc = scores(q8, w, k)
        allowed = visible
        if self.layer == self.cand_src and self.cand_blocks > 0:
            picks[CANDIDATES] = block_mask(sc, visible, self.cand_blocks, self.cand_size)
        elif 0 <= self.cand_src < self.layer and self.cand_blocks > 0 and CANDIDATES in picks:
            allowed = visible & picks[CANDIDATES][:, :n]
        # a row with at most topk visible states reads all of them (no candidate restriction applies:
        # the engine's short-context fill, and with candidate_topk_blocks * block_size > index_topk the
        # candidate blocks of such a row hold every state anyway)
        few = visible.sum(dim=1) <= self.topk
        allowed = torch.where(few[:, None], visible, allowed)
        return topk_mask(sc, allowed, self.topk)
