"""pp_records: gather/scatter of planar paged records vs the torch reference, bitwise, whole pool compared.

Pages share blocks with other layers' pages (stride(0) > page), slots are int32 and int64, −1 slots are
skipped on scatter and zero rows on gather, block 0 / the last state of the last block are addressed.
"""

from dataclasses import dataclass

import pytest
import torch

from deepinfer_sm80.ops import pp_records as P
from deepinfer_sm80.testing.compare import assert_bitwise_equal
from deepinfer_sm80.testing.gates import test_device
from deepinfer_sm80.testing.inputs import generator, seed_note

DEV = test_device()
# scripts/h200_final.sh phase 2 runs this module under compute-sanitizer, in this order (time-boxed)
H200_SANITIZE_ORDER = 6


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
    Case("ckv.ratio1", P.CKV_FORMAT, 16),
    Case("ckv.ratio2.int32", P.CKV_FORMAT, 8, slot_dtype=torch.int32),
    Case("ikv.ratio1", P.IKV_FORMAT, 16, neighbours=2),
    Case("ikv.ratio2.all_skipped", P.IKV_FORMAT, 8, skipped=9),
    Case("ckv.one_token", P.CKV_FORMAT, 128, blocks=2, tokens=1, skipped=0, neighbours=0),
]


def _pool(case: Case, gen: torch.Generator) -> tuple[torch.Tensor, int]:
    rec = sum(case.fmt)
    page = -(-case.states * rec // 576) * 576
    offset = case.neighbours * (page + 64)
    pool = torch.randint(0, 256, (case.blocks, offset + page + 32), dtype=torch.uint8, generator=gen)
    return pool.to(DEV), offset


def _view(pool: torch.Tensor, case: Case, offset: int) -> torch.Tensor:
    rec = sum(case.fmt)
    return pool.as_strided((case.blocks, case.states, rec), (pool.stride(0), rec, 1), offset)


def _slots(case: Case, gen: torch.Generator) -> torch.Tensor:
    total = case.blocks * case.states
    picks = torch.randperm(total, generator=gen)[: case.tokens]
    picks[0] = total - 1  # last state of the last block
    if case.tokens > 1:
        picks[1] = 0
    picks[torch.randperm(case.tokens, generator=gen)[: case.skipped]] = -1
    return picks.to(case.slot_dtype).to(DEV)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gather_matches_reference(case: Case) -> None:
    gen = generator(case.name)
    pool, offset = _pool(case, gen)
    slots = _slots(case, gen)
    cache = _view(pool, case, offset)
    out = torch.full((case.tokens, sum(case.fmt)), 0xA5, dtype=torch.uint8, device=DEV)  # poisoned
    P.gather_records(cache, slots, case.fmt, out=out)
    ref = P.gather_records_ref(_view(pool.cpu(), case, offset), slots.cpu(), case.fmt)
    assert_bitwise_equal(f"{case.name} {seed_note(case.name)}", out.cpu(), ref)
    assert int(out[slots < 0].count_nonzero()) == 0


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_scatter_matches_reference_whole_pool(case: Case) -> None:
    gen = generator(case.name + "/scatter")
    pool, offset = _pool(case, gen)
    slots = _slots(case, gen)
    rows = torch.randint(0, 256, (case.tokens, sum(case.fmt)), dtype=torch.uint8, generator=gen).to(DEV)
    ref_pool = pool.clone().cpu()
    P.scatter_records(_view(pool, case, offset), slots, rows, case.fmt)
    P.scatter_records_ref(_view(ref_pool, case, offset), slots.cpu(), rows.cpu(), case.fmt)
    assert_bitwise_equal(f"{case.name} pool {seed_note(case.name)}", pool.cpu(), ref_pool)
    back = P.gather_records(_view(pool, case, offset), slots, case.fmt)
    live = slots >= 0
    assert_bitwise_equal(f"{case.name} round trip", back[live].cpu(), rows[live].cpu())


def test_reference_layout_is_planar() -> None:
    """State j's data at page + DATA·j and its scale at page + DATA·states + SCALE·j (SPEC §2.1)."""
    states, (d, s) = 4, P.IKV_FORMAT
    cache = torch.zeros(2, states, d + s, dtype=torch.uint8)
    rows = torch.arange(d + s, dtype=torch.uint8)[None].clone()
    P.scatter_records_ref(cache, torch.tensor([states + 2]), rows, P.IKV_FORMAT)
    flat = cache[1].flatten()
    assert torch.equal(flat[2 * d : 3 * d], rows[0, :d])
    assert torch.equal(flat[states * d + 2 * s : states * d + 3 * s], rows[0, d:])
    assert int(cache[0].count_nonzero()) == 0


def test_bad_input_is_one_line_error() -> None:
    with pytest.raises(ValueError, match="uint8"):
        P.gather_records(torch.zeros(2, 4, 132), torch.zeros(1, dtype=torch.int64), P.IKV_FORMAT)
    with pytest.raises(ValueError, match="rows must be"):
        P.scatter_records(
            torch.zeros(2, 4, 132, dtype=torch.uint8), torch.zeros(1, dtype=torch.int64),
            torch.zeros(1, 584, dtype=torch.uint8), P.IKV_FORMAT,
        )  # fmt: skip
