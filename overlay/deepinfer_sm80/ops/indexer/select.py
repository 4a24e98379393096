"""Candidate blocks and top-k of the indexer: torch references (the spec) and the score-key encoding.

Selection order everywhere in our code: larger score first, NaN above every number (as torch.topk),
-0 equal to +0, ties broken by the lower column. Encoded as one int64 per column,
`key = ordered(score) << 32 | (2^32 - 1 - column)`, so a plain integer top-k is deterministic and an
invalid column (outside [ks, ke), or not a listed candidate) is `INT64_MIN`, below every score.
"""

from __future__ import annotations

import torch

INVALID_KEY = -(2**63)
_NAN_ORDER = 0x7FFFFFFF


def ordered_int32(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> int32 with the same order (NaN largest, -0 == +0)."""
    v = torch.where(v == 0, torch.zeros_like(v), v.float())
    bits = v.view(torch.int32)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return torch.where(v.isnan(), torch.full_like(ordered, _NAN_ORDER), ordered)


def score_keys(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """int64 keys [R, N] of fp32 scores [R, N]; column j's tie-break is j (lower wins)."""
    cols = torch.arange(scores.shape[1], device=scores.device, dtype=torch.int64)
    key = (ordered_int32(scores).to(torch.int64) << 32) | ((2**32 - 1) - cols)[None, :]
    return torch.where(valid, key, torch.full_like(key, INVALID_KEY))


def keys_to_columns(keys: torch.Tensor) -> torch.Tensor:
    """int32 columns of keys (descending-sorted or not); -1 for INVALID_KEY."""
    cols = ((2**32 - 1) - (keys & 0xFFFFFFFF)).to(torch.int32)
    return torch.where(keys == INVALID_KEY, torch.full_like(cols, -1), cols)


def topk_ref(scores: torch.Tensor, valid: torch.Tensor, k: int) -> torch.Tensor:
    """int32 [R, k]: columns of the k best valid scores per row in selection order, -1 padded."""
    keys = score_keys(scores, valid)
    if keys.shape[1] < k:
        pad = torch.full(
            (keys.shape[0], k - keys.shape[1]), INVALID_KEY, dtype=torch.int64, device=keys.device
        )
        keys = torch.cat([keys, pad], 1)
    top = keys.topk(k, dim=1).values  # sorted descending, keys are unique
    return keys_to_columns(top)


def ragged_valid(rows: int, width: int, ks: torch.Tensor, ke: torch.Tensor) -> torch.Tensor:
    cols = torch.arange(width, device=ks.device)[None, :]
    return (cols >= ks.long()[:, None]) & (cols < ke.long()[:, None])


def local_view(logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores [R, L], valid [R, L]) in row-local columns j = column − ks (L = max row length)."""
    lengths = (ke.long() - ks.long()).clamp_min(0)
    width = int(lengths.max()) if lengths.numel() else 0
    j = torch.arange(width, device=logits.device)[None, :]
    src = (ks.long()[:, None] + j).clamp(max=max(logits.shape[1] - 1, 0))
    scores = torch.gather(logits, 1, src) if width else logits[:, :0]
    return scores, j < lengths[:, None]


def select_candidate_blocks_ref(
    logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk_blocks: int, block_size: int
) -> torch.Tensor:
    """Layer 20: int32 [R, topk_blocks] row-local block ids in selection order, -1 padded.

    Block score = NaN-propagating max over the block's valid columns; the block of column ke−1 is
    +inf; blocks scoring −inf (or with no valid column) are −1."""
    scores, valid = local_view(logits, ks, ke)
    r, width = scores.shape
    nb = -(-width // block_size)
    pad = nb * block_size - width
    s = torch.nn.functional.pad(scores.masked_fill(~valid, float("-inf")), (0, pad), value=float("-inf"))
    v = torch.nn.functional.pad(valid, (0, pad), value=False)
    blocks = s.reshape(r, nb, block_size)
    bmax = blocks.amax(-1)  # NaN-propagating
    bmax = torch.where(blocks.isnan().any(-1), torch.full_like(bmax, float("nan")), bmax)
    bvalid = v.reshape(r, nb, block_size).any(-1)
    lengths = (ke.long() - ks.long()).clamp_min(0)
    newest = torch.arange(nb, device=logits.device)[None, :] == ((lengths - 1) // block_size)[:, None]
    bmax = torch.where(newest & (lengths[:, None] > 0), torch.full_like(bmax, float("inf")), bmax)
    top = topk_ref(bmax, bvalid, topk_blocks)
    chosen = torch.gather(bmax, 1, top.clamp_min(0).long()) if nb else bmax[:, :0]
    out = torch.where((top < 0) | (chosen == float("-inf")), torch.full_like(top, -1), top)
    return out[:, :topk_blocks]


def candidate_valid_ref(
    ks: torch.Tensor, ke: torch.Tensor, candidates: torch.Tensor, block_size: int, width: int
) -> torch.Tensor:
    """bool [R, width] row-local: inside [0, ke−ks) and inside a listed block (layers 24..36)."""
    lengths = (ke.long() - ks.long()).clamp_min(0)
    j = torch.arange(width, device=ks.device)[None, :]
    nb = -(-width // block_size)
    listed = torch.zeros(candidates.shape[0], nb + 1, dtype=torch.bool, device=ks.device)
    blk = candidates.long().clamp(-1, nb)
    listed.scatter_(1, torch.where(blk < 0, nb, blk), True)
    listed[:, nb] = False
    in_listed = listed.gather(1, (j // block_size).expand(candidates.shape[0], -1))
    return (j < lengths[:, None]) & in_listed
