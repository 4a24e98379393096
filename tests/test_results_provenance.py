"""Every result under results/ says where it came from and which way each of its targets points."""

import json
import math
import re
import subprocess
import sys

import pytest
import results_provenance
from conftest import ROOT

from deepinfer_sm80.testing.bench import DIRECTIONS, Target, at_least, at_most, holds
from deepinfer_sm80.testing.provenance import REQUIRED, missing_fields, provenance

DOCS = results_provenance.documents()


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT)


def test_the_result_documents_are_found():
    names = {p.relative_to(ROOT / "results").as_posix() for p in DOCS}
    assert "sm80-compile.json" in names and "bench-ab/smoke/summary.json" in names
    assert not any("/cells/" in n for n in names)  # the parts of a bench-ab run are not documents


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT / "results").as_posix())
def test_result_carries_provenance_and_directed_targets(path):
    doc = json.loads(path.read_text())
    prov = doc.get("provenance")
    assert not missing_fields(prov), f"{path.name}: provenance lacks {missing_fields(prov)}"
    sha = prov["git_sha"]
    assert re.fullmatch(r"[0-9a-f]{40}", sha), f"{path.name}: git_sha {sha!r} is not a full sha"
    if (ROOT / ".git").exists() and _git("rev-parse", "--is-shallow-repository").stdout.strip() == "false":
        found = _git("cat-file", "-e", f"{sha}^{{commit}}").returncode == 0
        assert found, f"{path.name}: {sha} not in history"
    for t in doc.get("targets") or []:
        where = f"{path.name}: target {t.get('name')!r}"
        assert {"name", "measured", "goal", "unit", "direction", "met"} <= set(t), where
        assert t["direction"] in DIRECTIONS, where
        if t["measured"] is None or isinstance(t["goal"], str):  # unmeasured, or a pass/fail status
            assert t["met"] is False or t["measured"] == t["goal"], where
            assert t["met"] or t.get("cause"), f"{where}: a target not met names its cause"
            continue
        assert isinstance(t["measured"], (int, float)) and math.isfinite(t["goal"]), where
        assert t["met"] is False or holds(t["measured"], t["goal"], t["direction"]), f"{where}: met but fails"


def test_rederivation_is_done_and_rerunnable():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "results_provenance.py"), "--check"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_target_needs_a_direction_and_cannot_claim_a_miss_as_met():
    with pytest.raises(TypeError):
        Target("x", 1.0, 2.0, "x", False)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="direction"):
        Target("x", 1.0, 2.0, "x", False, direction="~")
    with pytest.raises(ValueError, match="met=True"):
        Target("x", 1.0, 2.0, "x", True, direction=">=")
    assert at_least("a", 2.0, 1.5, "x").as_dict()["direction"] == ">="
    assert not at_most("b", 2.0, 1.5, "x", "slow").met and at_most("b", 2.0, 1.5, "x", "slow").cause == "slow"
    assert not at_least("c", 1.00004, 1.0001, "x").met  # judged on the 3-decimal value the JSON keeps


def test_writer_provenance_has_every_required_field():
    prov = provenance(command="make sm80-report")
    assert not missing_fields(prov) or missing_fields(prov) == ["git_sha"]  # a tree without .git
    assert set(REQUIRED) <= set(prov) and prov["command"] == "make sm80-report"


def test_every_target_construction_names_its_direction():
    """A bench that builds a Target without direction= would fail only on the GPU, at the end of its
    run; this finds such a call on the CPU (benches, scripts and the overlay's own writers)."""
    import ast

    missing = []
    for path in [*(ROOT / "overlay" / "deepinfer_sm80").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            name = getattr(node, "func", None)
            if not isinstance(node, ast.Call) or getattr(name, "id", getattr(name, "attr", "")) != "Target":
                continue
            tilelang = node.args and isinstance(node.args[0], ast.Dict)  # TileLang's Target({...})
            if not tilelang and not any(k.arg == "direction" for k in node.keywords):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not missing, f"Target(...) without direction=: {missing}"


def test_rederived_facts_never_overwrite_a_rerun():
    old = {"provenance": {"git_sha": "f44e9b7d95454c241d0c5b85c3c242d2f2f38383"}}
    rel = "gpu/pp_roundtrip-h200-5b22231.json"
    assert results_provenance.facts_for(rel, old["provenance"], old)["git_sha"] == "5b22231"  # the stale sha
    rerun = {"git_sha": "c32d4802c6de218bd0e6c9752c9e0466fd459609", "date": "2026-12-02T00:51:02+00:00"}
    assert results_provenance.facts_for("sm80-reachability.json", rerun, {"provenance": rerun}) == {}
    assert results_provenance.facts_for("sm80-reachability.json", {}, {})["git_sha"] == "590332f"  # no sha
