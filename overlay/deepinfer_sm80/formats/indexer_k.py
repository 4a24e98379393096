"""The 132-byte indexer-K record and its paged layout (docs/INDEXER.md). Constants and views only.

One record per compressed state: 128 e4m3fn code bytes plus one fp32 scale (always a power of two,
2^e). A page of `block_size` states is planar: state j's 128 codes at `page + 128·j`, its scale at
`page + 128·block_size + 4·j`, with `page = k_cache.data_ptr() + block·k_cache.stride(0)`. The page
stride can exceed `block_size·132` (pages are rounded up to 576 bytes, and several layers' pages can
share a physical block), so readers always use `stride(0)`. Plain (untiled) layout, as on CUDA.
"""

from __future__ import annotations

import torch

INDEX_DIM = 128  # 64 NoPE + 64 RoPE
ROPE_DIM = 64
NOPE_DIM = INDEX_DIM - ROPE_DIM
CODE_BYTES = INDEX_DIM  # one e4m3fn byte per dim
SCALE_BYTES = 4  # one fp32 2^e per state
RECORD_BYTES = CODE_BYTES + SCALE_BYTES  # 132
PAGE_ALIGNMENT = 576
INDEX_HEADS = 32
AMAX_FLOOR = 1e-4  # both writers floor the amax before picking the exponent
TOPK = 512
CANDIDATE_BLOCKS = 2048  # blocks layer 20 publishes per row
CANDIDATE_BLOCK_SIZE = 8  # compressed states per candidate block


def page_bytes(states_per_page: int) -> int:
    """round_up(states·132, 576): 128 states -> 17280, 64 states -> 8640."""
    return -(-states_per_page * RECORD_BYTES // PAGE_ALIGNMENT) * PAGE_ALIGNMENT


def check_k_cache(k_cache: torch.Tensor) -> int:
    """Raise ValueError unless k_cache is uint8 [blocks, block_size, 132] (or with a unit dim before 132,
    as DeepGEMM's view has it) whose pages hold block_size records; return block_size."""
    if k_cache.dtype != torch.uint8:
        raise ValueError(f"indexer k_cache must be uint8, got {k_cache.dtype}")
    shape = tuple(k_cache.shape)
    if k_cache.dim() == 4 and shape[2] == 1:
        shape = (shape[0], shape[1], shape[3])
    if len(shape) != 3 or shape[2] != RECORD_BYTES:
        raise ValueError(
            f"indexer k_cache must be [blocks, block_size, {RECORD_BYTES}], got {tuple(k_cache.shape)}"
        )
    if k_cache.stride(-1) != 1 or k_cache.stride(0) < shape[1] * RECORD_BYTES:
        raise ValueError(
            f"indexer k_cache pages overlap: stride(0)={k_cache.stride(0)} < {shape[1]}·{RECORD_BYTES}"
        )
    return shape[1]


def make_k_cache(num_blocks: int, block_size: int, *, device: str | torch.device = "cpu") -> torch.Tensor:
    """uint8 [num_blocks, block_size, 132] view over pages of page_bytes(block_size) (poisoned 0xFF:
    NaN codes and NaN scales wherever nothing was written)."""
    pb = page_bytes(block_size)
    raw = torch.full((num_blocks, pb), 0xFF, dtype=torch.uint8, device=device)
    return raw.as_strided((num_blocks, block_size, RECORD_BYTES), (pb, RECORD_BYTES, 1))


def state_views(k_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes uint8 [blocks, block_size, 128], scales fp32 [blocks, block_size]) viewing k_cache's pages."""
    block_size = check_k_cache(k_cache)
    num_blocks, page = k_cache.shape[0], k_cache.stride(0)
    if page % 4 or k_cache.storage_offset() % 4:
        raise ValueError(
            f"indexer page stride {page} / offset {k_cache.storage_offset()}: not a multiple of 4 (fp32)"
        )
    # Each view spans only the block_size·132 bytes a page holds, not the full stride(0): several
    # layers' pages share one physical block, so the last page's stride can reach past the storage.
    codes = k_cache.as_strided((num_blocks, block_size, CODE_BYTES), (page, CODE_BYTES, 1))
    scale_bytes = k_cache.as_strided(
        (num_blocks, block_size * SCALE_BYTES),
        (page, 1),
        k_cache.storage_offset() + block_size * CODE_BYTES,
    )
    scales = scale_bytes.view(torch.float32)  # [blocks, block_size]
    return codes, scales
