"""The 584-byte fp8_ds_mla (V4) K record and its paged layout (docs/FP8_DS_MLA.md), for insert and gather.

A page of `block_size` tokens is planar: token j's 576 data bytes (448 e4m3 NoPE, 64 bf16 RoPE) at
`page + 576·j`, its 8 scale bytes (7 UE8M0 + pad 0) at `page + 576·block_size + 8·j`, and
`page = k_cache.data_ptr() + block·k_cache.stride(0)` (several layers' pages can share a block).
"""

from __future__ import annotations

import torch

RECORD_BYTES = 584  # V4_BYTES_PER_TOKEN upstream; 528 / 288 are SM100-only records
HEAD_DIM = 512
NOPE_DIM = 448
ROPE_DIM = 64
GROUP = 64  # NoPE dims per UE8M0 scale
N_GROUPS = NOPE_DIM // GROUP  # 7
DATA_BYTES = NOPE_DIM + 2 * ROPE_DIM  # 576
SCALE_BYTES = 8  # 7 exponents + a pad byte (0)
PAGE_ALIGNMENT = 576
UE8M0_BIAS = 127
AMAX_FLOOR = 1e-4  # every V4 writer floors the group amax (docs/FP8_DS_MLA.md)


def page_bytes(tokens_per_page: int) -> int:
    """Bytes of one layer's page: round_up(tokens·584, 576) (kv_cache_interface.py L676)."""
    return -(-tokens_per_page * RECORD_BYTES // PAGE_ALIGNMENT) * PAGE_ALIGNMENT


def check_k_cache(k_cache: torch.Tensor, block_size: int) -> None:
    """Raise ValueError unless k_cache is a uint8 page array holding `block_size` V4 records per page."""
    if k_cache.dtype != torch.uint8:
        raise ValueError(f"k_cache must be uint8, got {k_cache.dtype}")
    if k_cache.dim() == 3 and (k_cache.shape[1] != block_size or k_cache.shape[2] != RECORD_BYTES):
        raise ValueError(
            f"k_cache must be [blocks, block_size={block_size}, {RECORD_BYTES}], got {tuple(k_cache.shape)}"
        )
    if k_cache.dim() not in (2, 3) or k_cache.stride(-1) != 1:
        raise ValueError(f"k_cache must be [blocks, page bytes] or [blocks, block_size, {RECORD_BYTES}]")
    if k_cache.stride(0) < block_size * RECORD_BYTES:
        raise ValueError(f"page stride {k_cache.stride(0)} < {block_size} tokens x {RECORD_BYTES} B")


def token_views(k_cache: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of the record regions: data [blocks, block_size, 576] and scales [blocks, block_size, 8]."""
    nb, s0, base = k_cache.shape[0], k_cache.stride(0), k_cache.storage_offset()
    data = k_cache.as_strided((nb, block_size, DATA_BYTES), (s0, DATA_BYTES, 1), base)
    scale = k_cache.as_strided(
        (nb, block_size, SCALE_BYTES), (s0, SCALE_BYTES, 1), base + block_size * DATA_BYTES
    )
    return data, scale


def make_k_cache(
    num_blocks: int,
    block_size: int,
    *,
    layers_per_block: int = 1,
    layer: int = 0,
    device: str = "cpu",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """A [num_blocks, block_size, 584] uint8 view of one layer's pages inside shared blocks, random bytes.

    `layers_per_block` > 1 makes stride(0) span several layers' pages, as vLLM does when layers share
    a physical block; the bytes of the other layers are random too, so a stray write shows.
    """
    page = page_bytes(block_size)
    shape = (num_blocks, layers_per_block * page)
    if generator is None:  # draw where it lives: a 1M-token cache is ~0.6 GB
        raw = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
    else:
        raw = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator).to(device)
    return raw.as_strided(
        (num_blocks, block_size, RECORD_BYTES), (raw.stride(0), RECORD_BYTES, 1), layer * page
    )
