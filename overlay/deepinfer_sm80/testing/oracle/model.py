"""The forward of the tiny V4.1 checkpoint, one sequence at a time, and the oracle's API.

Layer l (0-based) of the backbone:
    boundary before attention: R <- post-map of layer l-1's FFN output (l = 0: the embedding as 4
        streams); the aux stream `mean(R)` is recorded for `dspark_target_layer_ids` (the *entry* of
        layer l, as vLLM 0.32.0 reads V4.1's ids); an Engram layer adds its n-gram memory to R here;
        the gates come from R, the input collapses R with layer l-1's FFN pre-mix (l = 0: stream 0)
    attention (attention.py) on RMSNorm(input, attn_norm)
    boundary before the FFN (gates from the post-mapped R, input collapsed with the attention pre-mix)
    MoE (moe.py) on RMSNorm(input, ffn_norm)
End: post-map of the last FFN, collapse with its pre-mix, RMSNorm(norm), `head` -> bf16 logits.
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import mhc
from .attention import LayerCaches
from .block import Block, Trace
from .checkpoint import Checkpoint, linear
from .dspark import Drafter
from .engram import EngramLayout, compressed_token_map, engram_inject, engram_rows
from .quant import bf16
from .rope import cos_sin_table


class V41Oracle:
    """`V41Oracle.load(ckpt_dir)`; `logits(ids)`, `prompt_logprobs(ids)`, `greedy(ids, n)`, `draft(ids)`."""

    def __init__(self, ck: Checkpoint) -> None:
        t = ck.text
        self.ck, self.t = ck, t
        self.tables = {False: cos_sin_table(t, False), True: cos_sin_table(t, True)}
        self.blocks = [Block(ck, f"layers.{i}", i, self.tables) for i in range(t["num_hidden_layers"])]
        self.vocab = t["vocab_size"]
        self.embed = ck.dense("embed").to(torch.float32)  # bf16 values
        self.engram: EngramLayout | None = None
        self._token_map: torch.Tensor | None = None
        if t.get("engram_layer_ids"):
            tmap, _ = compressed_token_map(ck.dir / "tokenizer.json")
            self.engram = EngramLayout.from_config(t, tmap)
            self._token_map = torch.tensor(tmap, dtype=torch.int64)
        self._drafter: Drafter | None = None

    @classmethod
    def load(cls, ckpt_dir: str | Path) -> V41Oracle:
        return cls(Checkpoint(Path(ckpt_dir)))

    # ------------------------------------------------------------------ forward
    def _ids(self, token_ids: list[int] | torch.Tensor) -> torch.Tensor:
        ids = torch.as_tensor(token_ids, dtype=torch.int64).flatten()
        if ids.numel() == 0:
            raise ValueError("token_ids is empty")
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab:
            raise ValueError(f"token id outside [0, {self.vocab}): {int(ids.min())}..{int(ids.max())}")
        if ids.numel() > self.tables[True].shape[0]:
            raise ValueError(f"{ids.numel()} tokens exceed the RoPE table ({self.tables[True].shape[0]})")
        return ids

    def _engram(self, blk: Block, r: torch.Tensor, hashes: torch.Tensor) -> torch.Tensor:
        assert self.engram is not None
        slot = self.engram.layer_ids.index(blk.layer)
        e = f"{blk.name}.engram"
        rows = engram_rows(self.ck.table(f"{e}.embed"), hashes[:, slot])
        kv = linear(rows, self.ck.dense(f"{e}.wkv"))
        return engram_inject(
            r, kv, self.ck.vec(f"{e}.q_weight"), self.ck.vec(f"{e}.k_weight"), self.t["rms_norm_eps"]
        )

    def trace(self, token_ids: list[int] | torch.Tensor) -> Trace:
        """One prefill of token_ids (positions 0..T-1)."""
        ids = self._ids(token_ids)
        t, cfg = self.t, self.t
        pos = torch.arange(ids.numel())
        aux_ids = set(t.get("dspark_target_layer_ids", []))
        aux: dict[int, torch.Tensor] = {}
        hashes = None
        if self.engram is not None:
            assert self._token_map is not None
            hashes = self.engram.hashes(self._token_map[ids])
        caches: dict[int, LayerCaches] = {}
        picks: dict[int, torch.Tensor] = {}
        x = self.embed[ids]
        r = post = comb = pm = None
        for blk in self.blocks:
            if blk.layer == 0:
                r, post, comb, y, pre = mhc.first_boundary(x, blk.hc["attn"], cfg)
            else:
                r = mhc.post_map(x, r, post, comb)
                if blk.layer in aux_ids:
                    aux[blk.layer] = bf16(r.mean(dim=1))
                if blk.engram:
                    assert hashes is not None
                    r = self._engram(blk, r, hashes)
                post, comb, y, pre = mhc.boundary(r, blk.hc["attn"], pm, cfg)
            x = blk.attn.forward(mhc.rms_norm(y, blk.attn_norm, cfg["rms_norm_eps"]), pos, caches, picks)
            r = mhc.post_map(x, r, post, comb)
            post, comb, y, pm = mhc.boundary(r, blk.hc["ffn"], pre, cfg)
            x = blk.moe.forward(mhc.rms_norm(y, blk.ffn_norm, cfg["rms_norm_eps"]))
        r = mhc.post_map(x, r, post, comb)
        if len(self.blocks) in aux_ids:
            aux[len(self.blocks)] = bf16(r.mean(dim=1))
        h = mhc.rms_norm(mhc.collapse(r, pm), self.ck.vec("norm.weight"), cfg["rms_norm_eps"])
        return Trace(linear(h, self.ck.dense("head")), h, aux)

    # ------------------------------------------------------------------ API
    def logits(self, token_ids: list[int] | torch.Tensor) -> torch.Tensor:
        """Causal next-token logits at every position: fp32 [T, vocab] (values bf16, as the engine's)."""
        return self.trace(token_ids).logits

    def prompt_logprobs(self, token_ids: list[int] | torch.Tensor) -> torch.Tensor:
        """log p(tok[t+1] | tok[:t+1]) for t = 0..T-2: fp32 [T-1]."""
        ids = self._ids(token_ids)
        lp = torch.log_softmax(self.logits(ids)[:-1], dim=-1)
        return lp.gather(1, ids[1:, None]).squeeze(1)

    def greedy(self, token_ids: list[int] | torch.Tensor, n: int) -> tuple[list[int], list[float]]:
        """n greedy tokens after token_ids and the top-1 / top-2 logit margin at each step."""
        ids = self._ids(token_ids).tolist()
        out, margins = [], []
        for _ in range(n):
            last = self.logits(ids)[-1]
            top = last.topk(2)
            tok = int(torch.argmax(last))  # first maximum, as torch.argmax in the engine's sampler
            out.append(tok)
            margins.append(float(top.values[0] - top.values[1]))
            ids.append(tok)
        return out, margins

    def draft(self, token_ids: list[int] | torch.Tensor, k: int = 5) -> tuple[int, list[int]]:
        """DSpark after the target has read token_ids: (the target's greedy next token, the k greedy
        draft tokens that follow it)."""
        if self._drafter is None:
            self._drafter = Drafter(self)
        return self._drafter.draft(self._ids(token_ids), k)
