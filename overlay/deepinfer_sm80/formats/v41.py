"""DeepSeek-V4.1-Flash shapes (docs/MODEL.md): whole-model and per tensor-parallel rank.

The shipped code (o_proj's memory figures) and the rig (tests, benches) read sizes from `V41` /
`V41.per_rank(tp)`, never from literals, so a shape has one definition.
"""

from __future__ import annotations

from dataclasses import dataclass

TP_DEGREES = (1, 2, 4, 8)


@dataclass(frozen=True)
class RankShapes:
    """What one tensor-parallel rank holds (caches, indexer, mHC and Markov weights are replicated)."""

    tp: int
    heads: int  # local attention heads: q [T, heads, 512], attn_sink [heads]
    o_groups: int  # local wo_a groups (8 heads each)
    lm_head_shard: int  # vocab rows of the lm_head / draft logits on this rank
    moe_intermediate: int  # routed-expert intermediate per rank (no expert parallel)


@dataclass(frozen=True)
class ModelShapes:
    hidden: int = 5120
    layers: int = 40
    draft_layers: int = 3  # DSpark stages 40..42
    heads: int = 64
    head_dim: int = 512
    nope_dim: int = 448
    rope_dim: int = 64
    q_lora: int = 1280
    o_lora: int = 1024
    heads_per_o_group: int = 8
    window: int = 128
    topk: int = 512
    indexer_heads: int = 32
    indexer_dim: int = 128  # 64 NoPE + 64 RoPE
    candidate_blocks: int = 2048
    candidate_block_size: int = 8
    hc_mult: int = 4
    sinkhorn_iters: int = 20
    experts: int = 384
    experts_per_token: int = 6
    moe_intermediate: int = 2304
    vocab: int = 129280
    markov_rank: int = 256
    draft_tokens: int = 5  # K in the reference deployments
    swa_block_size: int = 32  # tokens per SWA-cache page
    compressed_block_tokens: int = 128  # tokens per compressed/indexer page (128 / ratio states)

    @property
    def compress_ratios(self) -> tuple[int, ...]:
        """Per layer, 40 target layers then the 3 DSpark layers: [0, 0] + [2]*18 + [1]*20 + [0]*3."""
        return (0, 0) + (2,) * 18 + (1,) * 20 + (0,) * self.draft_layers

    @property
    def kv_source_layers(self) -> tuple[int, ...]:
        return (2, 8, 14, 20)

    @property
    def index_source_layers(self) -> tuple[int, ...]:
        return (2, 8, 14, 20, 24, 28, 32, 36)

    @property
    def scale(self) -> float:
        return self.head_dim**-0.5

    def per_rank(self, tp: int) -> RankShapes:
        if tp not in TP_DEGREES:
            raise ValueError(f"tensor-parallel degree {tp} not in {TP_DEGREES}")
        return RankShapes(
            tp=tp,
            heads=self.heads // tp,
            o_groups=self.heads // self.heads_per_o_group // tp,
            lm_head_shard=self.vocab // tp,
            moe_intermediate=self.moe_intermediate // tp,
        )


V41 = ModelShapes()
