"""One V4.1 attention sublayer: MQA over a 512-d latent, sliding window + compressed keys, sink.

Per token t at position p (one sequence, positions 0..T-1):
- `wq_a | wkv` of the normed input; `q_norm` / `kv_norm` (bf16); `q = wq_b(qr)` per head [H, 512], RoPE on
  its last 64 dims at p (bf16).
- sliding-window keys: kv RoPE'd at p, written as the 584-byte fp8_ds_mla record (448 NoPE values e4m3
  in 7 groups of 64 with a power-of-two scale, 64 RoPE values bf16); a reader sees `quant.pow2_quant`'s
  values. Window: positions max(0, p - 127) .. p of the layer's own cache.
- compressed keys (ratio r in 1, 2), from the layer's kv source: the compressor pools groups of r tokens
  (`kv * softmax(score)` over the group, per dim, fp32), RMSNorm -> bf16 latent, RoPE at the group start
  `i * r`, the same record. State i is visible to p iff i < (p + 1) // r.
- which compressed states a query reads: all of them while there are at most `index_topk`; above that
  the indexer's top-k (`indexer.select`), shared by the layers that reuse the index source's picks.
- scores `q . k * 512^-0.5`, softmax with a per-head sink logit in the denominator, output the weighted
  latent (K = V) in bf16, inverse RoPE at p, `wo_a` per group of heads, `wo_b` (bf16 at each step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import indexer as idx
from .checkpoint import Checkpoint, linear
from .mhc import rms_norm
from .quant import bf16, pow2_quant
from .rope import rotate

NOPE = 448
NOPE_GROUP = 64  # fp8_ds_mla: 7 groups of 64 NoPE values per scale


def ds_mla_read(latent_rotated: torch.Tensor) -> torch.Tensor:
    """What the sparse attention reads back from an fp8_ds_mla record of a bf16 RoPE'd latent [N, 512]."""
    return torch.cat([pow2_quant(latent_rotated[:, :NOPE], NOPE_GROUP), latent_rotated[:, NOPE:]], dim=-1)


@dataclass
class LayerCaches:
    """What a kv source publishes to the layers that reuse it (one sequence)."""

    keys: torch.Tensor | None = None  # compressed keys as read, fp32 [N, 512]
    index_k: torch.Tensor | None = None  # indexer keys as read (code * scale), fp32 [N, 128]


def compress(kv_score: torch.Tensor, ratio: int, norm_w: torch.Tensor, eps: float) -> torch.Tensor:
    """fp32 [T, 512 * (2 if ratio 2)] -> bf16 latents [T // ratio, 512] of the closed groups."""
    d = 512
    if ratio == 1:
        pooled = kv_score[:, :d]
    else:
        n = kv_score.shape[0] // 2
        g = kv_score[: 2 * n].reshape(n, 2, 2 * d)
        kv, score = g[..., :d], g[..., d:]
        pooled = (kv * torch.softmax(score, dim=1)).sum(dim=1)
    return rms_norm(pooled, norm_w, eps)


def sparse_attention(
    q: torch.Tensor, keys: torch.Tensor, allowed: torch.Tensor, sink: torch.Tensor, scale: float
) -> torch.Tensor:
    """q [T, H, D], keys [N, D], allowed bool [T, N], sink [H] -> fp32 [T, H, D] (softmax with sink)."""
    s = torch.einsum("thd,nd->thn", q, keys) * scale
    s = s.masked_fill(~allowed[:, None, :], float("-inf"))
    m = torch.maximum(s.amax(dim=-1), sink[None, :])  # [T, H]
    p = torch.exp(s - m[..., None])
    den = p.sum(dim=-1) + torch.exp(sink[None, :] - m)
    return torch.einsum("thn,nd->thd", p, keys) / den[..., None]


