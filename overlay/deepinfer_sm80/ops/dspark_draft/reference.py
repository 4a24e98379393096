"""DSpark draft step in plain PyTorch (docs/DSPARK.md): Markov bias, Gumbel noise, first-max argmax.

This is the spec the kernel is tested against. Every integer of the noise hash is reproduced
exactly (uint32 arithmetic carried in int64 and masked); the float part runs in fp32 op by op.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Draft noise lives in its own stream: the position is offset by 2^30 (positions never reach it).
DRAFT_POS_SALT = 1 << 30
SAMPLE_BLOCK = 1024  # upstream's gumbel block: per-block maxima, then the first maximal block
_U32 = 0xFFFFFFFF
_MIX_C1, _MIX_C2, _MIX_ADD = 0xCC9E2D51, 0x1B873593, 0xE6546B64
_FMIX_C1, _FMIX_C2 = 0x85EBCA6B, 0xC2B2AE35
_HASH_LEN = 16  # four 32-bit words are mixed: seed lo, seed hi, position, token id


def _rotl(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _U32


def _mix(h: torch.Tensor, word: torch.Tensor) -> torch.Tensor:
    word = _rotl((word * _MIX_C1) & _U32, 15)
    word = (word * _MIX_C2) & _U32
    h = _rotl(h ^ word, 13)
    return (h * 5 + _MIX_ADD) & _U32


def noise_hash(seed: torch.Tensor, pos: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """murmur3-32 of (seed lo, seed hi, pos lo, token id) with seed word 0, as uint32 values in int64.

    seed, pos: int64 broadcastable against token (int64); pos already salted for drafting.
    """
    seed, pos, token = seed.long(), pos.long(), token.long()
    h = torch.zeros(torch.broadcast_shapes(seed.shape, pos.shape, token.shape), dtype=torch.long)
    h = h.to(token.device)
    for word in (seed & _U32, (seed >> 32) & _U32, pos & _U32, token & _U32):
        h = _mix(h, word)
    h = h ^ _HASH_LEN
    h = h ^ (h >> 16)
    h = (h * _FMIX_C1) & _U32
    h = h ^ (h >> 13)
    h = (h * _FMIX_C2) & _U32
    return h ^ (h >> 16)


def uniform_from_hash(h: torch.Tensor) -> torch.Tensor:
    """u in (0, 1): the 16-bit halves converted exactly, summed once in fp32 ((h + 0.5) * 2^-32)."""
    hi = (h >> 16).to(torch.float32) * 2.0**-16
    lo = ((h & 0xFFFF).to(torch.float32) + 0.5) * 2.0**-32
    return hi + lo


def gumbel_from_uniform(u: torch.Tensor) -> torch.Tensor:
    """g = -log(-log(1 - u)); log(1 - u) by a degree-8 series below u = 0.25 (the winning tail)."""
    poly = torch.full_like(u, 1.0 / 8.0)
    for k in (7, 6, 5, 4, 3, 2):
        poly = 1.0 / k + u * poly
    poly = 1.0 + u * poly
    series = -u * poly
    direct = torch.log(torch.clamp(1.0 - u, min=2.0**-24))
    log1m = torch.where(u < 0.25, series, direct)
    return -torch.log(-log1m)


def first_argmax(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.argmax's rule along the last dim: the first NaN if any, else the first maximum."""
    idx = values.argmax(dim=-1)  # [B]
    return values.gather(-1, idx[:, None])[:, 0], idx


