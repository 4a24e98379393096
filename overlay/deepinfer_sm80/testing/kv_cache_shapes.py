"""The KV benches' timed shapes and their GPU inputs: the gather reads compressed pages of 128 states, the
insert writes pages of 64; bytes moved per token; pools, block tables, K rows and prefill slots on CUDA.

bench/_kv_cache.py times them; the entry-point A/B cases (testing/cases/kv_gather.py and
kv_quant_insert.py) build the same shapes from here, so the cases stand below the bench.
"""

from __future__ import annotations

import torch

from deepinfer_sm80.formats.fp8_ds_mla import RECORD_BYTES
from deepinfer_sm80.testing.inputs import block_table, k_rows, page_pool

GATHER_BLOCK_SIZE = 128  # compressed cache, ratio 1: 128 states per 74,880-byte page (docs/FP8_DS_MLA.md)
INSERT_BLOCK_SIZE = 64
GATHER_BYTES_PER_TOKEN = RECORD_BYTES + 512 * 2  # 584 read + 1024 written
INSERT_BYTES_PER_TOKEN = 512 * 2 + 8 + RECORD_BYTES  # k row + int64 slot read, record written


def random_pool(num_blocks: int, block_size: int, gen: torch.Generator, *, valid: bool) -> torch.Tensor:
    return page_pool(num_blocks, block_size, gen, device="cuda", valid=valid)


def block_table_for(lens: list[int], num_blocks: int, block_size: int, gen: torch.Generator) -> torch.Tensor:
    return block_table(lens, num_blocks, block_size, gen, device="cuda")


def random_k(tokens: int, gen: torch.Generator) -> torch.Tensor:
    """[tokens, 512] bf16 with normal RoPE values (timing rows; bitwise sections set RoPE bits)."""
    return k_rows(tokens, gen, device="cuda", rope_bits=False)


def prefill_slots(tokens: int, num_blocks: int, block_size: int, gen: torch.Generator) -> torch.Tensor:
    """Consecutive positions in randomly placed pages, as a prefill writes them."""
    pages = torch.randperm(num_blocks, device="cuda", generator=gen)[: -(-tokens // block_size)]
    pos = torch.arange(tokens, device="cuda")
    return pages[pos // block_size] * block_size + pos % block_size
