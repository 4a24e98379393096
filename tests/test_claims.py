"""Prose claims that something "works", was "not yet run" or was "not timed" / "did not time" hold against
the committed results (issue 31: every sentence true to the data).

Two checks, each failing with one line per contradiction (`doc: "sentence…": why`):

* CLAIMS, a table of sentences known to make such a claim without naming the file that settles it:
  (doc, a pattern of the claim, the results files that would settle it, the condition on them that
  contradicts it). A row whose pattern no longer matches its doc has nothing to check (the sentence
  was rewritten); each row's comment says where the claim came from.
* Every other sentence of docs/*.md that makes one of the three claims, names a results file
  (`results/…`, or a file name found under results/) and names something in backticks: the named
  file is read and the claim checked against what it holds for that name (rows timed for an op,
  JUnit cases run or failed for a test or module).

Rendered regions (`<!-- report:… -->`) are data, not prose, and are left out; so are headings
("How the optimized level works") and code blocks.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from conftest import ROOT

RESULTS = ROOT / "results"
DOCS = sorted((ROOT / "docs").glob("*.md"))
REGION = re.compile(r"<!-- report:([\w-]+)[^>]*-->.*?<!-- /report:\1 -->", re.S)
KINDS = {
    "not timed": re.compile(r"\b(?:not (?:yet )?timed|did not time|never timed)\b", re.I),
    "not run": re.compile(
        r"\b(?:not yet run|never (?:been )?run|ha(?:s|ve) not (?:yet )?(?:been )?run)\b", re.I
    ),
    "works": re.compile(r"\bworks\b", re.I),
}
TC_MIN_TOKENS = 128  # ops/mhc/splits.py: the fused boundary's partials run on tensor cores from here


# ----------------------------------------------------------------------------- reading results
def _json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _rows(path: Path) -> list[dict]:
    return [r for r in _json(path).get("rows") or [] if isinstance(r, dict) and r.get("us") is not None]


def _cases(path: Path) -> list[tuple[str, str]]:
    """(`classname::name`, outcome) of each JUnit testcase: passed, failed or skipped."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return []
    out = []
    for case in root.iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        outcome = "failed" if failed else "skipped" if case.find("skipped") is not None else "passed"
        out.append((f"{case.get('classname', '')}::{case.get('name', '')}", outcome))
    return out


def _rel(path: Path) -> str:
    """`results/…` of a results file, whichever tree it sits in."""
    parts = path.parts
    return "/".join(parts[len(parts) - 1 - parts[::-1].index("results") :])


# ----------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class Claim:
    doc: str  # relative to the repository root
    pattern: str  # regex over the doc's text with whitespace collapsed
    results: str  # glob under results/
    contradicts: Callable[[Path], str | None]  # evidence in one results file that the claim is false
    origin: str  # where the claim stood when the row was written


def _timed_at_least(op: str, size: int) -> Callable[[Path], str | None]:
    def check(path: Path) -> str | None:
        hits = sorted(
            r["size"] for r in _rows(path) if r["op"] == op and r["impl"] == "deepinfer" and r["size"] >= size
        )
        return f"{_rel(path)} times `{op}` (ours) at size {', '.join(map(str, hits))}" if hits else None

    return check


def _shape_timed(shape: re.Pattern[str]) -> Callable[[Path], str | None]:
    def check(path: Path) -> str | None:
        hits = sorted(
            {r["shape"] for r in _rows(path) if r["impl"] == "deepinfer" and shape.fullmatch(r["shape"])}
        )
        return f"{_rel(path)} has timing rows {', '.join(hits)}" if hits else None

    return check


def _cases_ran(needle: str) -> Callable[[Path], str | None]:
    def check(path: Path) -> str | None:
        ran = [o for name, o in _cases(path) if needle in name and o != "skipped"]
        if not ran:
            return None
        counts = f"{ran.count('passed')} passed, {ran.count('failed')} failed"
        return f"{_rel(path)} ran {len(ran)} {needle} tests ({counts})"

    return check


