"""The op case modules (testing/cases/<op>.py): the entry-point A/B finds its shapes there, a binding row
whose two levels bind different kernels has a case, and no case names a row that does not exist."""

from __future__ import annotations

from deepinfer_sm80.bindings import BINDINGS
from deepinfer_sm80.testing.cases.entry_point import entry_point_cases


def _distinct_kernel_rows() -> set[str]:
    """Rows the A/B can time: an optimized target that differs from base, called directly (not a factory)."""
    return {b.name for b in BINDINGS if b.optimized is not None and b.optimized != b.base and not b.wrap}


def test_every_case_names_a_row_with_two_kernels():
    rows = {b.name for b in BINDINGS}
    cases = entry_point_cases()
    assert cases, "no case module declares ENTRY_POINT_CASES"
    assert set(cases) <= rows, f"cases for rows that do not exist: {sorted(set(cases) - rows)}"
    assert set(cases) <= _distinct_kernel_rows(), "a case for a row with one target at both levels"


def test_every_row_with_two_kernels_has_a_case():
    missing = _distinct_kernel_rows() - set(entry_point_cases())
    assert not missing, f"rows with base != optimized kernels but no ENTRY_POINT_CASES: {sorted(missing)}"


def test_upstream_records_name_every_mismatch():
    import torch

    from deepinfer_sm80.testing.cases.upstream_records import bitwise_record, clone_view, mismatches, pool_of

    a = torch.arange(12, dtype=torch.int32)
    b = a.clone()
    b[5] = -1
    assert bitwise_record("same", a, a.clone()) == {"bitwise": True}
    bad = bitwise_record("differs", a, b)
    assert bad["bitwise"] is False and "differs" in str(bad["error"])
    records = {
        "T1": {"base": {"bitwise": True}, "optimized": bad},
        "probe": {"groups": 7, "x": {"bitwise": True}},
    }
    assert [m.split(":")[0] for m in mismatches(records)] == ["T1/optimized"]
    assert mismatches({"T1": {"base": {"bitwise": True}}}) == []
    view = a.view(3, 4)[1:]
    copy = clone_view(view)
    assert torch.equal(copy, view) and pool_of(copy).data_ptr() != pool_of(view).data_ptr()
    assert pool_of(copy).numel() == 12
