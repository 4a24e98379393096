"""pp_records: gather/scatter of planar paged records vs the torch reference, bitwise, whole pool compared.

Pages share blocks with other layers' pages (stride(0) > page), slots are int32 and int64, −1 slots are
skipped on scatter and zero rows on gather, block 0 / the last state of the last block are addressed.
Cases and builders: testing/cases/pp_records.py.
"""

import pytest
import torch

from deepinfer_sm80.ops import pp_records as P
from deepinfer_sm80.testing.cases.pp_records import CASES, POISON, Case, pool, scatter_rows, slots, view
from deepinfer_sm80.testing.compare import assert_bitwise_equal
from deepinfer_sm80.testing.gates import test_device
from deepinfer_sm80.testing.inputs import generator, seed_note

DEV = test_device()
# scripts/h200_final.sh phase 2 runs this module under compute-sanitizer, in this order (time-boxed)
H200_SANITIZE_ORDER = 6


def test_case_formats_are_the_ops() -> None:
    from deepinfer_sm80.testing.cases import pp_records as cases

    assert (cases.CKV_FORMAT, cases.IKV_FORMAT) == (P.CKV_FORMAT, P.IKV_FORMAT)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gather_matches_reference(case: Case) -> None:
    gen = generator(case.name)
    raw, offset = pool(case, gen, DEV)
    picks = slots(case, gen, DEV)
    cache = view(raw, case, offset)
    out = torch.full((case.tokens, sum(case.fmt)), POISON, dtype=torch.uint8, device=DEV)
    P.gather_records(cache, picks, case.fmt, out=out)
    ref = P.gather_records_ref(view(raw.cpu(), case, offset), picks.cpu(), case.fmt)
    assert_bitwise_equal(f"{case.name} {seed_note(case.name)}", out.cpu(), ref)
    assert int(out[picks < 0].count_nonzero()) == 0


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_scatter_matches_reference_whole_pool(case: Case) -> None:
    gen = generator(case.name + "/scatter")
    raw, offset = pool(case, gen, DEV)
    picks = slots(case, gen, DEV)
    rows = scatter_rows(case, gen, DEV)
    ref_pool = raw.clone().cpu()
    P.scatter_records(view(raw, case, offset), picks, rows, case.fmt)
    P.scatter_records_ref(view(ref_pool, case, offset), picks.cpu(), rows.cpu(), case.fmt)
    assert_bitwise_equal(f"{case.name} pool {seed_note(case.name)}", raw.cpu(), ref_pool)
    back = P.gather_records(view(raw, case, offset), picks, case.fmt)
    live = picks >= 0
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