def perturbed_logits(
    logits: torch.Tensor,  # [B, V] fp32 (the bf16 sum widened)
    temperature: torch.Tensor,  # [B] fp32 per row (0 for invalid rows)
    seed: torch.Tensor,  # [B] int64
    pos: torch.Tensor,  # [B] int64, position before the sampled token
    vocab_start: int,
) -> torch.Tensor:
    """Gumbel-perturbed logits: logits / T + g(seed, pos + 2^30, token id); rows with T = 0 unchanged."""
    token = torch.arange(logits.shape[1], device=logits.device) + vocab_start  # [V] global ids
    hot = temperature != 0.0  # [B]
    scaled = torch.where(hot[:, None], logits / torch.where(hot, temperature, 1.0)[:, None], logits)
    u = uniform_from_hash(noise_hash(seed[:, None], pos[:, None] + DRAFT_POS_SALT, token[None, :]))
    return torch.where(hot[:, None], scaled + gumbel_from_uniform(u), scaled)  # [B, V]


def draft_step_ref(
    base: torch.Tensor,  # [B, V] bf16/fp32, this position's base logits (a rank's shard)
    bias: torch.Tensor,  # [B, V] same dtype: markov_w2(markov_w1[prev]) for the same columns
    *,
    gumbel: bool,
    idx_map: torch.Tensor | None = None,  # [B] int64 request slot, -1 = padding row
    temperature: torch.Tensor | None = None,  # [max_reqs] fp32
    seeds: torch.Tensor | None = None,  # [max_reqs] int64
    pos: torch.Tensor | None = None,  # [B] int64, position before the sampled token
    vocab_start: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One draft position: returns (logits [B, V] in base.dtype, best value [B] fp32, global id [B] int64).

    Greedy: first NaN, else first maximum of the summed logits. Gumbel: the same rule on the
    perturbed logits (NaN rows: first NaN, the rule upstream's torch-side stage applies).
    """
    logits = base + bias  # [B, V] one rounding in the logits dtype
    values = logits.float()
    if gumbel:
        assert idx_map is not None and temperature is not None and seeds is not None and pos is not None
        valid = idx_map >= 0
        slot = idx_map.clamp(min=0)
        temp = torch.where(valid, temperature[slot].float(), 0.0)
        seed = torch.where(valid, seeds[slot], 0)
        values = perturbed_logits(values, temp, seed, pos.long(), vocab_start)
    best, idx = first_argmax(values)
    return logits, best, idx + vocab_start


def combine_rank_partials(values: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The caller's cross-rank step: [tp, B] partial maxima and ids (ranks in vocab order) -> [B] ids.

    Same rule as within a rank (first NaN, else first maximum; ties go to the lower rank), so
    sharding the vocabulary does not change which token wins.
    """
    _, rank = first_argmax(values.t())  # [B]
    return tokens.t().gather(1, rank[:, None])[:, 0]


def draft_chain_ref(
    base_logits: torch.Tensor,  # [B, K, V] base logits of the K draft positions
    anchor: torch.Tensor,  # [B] int64 token before position 0
    markov_w1: torch.Tensor,  # [V, R] Markov embedding
    markov_w2: torch.Tensor,  # [V, R] Markov head (replicated)
    *,
    gumbel: bool,
    idx_map: torch.Tensor | None = None,  # [B, K]
    temperature: torch.Tensor | None = None,
    seeds: torch.Tensor | None = None,
    pos: torch.Tensor | None = None,  # [B, K] position before each sampled token
) -> tuple[torch.Tensor, torch.Tensor]:
    """All K positions: (tokens [B, K] int64, logits [B, K, V] as summed, what a draft cache stores)."""
    K = base_logits.shape[1]
    prev = anchor.long()
    tokens, logits = [], []
    for i in range(K):
        bias = F.linear(F.embedding(prev, markov_w1), markov_w2)  # [B, V]
        step_logits, _, prev = draft_step_ref(
            base_logits[:, i],
            bias,
            gumbel=gumbel,
            idx_map=None if idx_map is None else idx_map[:, i],
            temperature=temperature,
            seeds=seeds,
            pos=None if pos is None else pos[:, i],
        )
        tokens.append(prev)
        logits.append(step_logits)
    return torch.stack(tokens, 1), torch.stack(logits, 1)
