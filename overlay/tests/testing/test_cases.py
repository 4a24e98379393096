"""The op case modules (testing/cases/<op>.py): the entry-point A/B finds its shapes there, a binding row
whose two levels bind different kernels has a case, no case names a row that does not exist, and every
op that ships a kernel (COMPILE_SPECS / TILELANG_SPECS) or has a test under tests/ops has its case file."""

from __future__ import annotations

import pkgutil
from pathlib import Path

from deepinfer_sm80.bindings import BINDINGS
from deepinfer_sm80.testing.cases.entry_point import CASES_PACKAGE, entry_point_cases

OPS = Path(__file__).resolve().parents[2] / "deepinfer_sm80" / "ops"
OP_TESTS = Path(__file__).resolve().parents[1] / "ops"
# modules of the cases package that serve all case files and belong to no op
CASE_HELPERS = {"entry_point", "upstream_records"}


def _distinct_kernel_rows() -> set[str]:
    """Rows the A/B can time: an optimized target that differs from base, called directly (not a factory)."""
    return {b.name for b in BINDINGS if b.optimized is not None and b.optimized != b.base and not b.wrap}


def _ops() -> set[str]:
    """The op names: modules and packages directly under ops/."""
    return {m.name for m in pkgutil.iter_modules([str(OPS)])}


def _case_files() -> set[str]:
    import importlib

    root = importlib.import_module(CASES_PACKAGE)
    return {m.name for m in pkgutil.iter_modules(root.__path__)} - CASE_HELPERS


def _ops_with_kernels() -> set[str]:
    """Ops whose module (or a module of whose package) defines COMPILE_SPECS or TILELANG_SPECS."""
    from deepinfer_sm80.registry import OPS_PACKAGE, kernel_modules

    modules = kernel_modules() + kernel_modules(attr="TILELANG_SPECS")
    return {m.removeprefix(OPS_PACKAGE + ".").split(".")[0] for m in modules}


def _op_of_test(stem: str, ops: set[str]) -> str:
    """`test_<op>` or `test_<op>_<part>` -> the longest op that names it; else the name itself."""
    name = stem.removeprefix("test_")
    named = [op for op in ops if name == op or name.startswith(op + "_")]
    return max(named, key=len) if named else name


def _ops_with_tests() -> list[tuple[str, str]]:
    """(op, test file) for every module under tests/ops."""
    ops = _ops()
    return [(_op_of_test(p.stem, ops), p.name) for p in sorted(OP_TESTS.glob("test_*.py"))]


def test_every_case_names_a_row_with_two_kernels():
    rows = {b.name for b in BINDINGS}
    cases = entry_point_cases()
    assert cases, "no case module declares ENTRY_POINT_CASES"
    assert set(cases) <= rows, f"cases for rows that do not exist: {sorted(set(cases) - rows)}"
    assert set(cases) <= _distinct_kernel_rows(), "a case for a row with one target at both levels"


def test_every_row_with_two_kernels_has_a_case():
    missing = _distinct_kernel_rows() - set(entry_point_cases())
    assert not missing, f"rows with base != optimized kernels but no ENTRY_POINT_CASES: {sorted(missing)}"


def test_the_op_scans_see_the_tree():
    ops = _ops()
    assert {"kv_gather", "indexer", "mhc", "o_proj"} <= ops, sorted(ops)
    assert {"kv_gather", "indexer", "mhc"} <= _ops_with_kernels()  # a module, a package, TileLang
    assert "o_proj" not in _ops_with_kernels()  # torch only: found through its test
    assert _op_of_test("test_indexer_logits", ops) == "indexer"
    assert _op_of_test("test_kv_gather", ops) == "kv_gather"
    assert _op_of_test("test_new_op", ops) == "new_op"  # a test naming no op still needs a case file
    assert ("o_proj", "test_o_proj.py") in _ops_with_tests()


def test_every_op_with_a_kernel_or_a_test_has_a_case_file():
    cases = _case_files()
    no_case = {f"ops/{op} (ships kernel specs)" for op in _ops_with_kernels() - cases}
    no_case |= {f"tests/ops/{test}" for op, test in _ops_with_tests() if op not in cases}
    assert not no_case, f"no testing/cases/<op>.py for: {sorted(no_case)}"


def test_every_case_file_names_an_op():
    stray = _case_files() - _ops()
    assert not stray, f"testing/cases modules naming no module or package under ops/: {sorted(stray)}"


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
