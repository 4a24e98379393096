"""Every rendered region of README.md, docs/*.md and docker/README.md equals what results/ gives."""

import json
import re
import shutil
import subprocess
import sys

import pytest
import report
from conftest import ROOT

SCRIPT = ROOT / "scripts" / "report.py"


def _check(root) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--root", str(root)], capture_output=True, text=True
    )


def test_rendered_regions_match_the_results():
    proc = _check(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_documents_have_regions():
    kinds = {m.group("kind") for p in report.documents(ROOT) for m in report.REGION.finditer(p.read_text())}
    assert {"rows", "targets", "setup"} <= kinds


@pytest.fixture
def tree(tmp_path):
    """A copy of the documents and the results they render from (a bench-ab run's bulk left out)."""
    for rel in ("README.md", "docs", "docker/README.md", "results"):
        src, dst = ROOT / rel, tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("cells", "logs", "*.prom.gz"))
        else:
            shutil.copy(src, dst)
    return tmp_path


def test_a_hand_edited_number_in_a_region_fails(tree):
    readme = tree / "docs" / "RESULTS.md"
    text = readme.read_text()
    start = text.index("<!-- report:rows file=gpu/kv_gather-h200.json")
    row = text.index("| bs128 |", start)
    end = text.index("\n", row)
    cells = text[row:end].split(" | ")
    cells[2] = cells[2] + "1"  # one digit more in the DeepInfer µs cell, whatever the run measured
    readme.write_text(text[:row] + " | ".join(cells) + text[end:])
    proc = _check(tree)
    assert proc.returncode == 1 and "docs/RESULTS.md: report:rows file=gpu/kv_gather-h200.json" in proc.stdout


def test_each_rendered_region_has_one_home():
    """Issue 39: five tables were rendered both in docs/RESULTS.md and in their topic doc."""
    assert not report.duplicate_regions(ROOT), "rendered in two documents (keep one, point at it):\n" + (
        "\n".join(report.duplicate_regions(ROOT))
    )


def test_a_region_rendered_in_two_documents_is_found(tree):
    dspark = (tree / "docs" / "DSPARK.md").read_text()
    m = next(m for m in report.REGION.finditer(dspark) if m.group("kind") == "targets")
    # the same arguments in another order are the same table
    marker = "<!-- report:targets " + " ".join(reversed(m.group("args").split())) + " -->"
    readme = tree / "docs" / "RESULTS.md"
    readme.write_text(readme.read_text() + f"\n{marker}{m.group('body')}<!-- /report:targets -->\n")
    assert report.duplicate_regions(tree) == [
        "report:targets file=gpu/dspark_draft-h200.json: docs/DSPARK.md, docs/RESULTS.md"
    ]


def _headline(tree, op: str) -> str:
    return next(ln for ln in (tree / "README.md").read_text().splitlines() if ln.startswith(f"| `{op}`"))


def test_a_changed_result_fails_until_rendered(tree):
    before = _headline(tree, "kv_gather")
    path = tree / "results/gpu/kv_gather-h200.json"
    doc = json.loads(path.read_text())
    row = next(r for r in doc["rows"] if r["impl"] == "deepinfer" and r["size"] == 49152)
    row["us"] = round(row["us"] * 2, 3)
    path.write_text(json.dumps(doc))
    assert _check(tree).returncode == 1
    subprocess.run([sys.executable, str(SCRIPT), "--root", str(tree)], check=True, capture_output=True)
    assert _check(tree).returncode == 0
    assert f"| {report.num(row['us'])} |" in (tree / "docs" / "RESULTS.md").read_text()
    assert _headline(tree, "kv_gather") != before  # README's headline span follows the JSON too


def test_headline_spans_ratios_over_shapes_and_refuses_a_missing_op(tree):
    res = report.Results(tree)
    rel = "gpu/kv_gather-h200.json"
    rows = [r for r in res.json(rel)["rows"] if r["op"] == "kv_gather"]
    us = {(r["shape"], r["size"], r["impl"]): r["us"] for r in rows}
    ups = [us[(sh, sz, "upstream")] / v for (sh, sz, i), v in us.items() if i == "deepinfer"]
    line = report.render_headline(res, {"files": rel, "ops": "kv_gather"}).splitlines()[-1]
    assert line.startswith("| `kv_gather` | DeepInfer")
    assert f"{min(ups):.2f}–{max(ups):.2f}× ({len(ups)})" in line
    with pytest.raises(report.ReportError, match="no timed rows of op"):
        report.render_headline(res, {"files": rel, "ops": "kv_gather,nope"})


def test_a_bad_marker_fails_in_one_line(tree):
    doc = tree / "docs" / "OPERATORS.md"
    doc.write_text(doc.read_text() + "\n<!-- report:nope file=x.json -->\n<!-- /report:nope -->\n")
    proc = _check(tree)
    assert proc.returncode == 2 and "unknown report kind 'nope'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    doc.write_text(doc.read_text().replace("report:nope file=x.json", "report:targets file=missing.json"))
    doc.write_text(doc.read_text().replace("/report:nope", "/report:targets"))
    proc = _check(tree)
    assert proc.returncode == 2 and "results/missing.json: no such file" in proc.stderr


def test_number_formatting():
    assert report.num(2158.6) == "2,158.6" and report.num(7.42) == "7.42" and report.num(5) == "5"
    assert report.ratio(109.9, 28.3) == "3.88×" and report.ratio(None, 1.0) == "–"
    assert report.size_label(49152) == "48K" and report.size_label(1 << 20) == "1M"
    assert report.size_label(1536) == "1536"


