"""Cases of the pipeline-replication record copies (ops/pp_records.py): the page pools, views and slot
lists its test gathers and scatters against the torch reference.

Equality contract: bitwise over the whole pool. Both directions are byte copies, so any difference (or a
stray write into a neighbouring layer's page) is a bug. No upstream counterpart (the pipeline payload
is ours); the row binds no kernel of its own, so it has no ENTRY_POINT_CASES.
Importing it defines no Triton kernel (the record formats come from formats/).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer_sm80.formats import fp8_ds_mla, indexer_k

CKV_FORMAT = (fp8_ds_mla.DATA_BYTES, fp8_ds_mla.SCALE_BYTES)  # (576, 8): compressed KV, ops' CKV_FORMAT
IKV_FORMAT = (indexer_k.CODE_BYTES, indexer_k.SCALE_BYTES)  # (128, 4): indexer K, ops' IKV_FORMAT
PAGE_ALIGNMENT = fp8_ds_mla.PAGE_ALIGNMENT  # 576: a page's bytes round up to it
POISON = 0xA5  # gather outputs start as this byte


@dataclass(frozen=True)
class Case:
    name: str
    fmt: tuple[int, int]
    states: int  # per block
    blocks: int = 6
    tokens: int = 9
    skipped: int = 3
    slot_dtype: torch.dtype = torch.int64
    neighbours: int = 1  # other pages in the same block, before this one


CASES = [
    Case("ckv.ratio1", CKV_FORMAT, 16),
    Case("ckv.ratio2.int32", CKV_FORMAT, 8, slot_dtype=torch.int32),
    Case("ikv.ratio1", IKV_FORMAT, 16, neighbours=2),
    Case("ikv.ratio2.all_skipped", IKV_FORMAT, 8, skipped=9),
    Case("ckv.one_token", CKV_FORMAT, 128, blocks=2, tokens=1, skipped=0, neighbours=0),
]


def pool(case: Case, gen: torch.Generator, device: str) -> tuple[torch.Tensor, int]:
    """[blocks, bytes] random uint8 blocks holding `neighbours` other pages (plus 64 spare bytes each)
    before this one and 32 after, and the byte offset of this page in a block."""
    rec = sum(case.fmt)
    page = -(-case.states * rec // PAGE_ALIGNMENT) * PAGE_ALIGNMENT
    offset = case.neighbours * (page + 64)
    raw = torch.randint(0, 256, (case.blocks, offset + page + 32), dtype=torch.uint8, generator=gen)
    return raw.to(device), offset


def view(raw: torch.Tensor, case: Case, offset: int) -> torch.Tensor:
    """The [blocks, states, record] page view at `offset` (stride(0) is the whole block)."""
    rec = sum(case.fmt)
    return raw.as_strided((case.blocks, case.states, rec), (raw.stride(0), rec, 1), offset)


def slots(case: Case, gen: torch.Generator, device: str) -> torch.Tensor:
    """`tokens` distinct slots, the last state of the last block and state 0 among them, `skipped` set -1."""
    total = case.blocks * case.states
    picks = torch.randperm(total, generator=gen)[: case.tokens]
    picks[0] = total - 1  # last state of the last block
    if case.tokens > 1:
        picks[1] = 0
    picks[torch.randperm(case.tokens, generator=gen)[: case.skipped]] = -1
    return picks.to(case.slot_dtype).to(device)


def scatter_rows(case: Case, gen: torch.Generator, device: str) -> torch.Tensor:
    """[tokens, record] random rows to scatter (drawn after the pool and the slots)."""
    return torch.randint(0, 256, (case.tokens, sum(case.fmt)), dtype=torch.uint8, generator=gen).to(device)
