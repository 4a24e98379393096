"""Issue 30, open-loop load: the charts a user of vllm bench serve / AIPerf / GuideLLM expects, from
a run's summary.json — latency percentiles and goodput vs offered rate for A and B with CIs,
throughput vs concurrency one line per cell family (never one line across different cells),
prefill vs ISL on a log axis, the certificate's tolerance on nll_deltas.png, the profile's labels;
a chart the run has no cells for is not drawn and says so in one line."""

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from deepinfer_harness.analysis import charts
from deepinfer_harness.analysis.charts import (
    charts_for_run,
    closed_loop_series,
    decode_scaling,
    latency_vs_rate,
    nll_deltas,
    prefill_by_isl,
    rate_frame,
    rate_series,
    run_charts,
    throughput_by_concurrency,
)
from deepinfer_harness.analysis.report import build_report
from deepinfer_harness.cells import format_size
from deepinfer_harness.cli import main
from deepinfer_harness.layout import read_json

from . import synthetic_run
from .synthetic_run import default_timing, write_run

LABELS = {"A": "A: stock", "B": "B: tuned"}
ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "results/bench-ab/tiny-v41-20261202T012214Z"


def drawn_lines(ax, points=2):
    """The data lines of an axes (not error-bar caps, which are marker-only lines)."""
    return [ln for ln in ax.get_lines() if ln.get_linestyle() != "None" and len(ln.get_xdata()) >= points]


def _valid():
    return {"valid": True, "violations": []}


def rate_run(series_id: str, rate: str, variant: str, rep: int, scale: float, offered: object = None) -> dict:
    cell = f"rate-i1k-o128-r{rate}-{series_id}"
    x = (
        offered
        if isinstance(offered, float)
        else math.inf
        if rate == "inf"
        else float(rate.replace("p", "."))
    )
    base = scale * (1.0 + (x if math.isfinite(x) else 16.0))
    row = {"cell_id": cell, "kind": "rate", "variant": variant, "rep": rep, "validity": _valid()}
    row["offered_rate"] = "inf" if rate == "inf" else x
    for name in ("ttft", "tpot", "itl", "e2el"):
        for q, f in ((50, 1.0), (90, 1.5), (99, 2.0)):
            row[f"p{q}_{name}_ms"] = base * f + 0.01 * rep
    row["goodput_req_s"] = 10 / base
    row["slo_attainment"] = 0.5
    row["request_throughput"] = 12 / base
    row["slo"] = {"ttft_ms": 20.0}
    return row


def rate_runs(reps: int = 6) -> pd.DataFrame:
    rows = [
        rate_run(arrival, rate, v, k, 1.0 if v == "A" else 0.8)
        for arrival in ("poisson", "constant")
        for rate in ("1", "2", "4", "inf")
        if not (arrival == "constant" and rate == "inf")
        for v in "AB"
        for k in range(reps)
    ]
    return rate_frame(pd.DataFrame(rows))


def test_rate_series_groups_by_shape_never_across_shapes():
    assert rate_series("rate-i1k-o128-r2-poisson") == rate_series("rate-i1k-o128-rinf-poisson")
    assert rate_series("rate-i1k-o128-r0p5-poisson") == "i1k-o128-poisson"
    assert rate_series("rate-i1k-o128-r1of4max-poisson") == "i1k-o128-poisson"  # a sweep point
    assert rate_series("rate-i1k-o128-r2-gamma-b0p5") != rate_series("rate-i1k-o128-r2-gamma-b2")
    assert rate_series("rate-i1k-o128-r2-poisson-wcode") != rate_series("rate-i1k-o128-r2-poisson")
    assert rate_series("rate-i1k-o128-r2-poisson-d30") != rate_series("rate-i1k-o128-r2-poisson")
    assert rate_series("rate-i1k-o128-r1to8lin-poisson") is None  # a ramp has no single rate
    assert closed_loop_series("decode-i3k-o512-c8-wcode") == "decode code i3k o512"
    assert closed_loop_series("decode-i3k-o512-c1") != closed_loop_series("decode-i1k-o8k-c1")