def test_image_smoke_figures_render_from_their_json(tree):
    (tree / "results" / "image-smoke-cold.json").write_text(json.dumps({
        "cache": "cold",
        "stages": [{"name": "docker build stage base", "seconds": 187.4, "steps_run": 5, "steps_cached": 0,
                    "status": "ok"}],
        "images": [{"tag": "x:baseline", "id": "sha256:" + "ab" * 32, "size_bytes": 9_893_849_330}],
    }))  # fmt: skip
    assert _check(tree).returncode == 1  # docker/README.md's region now differs
    subprocess.run([sys.executable, str(SCRIPT), "--root", str(tree)], check=True, capture_output=True)
    text = (tree / "docker" / "README.md").read_text()
    assert "| image-smoke-cold.json | cold | docker build stage base | 187 | 5 / 0 | ok |" in text
    assert "9.89 GB" in text and "`sha256:ababababab" in text


def test_records_fill_missing_columns_and_refuse_an_empty_selection(tree):
    res = report.Results(tree)
    out = report.render_records(res, {"file": "gpu/indexer-h200.json", "path": "results", "prefix": "decode_",
                                      "columns": "logits_us,upstream_triton_fp8_logits_us"})  # fmt: skip
    assert "| 1024K_r48 |" in out and out.splitlines()[-1].endswith("| – |")
    with pytest.raises(report.ReportError, match=r"no results\.nope"):
        report.render_records(res, {"file": "gpu/indexer-h200.json", "path": "results", "prefix": "nope",
                                    "columns": "logits_us"})  # fmt: skip


# Measured sections whose figures the renderer owns: outside its regions (and code), no measured
# number — no decimal, no µs / ms / × / % / TB/s / GB figure — may be written by hand.
MEASURED_SECTIONS = {
    "README.md": ("## Headline results", "## Topologies"),
    "docs/RESULTS.md": ("# Results on the H200", None),
    "docs/SPARSE_MLA.md": ("## Measured", None),
    "docs/INDEXER.md": ("* H200 (**not our pins**", "## Wiring at the DeepInfer level"),
    "docs/DSPARK.md": ("## Measured", "Next GPU run"),
    "docker/README.md": ("## Measured", None),
}
HAND_NUMBER = re.compile(
    r"(?<![\d.])\d+\.\d+(?![\d.])"  # a decimal, not a dotted version (0.32.0)
    r"|\b\d[\d,.]*\s?(?:µs|ms|×|x\b|%|TB/s|GB/s|GB|MB|MiB|GiB|min\b|s\b)"  # a figure with its unit
)


def hand_numbers(text: str) -> list[str]:
    text = report.REGION.sub("", text)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [m.group(0) for m in HAND_NUMBER.finditer(text)]


@pytest.mark.parametrize("rel", sorted(MEASURED_SECTIONS))
def test_measured_sections_hold_no_hand_written_figures(rel):
    start, end = MEASURED_SECTIONS[rel]
    text = (ROOT / rel).read_text()
    section = text[text.index(start) : text.index(end) if end else None]
    assert not hand_numbers(section), f"{rel}: figures outside report regions: {hand_numbers(section)}"


def test_the_hand_number_check_can_fail():
    assert hand_numbers("took 13.0 µs, 2.2× base <!-- report:x -->1.5 µs<!-- /report:x --> `8.0`") == [
        "13.0", "2.2"
    ]  # fmt: skip


def test_issue_31_renderers_read_the_committed_results():
    """junit match=, junit-new-failures, compile-count, series and span on the files the docs cite."""
    res = report.Results(ROOT)
    aa = "gpu/layout-check-aa380db/gpu-tests.xml"
    assert report.render_junit(res, {"file": aa, "match": "test_indexer_stream::"}) == (
        "3 passed, 3 failed, 0 skipped of 6"
    )
    failures = report.render_junit_failures(res, {"file": aa, "match": "test_indexer_stream::"})
    assert failures.count("cannot be accessed from Triton") == 3
    with pytest.raises(report.ReportError, match="no testcase matching 'nope'"):
        report.render_junit(res, {"file": aa, "match": "nope"})
    new = {"file": "gpu/layout-check-80507a2/mhc-tests.xml", "base": "gpu/mhc-h200-tests-84bf975.xml"}
    assert report.render_junit_new_failures(res, new) == "10 more fail (1 to 22 elements)"
    count = report.render_compile_count(res, {"file": "sm80-compile.json", "prefix": "indexer."})
    assert count.startswith("16 kernels (`indexer.*`) compile for sm_80, sm_86 and sm_89: 0 spill bytes")
    series = {"file": "gpu/kv_gather-h200.json", "path": "results.gather", "field": "pct_of_same_size_copy",
              "by": "tokens", "unit": "%"}  # fmt: skip
    assert report.render_series(res, series).startswith("62.5 % (4K), 77.5 % (16K), 87.1 % (48K)")
    span = {"file": "bench-ab/smoke/summary.json", "path": "runs", "field": "loop_lag.loop_lag_p99_ms",
            "unit": "ms", "of": "runs"}  # fmt: skip
    assert report.render_span(res, span) == "1.0–4.6 ms over 40 runs"


def test_run_wall_is_the_manifests_span_and_refuses_a_run_without_one(tree):
    res = report.Results(tree)
    rel = "bench-ab/smoke-20261205T104736Z/manifest.json"
    doc = res.json(rel)
    minutes = (doc["ended_at"] - doc["started_at"]) / 60
    assert report.render_run_wall(res, {"file": rel}) == f"{minutes:.1f} min"
    (tree / "results" / "bench-ab" / "bad.json").write_text(json.dumps({"started_at": 5.0}))
    with pytest.raises(report.ReportError, match="no started_at / ended_at"):
        report.render_run_wall(res, {"file": "bench-ab/bad.json"})
