"""Regression (found by the CPU engine run): `state_views` over a layer's pages inside shared KV blocks.

vLLM lays several layers' indexer-K pages into one physical block, so a layer's k_cache is a strided
view whose stride(0) is the shared block size and whose last page ends well before stride(0) bytes
past its start. The old `state_views` viewed each page as the full stride(0) bytes and ran past the
storage on the last block (RuntimeError from as_strided); each view must span block_size·132 bytes.
"""

from __future__ import annotations

import pytest
import torch

from deepinfer_sm80.formats.indexer_k import CODE_BYTES, RECORD_BYTES, page_bytes, state_views


def _shared_layer_view(num_blocks: int, block_size: int, shared_page: int, offset: int) -> torch.Tensor:
    """uint8 [num_blocks, block_size, 132] at `offset` inside blocks of `shared_page` bytes; the storage
    ends right after this layer's last page (as the shared KV tensor does for the last layer)."""
    used = block_size * RECORD_BYTES
    raw = torch.full(((num_blocks - 1) * shared_page + offset + used,), 0xFF, dtype=torch.uint8)
    return raw.as_strided((num_blocks, block_size, RECORD_BYTES), (shared_page, RECORD_BYTES, 1), offset)


@pytest.mark.parametrize("offset", [0, 4 * 576])
def test_state_views_stay_inside_the_shared_storage(offset: int) -> None:
    num_blocks, block_size = 3, 8
    shared_page = 5 * page_bytes(block_size)  # 5 layers share each physical block
    k_cache = _shared_layer_view(num_blocks, block_size, shared_page, offset)
    gen = torch.Generator().manual_seed(20)
    codes_want = torch.randint(0, 256, (num_blocks, block_size, CODE_BYTES), dtype=torch.uint8, generator=gen)
    scales_want = torch.exp2(torch.randint(-8, 8, (num_blocks, block_size), generator=gen).float())
    base = k_cache.storage_offset()
    flat = k_cache.untyped_storage()
    store = torch.empty(0, dtype=torch.uint8).set_(flat)
    for b in range(num_blocks):
        page = base + b * shared_page
        store[page : page + block_size * CODE_BYTES] = codes_want[b].reshape(-1)
        s0 = page + block_size * CODE_BYTES
        store[s0 : s0 + 4 * block_size] = scales_want[b].view(torch.uint8)
    codes, scales = state_views(k_cache)
    assert codes.shape == (num_blocks, block_size, CODE_BYTES) and scales.shape == (num_blocks, block_size)
    assert torch.equal(codes, codes_want)
    assert torch.equal(scales, scales_want)
    codes[-1, -1, -1] = 7  # a view, not a copy: writers see the same bytes
    assert int(store[base + (num_blocks - 1) * shared_page + block_size * CODE_BYTES - 1]) == 7


def test_state_views_refuses_a_misaligned_scale_offset() -> None:
    k_cache = _shared_layer_view(2, 8, 2 * page_bytes(8), 2)
    with pytest.raises(ValueError, match="multiple of 4"):
        state_views(k_cache)