def test_latency_vs_rate_draws_every_percentile_with_cis_one_line_per_shape_and_arm():
    d = rate_runs()
    ab = pd.DataFrame([{"cell_id": "rate-i1k-o128-r4-poisson", "metric": "p99_ttft_ms", "mark": "-"}])
    fig = latency_vs_rate(d, LABELS, ab)
    titles = [ax.get_title() for ax in fig.axes]
    for name in ("TTFT", "TPOT", "ITL", "E2EL"):
        for q in ("p50", "p90", "p99"):
            assert f"{q} {name}" in titles
    ax = fig.axes[titles.index("p99 TTFT")]
    lines = drawn_lines(ax)
    assert len(lines) == 4  # 2 shapes × 2 arms
    for ln in lines:  # one line is one shape: its x values are distinct rates, y the shape's own means
        xs = list(ln.get_xdata())
        assert xs == sorted(set(xs))
    a_poisson = [ln for ln in lines if ln.get_color() == charts.COLORS["A"] and len(ln.get_xdata()) == 4]
    assert len(a_poisson) == 1
    # inf sits one octave past the largest finite rate, ticked ∞; the mean of 6 reps is the y
    assert list(a_poisson[0].get_xdata()) == [1, 2, 4, 8]
    assert a_poisson[0].get_ydata()[-1] == pytest.approx(17 * 2.0 + 0.025)
    fig.canvas.draw()
    bottom = fig.axes[titles.index("p99 E2EL")]  # shared x: the bottom row carries the ticks
    assert [t.get_text() for t in bottom.get_xticklabels()] == ["1", "2", "4", "∞"]
    # whiskers: the 95 % t interval of 6 runs per point (vertical error-bar segments)
    assert ax.collections and all(len(c.get_segments()) for c in ax.collections)
    assert any(t.get_text() == "-" for t in ax.texts)  # the A/B mark beside B's point
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "A: stock · i1k-o128-poisson" in legend and "B: tuned · i1k-o128-constant" in legend
    plt.close(fig)


def test_no_whisker_below_five_runs():
    fig = latency_vs_rate(rate_runs(reps=2), LABELS)
    ax = fig.axes[0]
    segments = [s for c in ax.collections for s in c.get_segments()]
    assert all(abs(s[0][1] - s[1][1]) == 0 for s in segments)  # zero-length: no interval from 2 runs
    plt.close(fig)


def test_sweep_points_sit_at_their_measured_rate():
    rows = [rate_run("poisson", "1of4max", v, k, 1.0, offered=3.0 + 0.1 * k) for v in "AB" for k in range(2)]
    d = rate_frame(pd.DataFrame(rows))
    fig = latency_vs_rate(d, LABELS)
    xs = [float(ln.get_xdata()[0]) for ln in drawn_lines(fig.axes[0], 1)]
    assert xs == pytest.approx([3.05, 3.05])  # each arm's mean of its runs' recorded offered rates
    plt.close(fig)


def decode_row(workload: str, c: int, v: str, k: int, tok_s: float) -> dict:
    cell = f"decode-i1k-o64-c{c}" + ("" if workload == "prose" else f"-w{workload}")
    return {
        "cell_id": cell,
        "kind": "decode",
        "isl": 1024,
        "osl": 64,
        "concurrency": c,
        "variant": v,
        "rep": k,
        "decode_tok_s": tok_s,
        "mean_tpot_ms": 1000 / tok_s,
        "output_throughput": tok_s * 0.9,
        "median_e2el_ms": 64000 / tok_s,
        "validity": _valid(),
    }