def _provenance_lacks(field: str) -> Callable[[Path], str | None]:
    def check(path: Path) -> str | None:
        prov = _json(path).get("provenance") or {}
        return None if field in prov else f"{_rel(path)}: its provenance has no `{field}`"

    return check


CLAIMS = (
    Claim("docs/MHC.md", r"tensor-core partials.{0,400}?did not time them", "gpu/mhc*/*.json",
          _timed_at_least("mhc_post_pre", TC_MIN_TOKENS),
          "MHC.md's Not done, until issue 31: the quick bench at 31b5269 timed them at T = 1536"),
    Claim("docs/DSPARK.md", r"[Ss]till to measure: the chain's time", "gpu/**/dspark_draft*.json",
          _shape_timed(re.compile(r"chain5-.*-graph")),
          "DSPARK.md's draft_chain section, until issue 31"),
    Claim("docs/INDEXER.md", r"\bNot yet run on a GPU\b", "gpu/**/*.xml", _cases_ran("test_indexer_stream"),
          "INDEXER.md's indexer_stream verification, until issue 31: the H200 check at aa380db ran it"),
    Claim("docs/SPARSE_MLA.md", r"the stale sha the device copy reported", "gpu/sparse_mla-h200.json",
          _provenance_lacks("stale_sha"), "SPARSE_MLA.md's Measured, until issue 31"),
)  # fmt: skip


def table_contradictions(root: Path = ROOT) -> list[str]:
    out = []
    for claim in CLAIMS:
        text = " ".join(REGION.sub(" ", (root / claim.doc).read_text()).split())
        for m in re.finditer(claim.pattern, text):
            for path in sorted((root / "results").glob(claim.results)):
                why = claim.contradicts(path)
                if why:
                    out.append(f'{claim.doc}: "{m.group(0)[:90]}": {why}')
    return out


