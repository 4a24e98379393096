"""scripts/h200_run.sh names its sets once and checks each exists. scripts/h200_final.sh derives its
benches and test modules from the lines the modules declare
(`H200_FINAL_PHASE`, `H200_FINAL_TESTS`, `H200_SANITIZE_ORDER`): the derived sets are the ones the
script ran when it named them by hand, each named file exists, and every declaring module is picked up."""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "h200_final.sh"
BENCH = ROOT / "overlay" / "deepinfer_sm80" / "bench"
TESTS = ROOT / "overlay" / "tests"

# what the script ran before the names moved into the modules (sanitizer order kept: time-boxed)
PHASE1_BENCHES = {"kv_gather", "kv_quant_insert", "topk_swa_combine", "dspark_draft"}
PHASE1_EXTRA_TESTS = {
    "overlay/tests/test_bindings.py",
    "overlay/tests/integration/test_sm8x_attention.py",
    "overlay/tests/integration/test_pack_seq.py",
}
SANITIZE = [
    f"overlay/tests/ops/test_{op}.py"
    for op in (
        "sparse_mla", "indexer_quant", "indexer_logits", "dspark_draft",
        "compress_insert", "pp_records", "engram", "mhc",
    )
]  # fmt: skip


def derived(phase: str = "1", env: dict[str, str] | None = None) -> dict[str, str]:
    p = subprocess.run(
        ["bash", str(SCRIPT), phase, "/nonexistent"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "H200_FINAL_PRINT": "1", **(env or {})},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    return dict(line.split("=", 1) for line in p.stdout.splitlines())


def constants(path: Path) -> dict[str, object]:
    """The module-level NAME = literal assignments of a module (read, not imported)."""
    out: dict[str, object] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


def test_derived_sets_are_the_former_lists() -> None:
    d = derived()
    assert set(d["phase1_benches"].split()) == PHASE1_BENCHES
    assert d["phase2_benches"].split() == ["mhc"]
    assert d["phase2_tests"].split() == ["overlay/tests/ops/test_mhc.py"]
    tests = d["phase1_tests"].split()
    assert tests[0] == "overlay/tests/ops"
    assert set(t for t in tests[1:] if not t.startswith("--")) == PHASE1_EXTRA_TESTS
    assert [t for t in tests if t.startswith("--")] == ["--ignore=overlay/tests/ops/test_mhc.py"]
    assert d["sanitize_tests"].split() == SANITIZE
    assert derived("2") == d  # both phases derive the same sets


def test_every_named_file_exists() -> None:
    d = derived()
    for name in d["phase1_benches"].split() + d["phase2_benches"].split():
        assert (BENCH / f"{name}.py").is_file(), name
    paths = d["phase1_tests"].split() + d["phase2_tests"].split() + d["sanitize_tests"].split()
    for path in paths:
        assert (ROOT / path.removeprefix("--ignore=")).exists(), path


def test_every_declaring_module_is_picked_up() -> None:
    # a declaration the grep misses (a trailing comment, other spacing) would drop a module silently
    d = derived()
    phases = {p.stem: constants(p).get("H200_FINAL_PHASE") for p in BENCH.glob("*.py")}
    assert {n for n, v in phases.items() if v == 1} == set(d["phase1_benches"].split())
    assert {n for n, v in phases.items() if v == 2} == set(d["phase2_benches"].split())
    declared_tests, order = set(), {}
    for p in TESTS.rglob("test_*.py"):
        c, rel = constants(p), str(p.relative_to(ROOT))
        if c.get("H200_FINAL_TESTS") is True:
            declared_tests.add(rel)
        if "H200_SANITIZE_ORDER" in c:
            order[rel] = c["H200_SANITIZE_ORDER"]
    assert declared_tests == {t for t in d["phase1_tests"].split()[1:] if not t.startswith("--")}
    assert sorted(order, key=order.__getitem__) == d["sanitize_tests"].split()


def test_bad_phase_is_one_line_error() -> None:
    p = subprocess.run(
        ["bash", str(SCRIPT), "3", "/nonexistent"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert p.returncode == 2
    assert p.stderr.strip() == "h200_final: phase must be 1 or 2, got '3'"


RUN_SCRIPT = ROOT / "scripts" / "h200_run.sh"
# what h200_run.sh ran when it typed each name in each phase
RUN_SANITIZE = ["overlay/tests/ops/test_sparse_mla.py", "overlay/tests/ops/test_indexer_logits.py"]
RUN_TESTS = RUN_SANITIZE + [
    f"overlay/tests/ops/test_{op}.py"
    for op in ("indexer_topk", "kv_quant_insert", "kv_gather", "topk_swa_combine")
]


def run_sets(env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(RUN_SCRIPT), "1", "/nonexistent"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "H200_RUN_PRINT": "1", **(env or {})},
    )  # fmt: skip


def test_h200_run_sets_are_the_former_lists_and_exist() -> None:
    p = run_sets()
    assert p.returncode == 0, p.stderr
    d = dict(line.split("=", 1) for line in p.stdout.splitlines())
    assert d["sanitize_tests"].split() == RUN_SANITIZE
    assert d["all_tests"].split() == RUN_TESTS
    assert d["kv_benches"].split() == ["kv_quant_insert", "kv_gather", "topk_swa_combine"]
    for path in RUN_TESTS:
        assert (ROOT / path).is_file(), path


def test_h200_run_missing_module_is_one_line_error(tmp_path: Path) -> None:
    # the script run from a tree lacking one of its test modules stops before any step, naming it
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    (tree / "scripts" / "h200_run.sh").write_text(RUN_SCRIPT.read_text())
    p = subprocess.run(
        ["bash", "scripts/h200_run.sh", "1", "/nonexistent"], capture_output=True, text=True, timeout=60,
        cwd=tree, env={**os.environ, "H200_RUN_PRINT": "1"},
    )  # fmt: skip
    assert p.returncode == 2
    assert p.stderr.strip() == "h200_run: no test module overlay/tests/ops/test_sparse_mla.py"