def test_throughput_vs_concurrency_is_one_line_per_workload_never_a_mean_across_cells():
    """Was: decode_scaling averaged every decode cell at one C into one line (prose and code, or a
    long-generation cell, mixed into one mean)."""
    runs = pd.DataFrame(
        [
            decode_row(w, c, v, k, base * c * (1.0 if v == "A" else 1.1))
            for w, base in (("prose", 100.0), ("code", 40.0))
            for c in (1, 2, 4)
            for v in "AB"
            for k in range(2)
        ]
    )
    for fig in (decode_scaling(runs, LABELS), throughput_by_concurrency(runs, LABELS)):
        ax = fig.axes[0]
        lines = drawn_lines(ax, 3)
        assert len(lines) == 4  # 2 workloads × 2 arms
        ys = sorted(tuple(round(y, 6) for y in ln.get_ydata()) for ln in lines)
        scale = 1.0 if "decode" in ax.get_ylabel() else 0.9
        want = sorted(
            tuple(round(base * c * f * scale, 6) for c in (1, 2, 4))
            for base in (100.0, 40.0)
            for f in (1.0, 1.1)
        )
        assert ys == want
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "A: stock · decode code i1k o64" in labels
        plt.close(fig)


def test_prefill_vs_isl_log_axis_one_line_per_kind():
    rows = [
        {
            "cell_id": f"{kind}-i{format_size(isl)}" + ("-c1" if kind == "ttft" else ""),
            "kind": kind,
            "concurrency": 1,
            "isl": isl,
            "variant": v,
            "median_ttft_ms": isl / speed,
            "prefill_tok_s": speed,
            "validity": _valid(),
        }
        for kind, speed in (("prefill-cold", 1000.0), ("ttft", 500.0))
        for isl in (128, 1024)
        for v in "AB"
    ]
    fig = prefill_by_isl(pd.DataFrame(rows), LABELS)
    ax = fig.axes[1]
    assert ax.get_xscale() == "log"
    means = sorted(tuple(ln.get_ydata()) for ln in drawn_lines(ax))
    assert means == [(500.0, 500.0)] * 2 + [(1000.0, 1000.0)] * 2  # never 750: the kinds stay apart
    plt.close(fig)


def test_nll_deltas_draws_the_certificates_tolerances_and_the_runs_own():
    ab = read_json(TINY / "ab.json")
    numerics = pd.DataFrame(ab["numerics"])
    fig = nll_deltas(numerics, {"A": "A: base (patch 00)", "B": "B: deepinfer"}, ab["numeric_certificate"])
    by_title = {ax.get_title(): ax for ax in fig.axes}
    doc = by_title["largest per-document |ΔNLL|"]
    z = by_title["largest per-document |z|"]
    hlines = {ln.get_label(): ln.get_ydata()[0] for ln in doc.get_lines()}
    assert hlines["tolerance nll_doc_abs = 0.5 (given after the run)"] == 0.5
    assert hlines["declared by the run: 0.02"] == 0.02
    assert {ln.get_label(): ln.get_ydata()[0] for ln in z.get_lines()} == {
        "tolerance nll_doc_z = 3 (given after the run)": 3.0
    }
    assert max(p.get_height() for p in doc.patches) == pytest.approx(0.08385609042259645)
    assert "A: base (patch 00) vs B: deepinfer" in fig._suptitle.get_text()
    assert "numeric certificate: ok" in fig._suptitle.get_text()
    plt.close(fig)


def test_nll_deltas_without_a_tolerance_says_so():
    numerics = pd.DataFrame(
        [
            {
                "cell_id": "nll-i32",
                "kind": "nll",
                "ab": [
                    {"pair": "A.r0~B.r0", "dnll_abs_mean": 0.1, "dnll_abs_max": 1.0, "doc_dnll_abs_max": 0.05}
                ],
                "aa": [],
            }
        ]
    )
    fig = nll_deltas(numerics, LABELS, {"status": "incomplete", "tolerances": {}})
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "no nll_doc_abs tolerance declared" in texts
    plt.close(fig)