class Attention:
    """Layer `layer` of the backbone (or a DSpark stage: `name` 'mtp.S', ratio 0)."""

    def __init__(self, ck: Checkpoint, name: str, layer: int, tables: dict[bool, torch.Tensor]) -> None:
        t = ck.text
        self.ck, self.t, self.name, self.layer = ck, t, name, layer
        ratios = t["compress_ratios"]
        self.ratio = int(ratios[layer]) if layer < t["num_hidden_layers"] else 0
        self.heads, self.d, self.q_rank = t["num_attention_heads"], t["head_dim"], t["q_lora_rank"]
        self.groups, self.window, self.eps = t["o_groups"], t["sliding_window"], t["rms_norm_eps"]
        self.table = tables[self.ratio > 0]
        backbone = layer < t["num_hidden_layers"]
        self.is_kv_source = backbone and layer in t["kv_source_layer_ids"]
        self.is_index_source = backbone and layer in t["index_source_layer_ids"]
        if self.ratio:
            self.kv_source = max(s for s in t["kv_source_layer_ids"] if s <= layer)
            self.index_source = max(s for s in t["index_source_layer_ids"] if s <= layer)
        a = f"{name}.attn"
        self.a = a
        self.sink = ck.vec(f"{a}.attn_sink")
        self.indexer = idx.Indexer(ck, a, layer, self.ratio, self.table) if self.is_index_source else None

    # ------------------------------------------------------------------ pieces
    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normed input x [T, H] -> (qr [T, 1280], kv [T, 512]), both RMS-normed bf16."""
        ck = self.ck
        qr = linear(x, ck.dense(f"{self.a}.wq_a"))
        kv = linear(x, ck.dense(f"{self.a}.wkv"))
        return rms_norm(qr, ck.vec(f"{self.a}.q_norm.weight"), self.eps), rms_norm(
            kv, ck.vec(f"{self.a}.kv_norm.weight"), self.eps
        )

    def query(self, qr: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        q = linear(qr, self.ck.dense(f"{self.a}.wq_b")).reshape(-1, self.heads, self.d)
        return bf16(rotate(q, self.table, pos))

    def window_keys(self, kv: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """kv [T, 512] -> the SWA cache's keys as read [T, 512]."""
        return ds_mla_read(bf16(rotate(kv, self.table, pos)))

    def compressed(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(latents [N, 512] bf16, compressed keys as read [N, 512]) of a kv source."""
        c = f"{self.a}.compressor"
        w = self.ck.dense(f"{c}.wkv")
        if self.ratio > 1:
            w = torch.cat([w, self.ck.dense(f"{c}.wgate")])
        latent = compress(
            linear(x, w, round_out=False), self.ratio, self.ck.vec(f"{c}.norm.weight"), self.eps
        )
        starts = torch.arange(latent.shape[0]) * self.ratio
        return latent, ds_mla_read(bf16(rotate(latent, self.table, starts)))

    def o_proj(self, o: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Attention output [T, H, 512] (fp32) -> sublayer output [T, hidden] bf16."""
        o = bf16(rotate(bf16(o), self.table, pos, inverse=True))
        t_, g = o.shape[0], self.groups
        wo_a = self.ck.dense(
            f"{self.a}.wo_a"
        )  # [g * 1024, H / g * 512]: group j's rows read heads of group j
        xg = o.reshape(t_, g, -1)
        z = torch.cat([linear(xg[:, j], w) for j, w in enumerate(wo_a.chunk(g, dim=0))], dim=-1)
        return linear(z, self.ck.dense(f"{self.a}.wo_b"))

    # ------------------------------------------------------------------ the sublayer
    def forward(
        self,
        x: torch.Tensor,
        pos: torch.Tensor,
        caches: dict[int, LayerCaches],
        picks: dict[int, torch.Tensor],
    ) -> torch.Tensor:
        """x [T, H] normed input (bf16 values), positions pos [T] = 0..T-1 of one sequence. `caches` and
        `picks` carry kv sources' caches and index sources' selections (bool [T, N]; key -1: the candidate
        source's blocks) to the layers that reuse them."""
        qr, kv = self.project(x)
        q = self.query(qr, pos)
        wkeys = self.window_keys(kv, pos)
        n_tok = x.shape[0]
        i = torch.arange(n_tok)
        win = (i[None, :] <= pos[:, None]) & (i[None, :] > pos[:, None] - self.window)  # [T, T]
        keys, allowed = wkeys, win
        if self.ratio:
            if self.is_kv_source:
                latent, ckeys = self.compressed(x)
                cache = LayerCaches(keys=ckeys)
                if self.indexer is not None:
                    cache.index_k = self.indexer.keys(latent)
                caches[self.layer] = cache
            src = caches[self.kv_source]
            if self.indexer is not None:
                picks[self.layer] = self.indexer.select(qr, x, pos, caches[self.kv_source].index_k, picks)
            sel = picks[self.index_source]  # bool [T, N]
            assert src.keys is not None
            keys = torch.cat([wkeys, src.keys])
            allowed = torch.cat([win, sel[:, : src.keys.shape[0]]], dim=1)
        o = sparse_attention(q, keys, allowed, self.sink, self.d**-0.5)
        return self.o_proj(o, pos)
