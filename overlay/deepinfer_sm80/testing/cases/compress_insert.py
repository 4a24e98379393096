"""Cases of the compressed-KV writer (ops/compress_insert.py, 584-byte records): the shapes its test runs
against the torch reference and, on sm_89+, against upstream's `_rope_quant_insert_kernel`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Case:
    name: str
    tokens: int
    ratio: int
    states: int  # records per page: 128 at ratio 1, 64 at ratio 2 (128-token blocks)
    num_blocks: int = 3
    skipped: int = 0  # slots set to -1
    layers_per_block: int = 1
    max_pos: int = 4096
    sanitize: bool = False


CASES = [
    Case("one-token-r1", 1, 1, 128, num_blocks=1),
    Case("decode-r1", 37, 1, 128, skipped=4),
    Case("prefill-r2", 90, 2, 64, skipped=9),
    Case("odd-positions-r2", 33, 2, 64),
    Case("shared-block-r1", 20, 1, 128, layers_per_block=3),
    Case("sanitize-r1", 16, 1, 128, sanitize=True),
]

# The sanitize case is left out of the upstream comparison: upstream's SANITIZE_CACHE_NANS is a
# gfx950-only flag its CUDA dispatcher never sets, so that case could only ever skip there; the
# sanitize path is proven against the reference.
UPSTREAM_CASES = [c for c in CASES if not c.sanitize]


def make_inputs(case: Case, device: str) -> list[Any]:
    """latent [T, 512] bf16, positions, cos_sin [max_pos, 64] fp32, slots (some -1), the page pool."""
    import torch

    from deepinfer_sm80.formats.fp8_ds_mla import make_k_cache
    from deepinfer_sm80.testing.inputs import generator, k_rows

    gen = generator(case.name)
    latent = k_rows(case.tokens, gen, rope_bits=False).contiguous()  # [T, 512] bf16, NoPE over 2^±40
    positions = torch.randint(0, case.max_pos - 1, (case.tokens,), generator=gen)
    if case.ratio == 2 and case.name.startswith("prefill"):
        positions = (torch.arange(case.tokens) + 7) % case.max_pos  # consecutive: half are boundaries
    cos_sin = torch.randn(case.max_pos, 64, generator=gen).float()
    total = case.num_blocks * case.states
    slots = torch.randperm(total, generator=gen)[: case.tokens].long()
    slots[torch.randperm(case.tokens, generator=gen)[: case.skipped]] = -1
    cache = make_k_cache(case.num_blocks, case.states, layers_per_block=case.layers_per_block, generator=gen)
    return [t.to(device) for t in (latent, positions, cos_sin, slots)] + [cache.to(device)]