# ----------------------------------------------------------------------------- every other sentence
def sentences(text: str) -> list[str]:
    """Prose sentences: rendered regions, code blocks and headings dropped, a table row its own."""
    text = REGION.sub(" ", text)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    out = []
    for para in re.split(r"\n\s*\n", text):
        lines = [ln for ln in para.splitlines() if not ln.lstrip().startswith("#")]
        rows = [ln for ln in lines if ln.lstrip().startswith("|")]
        out += rows
        flat = " ".join(" ".join(ln for ln in lines if ln not in rows).split())
        out += [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`*(])", flat) if s]
    return out


def named_results(sentence: str, index: dict[str, list[Path]], root: Path = ROOT) -> list[Path]:
    """Results files a sentence names: `results/…` paths (a folder: the files in it) or bare names."""
    found: list[Path] = []
    for m in re.finditer(r"results/[\w./-]*\w", sentence):
        path = root / m.group(0)
        found += (
            [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in (".json", ".xml"))
        )
    for m in re.finditer(r"[\w.-]+\.(?:json|xml)\b", re.sub(r"results/[\w./-]*\w", " ", sentence)):
        found += index.get(m.group(0), [])
    return sorted(set(found))


def _names(sentence: str) -> list[str]:
    return [n for n in re.findall(r"`([A-Za-z_][\w.]*)`", sentence) if not n.startswith("results")]


def sentence_contradiction(kind: str, names: list[str], path: Path) -> str | None:
    rows, cases = (_rows(path), []) if path.suffix == ".json" else ([], _cases(path))
    for name in names:
        timed = [r for r in rows if name in (r["op"], r["shape"])]
        matching = [(c, o) for c, o in cases if name in c]
        ran = [o for _, o in matching if o != "skipped"]
        if kind in ("not timed", "not run") and timed:
            return f"{_rel(path)} has {len(timed)} timing rows of `{name}`"
        if kind == "not run" and ran:
            return f"{_rel(path)} ran {len(ran)} tests matching `{name}`"
        if kind == "works" and "failed" in ran:
            return f"{_rel(path)}: {ran.count('failed')} of {len(ran)} tests matching `{name}` failed"
        if kind == "works" and any(r.get("verdict") == "mismatch" for r in timed):
            return f"{_rel(path)}: a `{name}` row's verdict is mismatch"
    return None


def sentence_contradictions(root: Path = ROOT) -> list[str]:
    index: dict[str, list[Path]] = {}
    for path in (root / "results").rglob("*"):
        if path.suffix in (".json", ".xml") and "cells" not in path.parts:
            index.setdefault(path.name, []).append(path)
    out = []
    for doc in sorted((root / "docs").glob("*.md")):
        for sentence in sentences(doc.read_text()):
            kinds = [k for k, rx in KINDS.items() if rx.search(sentence)]
            names = _names(sentence)
            if not kinds or not names:
                continue
            for path in named_results(sentence, index, root):
                for kind in kinds:
                    why = sentence_contradiction(kind, names, path)
                    if why:
                        out.append(f'{doc.relative_to(root).as_posix()}: "{sentence[:90]}…" ({kind}): {why}')
    return out


# ----------------------------------------------------------------------------- tests
def test_table_claims_hold_against_the_results():
    found = table_contradictions()
    assert not found, "prose contradicts the committed results:\n" + "\n".join(found)


def test_claims_that_name_their_results_hold():
    found = sentence_contradictions()
    assert not found, "prose contradicts the results it names:\n" + "\n".join(found)


def test_every_table_row_points_at_existing_results():
    for claim in CLAIMS:
        assert (ROOT / claim.doc).is_file(), claim.doc
        assert sorted(RESULTS.glob(claim.results)), f"{claim.doc}: no results/{claim.results}"


def _tree(tmp_path: Path, doc: str, text: str) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / doc).write_text(text)
    (tmp_path / "results").symlink_to(RESULTS)
    return tmp_path


def test_the_claims_issue_31_found_fail_the_table(tmp_path):
    """Each table row fires on the sentence that stood before issue 31 (the row's origin)."""
    old = {
        "MHC.md": "The tensor-core partials, the output groups, register-held coefficients and the separate "
        "gates CTA were written after H200 run 1; run 2 ran their GPU tests (both paths at T = 128..1536 "
        "and the small-T configs, failures above) but did not time them.",
        "DSPARK.md": "Still to measure: the chain's time, and its capture and replay in a graph.",
        "INDEXER.md": "Mutations fail the tests. Not yet run on a GPU, and the candidate buffer is 128 wide.",
        "SPARSE_MLA.md": "(its provenance: the commit that ran, and the stale sha the device copy reported)",
    }
    root = tmp_path
    (root / "docs").mkdir()
    for name, text in old.items():
        (root / "docs" / name).write_text(text + "\n")
    (root / "results").symlink_to(RESULTS)
    found = table_contradictions(root)
    assert sorted({line.split(":")[0] for line in found}) == sorted(f"docs/{n}" for n in old), found
    assert any("mhc-bench-31b5269/mhc-h200.json times `mhc_post_pre` (ours) at size 1536" in f for f in found)
    assert any("test_indexer_stream tests (3 passed, 3 failed)" in f for f in found)


def test_a_sentence_naming_its_results_is_checked(tmp_path):
    root = _tree(
        tmp_path,
        "X.md",
        "`kv_gather` was not timed (`results/gpu/kv_gather-h200.json`).\n\n"
        "`mhc_post_pre` works: see `mhc-h200-tests-84bf975.xml`, `test_fused_matches_upstream_kernels`.\n\n"
        "`indexer_stream` has not yet run on a GPU (`results/gpu/layout-check-aa380db/gpu-tests.xml`).\n\n"
        "`kv_gather` was timed (`results/gpu/kv_gather-h200.json`): no claim here.\n\n"
        "<!-- report:value file=gpu/kv_gather-h200.json path=x -->`kv_gather` not timed, "
        "results/gpu/kv_gather-h200.json<!-- /report:value -->\n",
    )
    found = sentence_contradictions(root)
    assert len(found) == 3, "\n".join(found)
    assert "(not timed): results/gpu/kv_gather-h200.json has 15 timing rows of `kv_gather`" in found[0]
    assert "(works)" in found[1] and "failed" in found[1]
    assert "(not run)" in found[2] and "ran 7 tests matching `indexer_stream`" in found[2]
