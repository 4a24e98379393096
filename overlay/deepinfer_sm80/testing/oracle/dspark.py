"""DSpark draft heads of V4.1: the MTP stages `mtp.0..2` over the target's aux streams, greedy drafts.

After the target has read positions 0..L-1 and picked its next token b (the anchor):
- context: `main_x = main_norm(main_proj(aux[l] for l in dspark_target_layer_ids))` per position; each
  stage writes `kv_norm(wkv(main_x))` (RoPE'd, fp8_ds_mla) into its own sliding-window cache;
- query block: ids [b, noise x (k - 1)] at positions L .. L+k-1, embedded, through the stages (each a
  ratio-0 decoder layer; their own kv lands in the same cache at the query positions). Attention is
  non-causal: every query reads positions max(L - 128, 0) .. L+k-1;
- head: post-map, collapse with the last FFN pre-mix, `mtp.{last}.norm`, the target's `head` -> base
  logits U_i (bf16);
- Markov chain: prev = b; for i < k: `logits = bf16(U_i + bf16(markov_head.head(markov_head.embed[prev])))`,
  `tok = argmax` (first maximum), prev = tok.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from . import mhc
from .attention import sparse_attention
from .block import Block, Trace
from .checkpoint import Checkpoint, linear
from .quant import bf16


class Target(Protocol):
    """What the drafter reads of the target (model.V41Oracle): its checkpoint and text config, the RoPE
    tables its stages share, the embedding, and one prefill's trace (logits, aux streams)."""

    ck: Checkpoint
    t: dict[str, Any]
    tables: dict[bool, torch.Tensor]
    embed: torch.Tensor

    def trace(self, token_ids: list[int] | torch.Tensor) -> Trace: ...


class Drafter:
    def __init__(self, o: Target) -> None:
        t = o.t
        self.o, self.t = o, t
        n = t["num_hidden_layers"]
        self.stages = [Block(o.ck, f"mtp.{s}", n + s, o.tables) for s in range(t["num_nextn_predict_layers"])]
        self.last = f"mtp.{len(self.stages) - 1}"
        self.noise = int(t["dspark_noise_token_id"])

    def _attention(
        self, blk: Block, x: torch.Tensor, qpos: torch.Tensor, main_x: torch.Tensor, ctx: torch.Tensor
    ) -> torch.Tensor:
        """A stage's attention: context keys from main_x, query keys from its own input, non-causal."""
        a = blk.attn
        _, kv_ctx = a.project(main_x)  # the kv half of wq_a | wkv over main_x
        ctx_keys = a.window_keys(kv_ctx, ctx)
        qr, kv_q = a.project(x)
        q = a.query(qr, qpos)
        keys = torch.cat([ctx_keys, a.window_keys(kv_q, qpos)])
        allowed = torch.ones(x.shape[0], keys.shape[0], dtype=torch.bool)
        return a.o_proj(sparse_attention(q, keys, allowed, a.sink, a.d**-0.5), qpos)

    def draft(self, ids: torch.Tensor, k: int) -> tuple[int, list[int]]:
        o, t, eps = self.o, self.t, self.t["rms_norm_eps"]
        tr = o.trace(ids)
        length = ids.numel()
        anchor = int(torch.argmax(tr.logits[-1]))
        aux = torch.cat([tr.aux[i] for i in t["dspark_target_layer_ids"]], dim=-1)
        main_x = mhc.rms_norm(
            linear(aux, o.ck.dense("mtp.0.main_proj")), o.ck.vec("mtp.0.main_norm.weight"), eps
        )
        start = max(length - t["sliding_window"], 0)
        ctx = torch.arange(start, length)
        main_x = main_x[start:]
        qids = torch.tensor([anchor] + [self.noise] * (k - 1))
        qpos = torch.arange(length, length + k)
        x = o.embed[qids]
        r = x[:, None, :].expand(-1, t["hc_mult"], -1).contiguous()
        post = comb = pm = None
        for i, blk in enumerate(self.stages):
            if i:
                r = mhc.post_map(x, r, post, comb)
            post, comb, y, pre = mhc.boundary(r, blk.hc["attn"], pm, t)
            x = self._attention(blk, mhc.rms_norm(y, blk.attn_norm, eps), qpos, main_x, ctx)
            r = mhc.post_map(x, r, post, comb)
            post, comb, y, pm = mhc.boundary(r, blk.hc["ffn"], pre, t)
            x = blk.moe.forward(mhc.rms_norm(y, blk.ffn_norm, eps))
        r = mhc.post_map(x, r, post, comb)
        h = mhc.rms_norm(mhc.collapse(r, pm), o.ck.vec(f"{self.last}.norm.weight"), eps)
        base = linear(h, o.ck.dense("head"))  # [k, V]
        m_embed = o.ck.vec(f"{self.last}.markov_head.embed.weight")  # [V, rank]
        m_head = o.ck.dense(f"{self.last}.markov_head.head")
        prev, out = anchor, []
        for i in range(k):
            logits = bf16(base[i] + linear(m_embed[prev][None, :], m_head)[0])
            prev = int(torch.argmax(logits))
            out.append(prev)
        return anchor, out
