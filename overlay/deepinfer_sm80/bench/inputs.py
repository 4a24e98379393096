"""Realistic random prefill chunks for the TopK+SWA index combiner (SPEC.md §3.1); never all -1.

Paged fp8_ds_mla caches for benches come from `bench.kv_cache.random_pool` / `block_table_for`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CombineInputs:
    topk_indices: torch.Tensor  # [T, topk] int32, request-local compressed positions, -1 padded
    query_start_loc: torch.Tensor  # [R + 1] int32
    seq_lens: torch.Tensor  # [R] int32
    gather_lens: torch.Tensor  # [R] int32
    window_size: int
    compress_ratio: int
    topk: int
    M: int
    N: int


def random_combine_inputs(
    query_lens: list[int],
    prefix_lens: list[int],
    *,
    compress_ratio: int,
    topk: int = 512,
    window_size: int = 128,
    device: str,
    generator: torch.Generator | None = None,
) -> CombineInputs:
    """One prefill chunk: request b has prefix_lens[b] cached tokens and query_lens[b] new ones."""
    seq = [p + q for p, q in zip(prefix_lens, query_lens, strict=True)]
    gather = [min(s, q + window_size - 1) for s, q in zip(seq, query_lens, strict=True)]
    n_comp = max((s // compress_ratio) if compress_ratio else 0 for s in seq)
    M = n_comp + max(gather)
    T = sum(query_lens)
    rows = []
    for p, q in zip(prefix_lens, query_lens, strict=True):
        pos = torch.arange(p, p + q)
        valid = (pos + 1) // compress_ratio if compress_ratio else torch.zeros_like(pos)
        width = max(topk, 1)
        raw = (torch.rand(q, width, generator=generator) * valid.clamp(min=1)[:, None]).to(torch.int32)
        raw[torch.arange(width)[None, :] >= valid[:, None]] = -1
        rows.append(raw[:, :topk])
    topk_indices = torch.cat(rows) if rows else torch.empty(0, topk, dtype=torch.int32)
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    assert topk_indices.shape == (T, topk)
    return CombineInputs(
        topk_indices=topk_indices.to(device),
        query_start_loc=qsl.to(device),
        seq_lens=torch.tensor(seq, dtype=torch.int32, device=device),
        gather_lens=torch.tensor(gather, dtype=torch.int32, device=device),
        window_size=window_size,
        compress_ratio=compress_ratio,
        topk=topk,
        M=M,
        N=n_comp,
    )
