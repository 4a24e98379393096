"""Cases of the Engram lookup (row `engram_lookup`, ops/engram.py): the table shards and id draws its test
runs through the byte-table kernel against the exact torch decode (bf16 rows, packed bytes, the sorted
path), and the one it runs on sm_89+ against upstream's own fp8-table `_engram_lookup_kernel`.

Equality contract: bitwise everywhere. The e4m3 decode times a UE8M0 power-of-two scale is exact in fp32
and rounds once to bf16, as upstream's hardware decode does; the packed path copies bytes.
The row binds one stand-in at both levels (a factory), so it has no ENTRY_POINT_CASES.
Importing it defines no Triton kernel (ops/engram.py is imported at call time).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from deepinfer_sm80.testing.inputs import generator

# Interpreter-sized rows: 2 scale blocks of V4.1's 128 dims (V4.1's rows are 1024 wide, the width
# ops/engram.py's COMPILE_SPECS compile); the kernel's row loop is the same at either width.
DIM, QUANT_BLOCK = 256, 128
BLOCK_R = 16  # rows a tile, as upstream launches it


@dataclass(frozen=True)
class Lookup:
    """One lookup: a table shard of `vocab` rows owning ids [vocab_start, vocab_start + vocab), ids of
    shape [tokens, total_heads] drawn in [0, id_range) (ids past the shard belong to another rank)."""

    name: str  # the ids' seed
    table: str  # the table's seed
    vocab: int
    tokens: int
    total_heads: int
    id_range: int
    vocab_start: int = 0
    head_start: int = 0
    local_heads: int = 2
    grid: int = 3  # persistent programs: fewer than the row tiles, so each loops

    @property
    def vocab_end(self) -> int:
        return self.vocab_start + self.vocab


# bf16 rows vs the exact decode: all heads, a middle slice, and a slice running past the last head (the
# padded heads write zeros); ids >= 60 or < 10 belong to another shard
BF16_CASES = [
    Lookup(f"engram-ids-{head}", "engram-bf16", 50, 7, 5, 80, vocab_start=10, head_start=head, local_heads=n)
    for head, n in ((0, 4), (3, 2), (4, 2))
]
PACKED_CASE = Lookup("engram-packed-ids", "engram-packed", 40, 6, 2, 40)  # value and scale bytes copied
SORTED_CASE = Lookup("engram-sorted-ids", "engram-sorted", 30, 9, 2, 30)  # sorted path == unsorted
# vs upstream (sm_89+): a shard in the middle of the vocab, heads 3..5 of 6, 99 rows over 4 programs
UPSTREAM_CASE = Lookup(
    "engram-gpu-ids", "engram-gpu", 64, 33, 6, 90, vocab_start=8, head_start=3, local_heads=3, grid=4
)


def tables(case: Lookup, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 table [vocab, DIM] (every code but NaN) and UE8M0 scales [vocab, DIM / QUANT_BLOCK] near 2^0."""
    gen = generator(case.table)
    codes = torch.randint(0, 256, (case.vocab, DIM), dtype=torch.uint8, generator=gen)
    codes[(codes & 0x7F) == 0x7F] = 0x01  # the table holds no NaN codes
    scales = torch.randint(100, 140, (case.vocab, DIM // QUANT_BLOCK), dtype=torch.uint8, generator=gen)
    return codes.view(torch.float8_e4m3fn).to(device), scales.to(device)


def ids(case: Lookup) -> torch.Tensor:
    """[tokens, total_heads] int64 hash ids on the CPU."""
    return torch.randint(0, case.id_range, (case.tokens, case.total_heads), generator=generator(case.name))


def launch(
    kernel: Any,
    case: Lookup,
    weight: torch.Tensor,
    scales: torch.Tensor,
    ids: torch.Tensor,
    out: torch.Tensor,
    *,
    sorted_dst: torch.Tensor | None = None,
    flag: Callable[[bool], Any] = int,
) -> None:
    """`kernel[(grid,)](...)` with upstream's parameter list. `flag` types SORTED: int by default (the
    interpreter rejects bool arguments), bool where upstream's kernel is launched as its caller does."""
    rows = ids.shape[0] * case.local_heads if sorted_dst is None else ids.numel()
    kernel[(case.grid,)](
        weight,
        scales,
        ids,
        ids if sorted_dst is None else sorted_dst,
        out,
        case.vocab_start,
        case.vocab_end,
        rows,
        ids.stride(0),
        ids.stride(-1),
        HEAD_START=case.head_start,
        LOCAL_HEADS=case.local_heads,
        TOTAL_HEADS=ids.shape[-1],
        DIM=DIM,
        QUANT_BLOCK=QUANT_BLOCK,
        BLOCK_R=BLOCK_R,
        GRID=case.grid,
        SORTED=flag(sorted_dst is not None),
        PACKED=out.dtype == torch.uint8,
        OUT_STRIDE=out.stride(0),
    )


def upstream_outputs(upstream: Any) -> dict[str, torch.Tensor]:
    """bf16 rows of upstream's `_engram_lookup_kernel` and of our stand-in on UPSTREAM_CASE (CUDA)."""
    from deepinfer_sm80.ops import engram as eg

    case = UPSTREAM_CASE
    weight, scales = tables(case, "cuda")
    hashes = ids(case).cuda()
    outs = {}
    for name, kernel in (("upstream", upstream), ("ours", eg.EngramLookupKernel(upstream))):
        out = torch.empty((case.tokens * case.local_heads, DIM), dtype=torch.bfloat16, device="cuda")
        launch(kernel, case, weight, scales, hashes, out, flag=bool)
        outs[name] = out
    torch.cuda.synchronize()
    return outs
