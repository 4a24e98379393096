"""Realistic random inputs for the fp8_ds_mla cache and the prefill index combiner (SPEC.md §2.1, §3.1).

Never zeros: data bytes are random finite e4m3 codes, scales are the encoders' range 105..247,
RoPE halves are random bf16 normals.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

RECORD_BYTES = 584  # 448 e4m3 NoPE + 64 bf16 RoPE + 8 scale bytes
DATA_BYTES = 576  # per-token data part of a page (NoPE + RoPE)
SCALE_BYTES = 8
PAGE_ALIGN = 576


def page_bytes(block_size: int) -> int:
    """round_up(block_size * 584, 576): the bytes one page of `block_size` tokens occupies."""
    return -(-block_size * RECORD_BYTES // PAGE_ALIGN) * PAGE_ALIGN


@dataclass(frozen=True)
class PagedCache:
    k_cache: torch.Tensor  # [num_blocks, block_size, 584] uint8 view with stride(0) = page bytes
    block_table: torch.Tensor  # [R, max_blocks] int32, a random permutation of the blocks
    seq_lens: torch.Tensor  # [R] int32
    block_size: int


def random_paged_cache(
    seq_lens: list[int], block_size: int, *, device: str, generator: torch.Generator | None = None
) -> PagedCache:
    """Pages filled with valid random records, blocks scattered through the pool in random order."""
    blocks_per_req = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_req) + 1
    pb = page_bytes(block_size)
    pool = torch.randint(0, 256, (num_blocks, pb), dtype=torch.uint8, generator=generator)
    data = pool[:, : block_size * DATA_BYTES].view(num_blocks, block_size, DATA_BYTES)
    nope = data[:, :, :448]
    nope[(nope & 0x7F) == 0x7F] = 0x7E  # finite codes only: timing inputs carry no NaN
    rope = torch.randn(num_blocks, block_size, 64, generator=generator).to(torch.bfloat16)
    data[:, :, 448:] = rope.view(torch.uint8).view(num_blocks, block_size, 128)
    scales = pool[:, block_size * DATA_BYTES : block_size * RECORD_BYTES].view(num_blocks, block_size, 8)
    scales[:, :, :7] = torch.randint(
        105, 248, (num_blocks, block_size, 7), dtype=torch.uint8, generator=generator
    )
    scales[:, :, 7] = 0
    pool = pool.to(device)
    k_cache = pool.as_strided((num_blocks, block_size, RECORD_BYTES), (pb, RECORD_BYTES, 1))
    perm = torch.randperm(num_blocks, generator=generator).to(torch.int32)
    width = max(blocks_per_req)
    table = torch.full((len(seq_lens), width), -1, dtype=torch.int32)
    start = 0
    for r, nb in enumerate(blocks_per_req):
        table[r, :nb] = perm[start : start + nb]
        start += nb
    return PagedCache(
        k_cache=k_cache,
        block_table=table.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_size=block_size,
    )


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
