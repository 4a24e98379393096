"""Issue 30, beyond the peers: `compare RUN RUN …` puts runs of different profiles or topologies
side by side — the same metrics, each with its CI, each run's own A/B verdict, a markdown table on
stdout, strict JSON and charts 04 (end-to-end throughput per workload and concurrency, bars per
run) and 05 (scaling by GPU count) under --out; bad input is one line and exit 2."""

import json
import math
import statistics
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from deepinfer_harness.analysis.charts import e2e_throughput_by_run, scaling_by_gpus
from deepinfer_harness.analysis.compare import compare
from deepinfer_harness.analysis.intervals import mean_ci, welch_ratio
from deepinfer_harness.analysis.report import build_report
from deepinfer_harness.cli import main
from deepinfer_harness.layout import read_json, write_json

from . import synthetic_run
from .synthetic_run import default_timing, write_run

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "results/bench-ab/smoke"
TINY = ROOT / "results/bench-ab/tiny-v41-20261202T012214Z"
CHAT = "chat-i16-o4-c2"


def strict(text: str):
    def refuse(token):
        raise ValueError(f"non-strict JSON token {token}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def owner_pair(tmp_path, monkeypatch):
    """Two synthetic runs as the owner's two profiles would leave them: ga100x6-tp2pp3 (TP2×PP3,
    6 GPUs) and ga100x8-tp4pp2 (TP4×PP2, 8 GPUs, every token 1.25× sooner), 3 ABBA blocks each
    (6 runs per arm), chat cells at C = 1, 2, 4 and an open-loop cell; B 10 % faster than A."""
    plan = dict(synthetic_run.PLAN)
    plan["chat"] = {"isl": 16, "osl": 4, "concurrencies": [1, 2, 4], "n": 4, "thinking": False}
    monkeypatch.setattr(synthetic_run, "PLAN", plan)
    runs = []
    for name, (tp, pp), speed in (
        ("ga100x6-tp2pp3-synth", (2, 3), 1.0),
        ("ga100x8-tp4pp2-synth", (4, 2), 1.25),
    ):

        def timing(variant, rep, cell_id, index, speed=speed):
            ttft, gap = default_timing(variant, rep, cell_id, index)
            arm = 0.9 if variant == "B" else 1.0
            return ttft * arm / speed, 3 * gap * arm / speed

        layout = write_run(tmp_path / name, repetitions=3, timing=timing)
        manifest = read_json(layout.manifest)
        manifest["profile"]["name"] = name.removesuffix("-synth")
        manifest["profile"]["topology"] |= {"tp": tp, "pp": pp}
        write_json(layout.manifest, manifest)
        build_report(layout)
        runs.append(layout.root)
    return runs


def test_owner_pair_side_by_side_with_cis_verdicts_and_the_scaling(owner_pair, tmp_path, capsys):
    six, eight = owner_pair
    out = tmp_path / "cmp"
    assert main(["compare", str(six), str(eight), "--out", str(out)]) == 0
    std = capsys.readouterr()
    result = strict((out / "compare.json").read_text())
    assert [(r["run"], r["tp"], r["pp"], r["gpus"]) for r in result["runs"]] == [
        ("ga100x6-tp2pp3-synth", 2, 3, 6),
        ("ga100x8-tp4pp2-synth", 4, 2, 8),
    ]
    rows = {(r["cell_id"], r["metric"]): r for r in result["rows"]}
    row = rows[(CHAT, "median_ttft_ms")]
    first, second = row["runs"]
    # each arm: the mean of its 6 valid runs with a t interval, from the run's own summary
    summary = read_json(eight / "summary.json")
    values = [r["median_ttft_ms"] for r in summary["runs"] if r["cell_id"] == CHAT and r["variant"] == "B"]
    assert second["B"]["n"] == 6 and second["B"]["mean"] == pytest.approx(statistics.fmean(values))
    assert second["B"]["ci_low"] < second["B"]["mean"] < second["B"]["ci_high"]
    # the run's own A/B verdict, unchanged from its ab.json
    ab = {(r["cell_id"], r["metric"]): r for r in read_json(eight / "ab.json")["rows"]}[
        (CHAT, "median_ttft_ms")
    ]
    assert second["ab"]["ratio"] == pytest.approx(ab["ratio"]) and second["ab"]["mark"] == ab["mark"]
    assert second["ab"]["ratio"] == pytest.approx(0.9, rel=0.01)
    # against the reference: geometric means, Welch interval; 1.25× sooner → TTFT × 0.8
    ref_values = [
        r["median_ttft_ms"]
        for r in read_json(six / "summary.json")["runs"]
        if r["cell_id"] == CHAT and r["variant"] == "B"
    ]
    vs = second["vs_reference"]["B"]
    want = math.exp(statistics.fmean(map(math.log, values)) - statistics.fmean(map(math.log, ref_values)))
    assert vs["ratio"] == pytest.approx(want) and vs["ratio"] == pytest.approx(0.8, rel=0.02)
    assert vs["ci_low"] < vs["ratio"] < vs["ci_high"] < 1.0
    assert "vs_reference" not in first  # the reference itself
    # stdout: the runs table and one line per run and metric, the same numbers
    text = std.out
    assert "| 2 | ga100x8-tp4pp2-synth | ga100x8-tp4pp2 | baseline | deepinfer | TP4×PP2 | 8 |" in text
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| {CHAT} | median_ttft_ms | ga100x8"))
    assert f"0.{round(vs['ratio'] * 1000):03d}× [" in line and f"`{ab['mark']}`" in line
    assert text == (out / "compare.md").read_text() + "\n"  # stdout is compare.md
    # charts 04, 05 and 06 (both runs have rate cells), PNG and SVG; re-running rewrites the same bytes
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "04_e2e_output_throughput.png",
        "04_e2e_output_throughput.svg",
        "05_scaling_by_gpus.png",
        "05_scaling_by_gpus.svg",
        "06_latency_vs_rate.png",
        "06_latency_vs_rate.svg",
        "compare.json",
        "compare.md",
    ]
    again = tmp_path / "again"
    assert main(["compare", str(six), str(eight), "--out", str(again)]) == 0
    for name in names:
        assert (out / name).read_bytes() == (again / name).read_bytes(), name