@pytest.fixture
def load_run(tmp_path, monkeypatch):
    """A synthetic run (synthetic_run.py, every file under the test's control) with an open-loop
    sweep at 1, 2 and inf requests/s, chat cells at C = 1 and 2, and a TTFT SLO."""
    plan = dict(synthetic_run.PLAN)
    plan["rate"] = {"rates": [1.0, 2.0, float("inf")], "arrivals": ["poisson"], "isl": 16, "osl": 4, "n": 6}
    plan["chat"] = {"isl": 16, "osl": 4, "concurrencies": [1, 2], "n": 4, "thinking": False}
    plan["slo"] = {"ttft_ms": 14.0}
    monkeypatch.setattr(synthetic_run, "PLAN", plan)

    def timing(variant, rep, cell_id, index):
        ttft, gap = default_timing(variant, rep, cell_id, index)
        return ttft * (0.9 if variant == "B" else 1.0), gap * 3

    layout = write_run(tmp_path / "run", repetitions=3, timing=timing)
    build_report(layout)
    return layout


def test_a_load_run_draws_its_charts_byte_identically_and_says_what_it_skips(load_run, tmp_path):
    notes: list[str] = []
    written = charts_for_run(load_run.root, tmp_path / "c1", notes)
    names = sorted({p.stem for p in written})
    assert names == ["goodput_vs_rate", "latency_vs_rate", "prefill_by_isl", "throughput_by_concurrency"]
    assert all(p.suffix in (".png", ".svg") for p in written) and len(written) == 8
    assert notes == [
        "run: throughput_ab not drawn: no prefill or decode throughput row",
        "run: decode_scaling not drawn: no valid decode cell",
        "run: ramp_over_time not drawn: no valid ramp cell with a recorded timeline",
        "run: nll_deltas not drawn: no NLL cell with an A/B pair",
    ]
    again = charts_for_run(load_run.root, tmp_path / "c2")
    for a, b in zip(written, again, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name


def test_goodput_is_said_to_be_undefined_without_an_slo(load_run):
    summary, ab = read_json(load_run.summary), read_json(load_run.ab)
    for r in summary["runs"]:
        for key in ("goodput_req_s", "slo_attainment", "slo"):
            r.pop(key, None)
    why = {name: reason for name, reason, _ in run_charts(summary, ab)}
    assert why["goodput_vs_rate"] == "the plan declares no SLO (plan.slo): goodput is not defined"
    assert why["latency_vs_rate"] is None


def test_goodput_chart_names_the_slo_and_the_labels(load_run):
    summary, ab = read_json(load_run.summary), read_json(load_run.ab)
    summary["provenance"]["labels"] = {"A": "stock", "B": "tuned"}
    draw = {name: fn for name, _, fn in run_charts(summary, ab)}
    fig = draw["goodput_vs_rate"]()
    assert "SLO: TTFT ≤ 14 ms" in fig._suptitle.get_text()
    legend = [t.get_text() for t in fig.legends[0].get_texts()]  # one legend, below the panels
    assert "A: stock" in legend and "B: tuned" in legend
    plt.close(fig)


def test_charts_command_prints_one_line_per_chart_not_drawn(load_run, tmp_path, capsys):
    results = load_run.root.parent
    assert main(["charts", "--results", str(results), "--charts", str(tmp_path / "charts")]) == 0
    out = capsys.readouterr()
    assert "run: decode_scaling not drawn: no valid decode cell" in out.err.splitlines()
    assert out.out.strip() == f"8 chart files written under {tmp_path / 'charts'}"


def test_committed_charts_are_what_make_charts_writes(tmp_path):
    """`make charts` on the committed results rewrites the committed charts byte for byte."""
    written = charts.all_charts(ROOT / "results", tmp_path)
    assert written
    for path in written:
        committed = ROOT / "charts" / path.relative_to(tmp_path)
        assert committed.exists(), f"{committed} is not committed"
        assert committed.read_bytes() == path.read_bytes(), f"{committed} differs from make charts"