def test_scaling_chart_total_and_per_gpu(owner_pair, tmp_path):
    from deepinfer_harness.analysis.compare import closed_loop_frame, load_runs

    runs = load_runs([str(p) for p in owner_pair])
    frame = closed_loop_frame(runs)
    fig = scaling_by_gpus(frame)
    top, bottom = fig.axes[0], fig.axes[len(fig.axes) // 2]
    assert top.get_title() == "chat prose i16 o4"
    lines = {c.get_label(): c.lines[0] for c in top.containers}  # errorbar: (data line, caps, bars)
    per = {c.get_label(): c.lines[0] for c in bottom.containers}
    b2 = lines["B C=2"]
    assert list(b2.get_xdata()) == [0, 1]  # 6 GPUs, then 8
    for k, (run, gpus) in enumerate(((runs[0].name, 6), (runs[1].name, 8))):
        sel = frame[(frame["run"] == run) & (frame["series"] == "chat prose i16 o4")]
        sel = sel[(sel["concurrency"] == 2) & (sel["variant"] == "B")]
        mean = mean_ci(sel["output_throughput"]).mean
        assert b2.get_ydata()[k] == pytest.approx(mean)
        assert per["B C=2"].get_ydata()[k] == pytest.approx(mean / gpus)
    fig.canvas.draw()
    ticks = [t.get_text() for t in bottom.get_xticklabels()]
    assert ticks[0].startswith("6 GPUs · TP2×PP3") and ticks[1].startswith("8 GPUs · TP4×PP2")
    plt.close(fig)


def test_throughput_bars_per_run_and_arm():
    rows = [
        {"run": run, "variant": v, "series": "decode prose i1k o64", "concurrency": c, "output_throughput": x}
        for run, scale in (("r6", 1.0), ("r8", 2.0))
        for v, arm in (("A", 1.0), ("B", 1.5))
        for c in (1, 4)
        for x in (scale * arm * c * 10, scale * arm * c * 10 + 1)
    ]
    labels = {"r6": {"A": "baseline", "B": "deepinfer"}, "r8": {"A": "baseline", "B": "deepinfer"}}
    fig = e2e_throughput_by_run(pd.DataFrame(rows), labels)
    ax = fig.axes[0]
    heights = [round(p.get_height(), 6) for p in ax.patches]
    # per C: r6 A, r6 B, r8 A, r8 B (means of two runs each); C=1 then C=4
    assert heights == [10.5, 15.5, 20.5, 30.5, 40.5, 60.5, 80.5, 120.5]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["r6 · baseline", "r6 · deepinfer", "r8 · baseline", "r8 · deepinfer"]
    plt.close(fig)


def test_committed_runs_side_by_side(tmp_path, capsys):
    """smoke (A/A, CPU) and the tiny V4.1 A/B: both TP1×PP1, so chart 05 says why it is not drawn;
    each run's rows carry its own verdict; the cells one run lacks are named once."""
    out = tmp_path / "cmp"
    assert main(["compare", str(SMOKE), str(TINY), "--out", str(out)]) == 0
    std = capsys.readouterr()
    assert (
        "05_scaling_by_gpus not drawn: every run has the same topology (TP1×PP1, 1 GPU): nothing scales"
        in std.err
    )
    result = strict((out / "compare.json").read_text())
    assert [r["aa_run"] for r in result["runs"]] == [True, False]
    assert result["runs"][1]["certificate"] == "ok"
    rows = {(r["cell_id"], r["metric"]): r for r in result["rows"]}
    nll = rows[("nll-i32", "nll_mean")]["runs"]
    assert nll[0] == {"run": "smoke", "present": False}
    tiny_ab = {(r["cell_id"], r["metric"]): r for r in read_json(TINY / "ab.json")["rows"]}[
        ("nll-i32", "nll_mean")
    ]
    assert nll[1]["ab"]["mark"] == tiny_ab["mark"] and nll[1]["ab"]["ratio"] == pytest.approx(
        tiny_ab["ratio"]
    )
    assert {"cell_id": "nll-i32", "runs": ["tiny-v41-20261202T012214Z"]} in result["cells_not_in_every_run"]
    assert "- only in tiny-v41-20261202T012214Z: greedy-i16-o4-c1, nll-i32" in std.out
    assert sorted(result["charts"]) == ["04_e2e_output_throughput.png", "04_e2e_output_throughput.svg"]
    # two runs per arm: a mean and n, never an interval from two runs
    decode = rows[("decode-i64-o32-c1", "decode_tok_s")]["runs"][0]
    assert decode["A"]["n"] == 2 and decode["A"]["ci_low"] is None


def test_filters_keep_only_matching_rows(capsys):
    _, result, _ = compare([str(SMOKE), str(TINY)], None, ["decode-*"], ["decode_tok_s"])
    assert {(r["cell_id"], r["metric"]) for r in result["rows"]} == {
        (f"decode-i64-o32-c{c}", "decode_tok_s") for c in (1, 2, 4)
    }
    assert "charts" not in result  # no --out: nothing written


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["compare", str(SMOKE)], "error: compare needs at least two run directories, got 1"),
        (["compare"], "error: compare needs at least two run directories, got 0"),
        (["compare", str(SMOKE), "/nonexistent/run"], "error: /nonexistent/run: no such run directory"),
        (["compare", str(SMOKE), str(SMOKE)], f"error: run directory given more than once: {SMOKE}"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, error, capsys):
    assert main(args) == 2
    std = capsys.readouterr()
    assert std.err.splitlines() == [error] and std.out == ""


def test_a_directory_without_summary_is_refused(tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "manifest.json").write_text("{}")
    assert main(["compare", str(SMOKE), str(bare)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: {bare}: no summary.json (not a reported run: `report {bare}` derives it)"]


def test_welch_ratio_and_mean_ci():
    assert mean_ci([1.0, 2.0]).low is None  # two runs: no interval
    ci = mean_ci([10.0, 11.0, 9.0, 10.0, 10.0])
    assert ci.mean == 10.0 and ci.low == pytest.approx(10 - 2.776445 * math.sqrt(0.5) / math.sqrt(5))
    r = welch_ratio([10.0] * 5, [20.0] * 5)
    assert (r.ratio, r.low, r.high) == (pytest.approx(2.0), pytest.approx(2.0), pytest.approx(2.0))
    r = welch_ratio([1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 4.0, 6.0, 8.0, 10.0])
    assert r.ratio == pytest.approx(2.0) and r.low < 2.0 < r.high
    assert welch_ratio([0.0, float("nan")], [1.0]) is None  # no positive finite reference value
