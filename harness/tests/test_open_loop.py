"""Open loop as complete as `vllm bench serve` / GuideLLM (issue 30): gamma arrivals with vLLM's
burstiness, linear and exponential ramp-up, duration-bounded cells next to count-bounded ones, and
a sweep to saturation whose rates are decided once per run and recorded for resume."""

import hashlib
import itertools
import json
import math
import random
import statistics

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from deepinfer_harness.arrivals import expected_requests, ramp_rate, schedule
from deepinfer_harness.cells import ARRIVALS, Cell, format_cell, parse_cell
from deepinfer_harness.cli import main
from deepinfer_harness.config import Plan, Profile, _build
from deepinfer_harness.layout import RunKey, RunLayout, read_json, write_json
from deepinfer_harness.lengths import arrival_offsets_s
from deepinfer_harness.plan import CellDef, build_cells, rate_seed, session_order
from deepinfer_harness.run import sweep

from .test_client_fake import run_cell
from .test_pipeline_fake import bench, write_profile

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]

# --- cell ids ------------------------------------------------------------------------------------

numbers = st.sampled_from([0.1, 0.25, 0.5, 1.0, 2.0, 3.5, 8.0, 100.0, 1234.5])


@st.composite
def rate_cells(draw):
    arrival = draw(st.sampled_from(ARRIVALS))
    burst = draw(st.sampled_from([0.25, 1.0, 4.0, math.inf])) if arrival == "gamma" else 0.0
    shape = draw(st.sampled_from(["rate", "ramp", "sweep"]))
    fields: dict = {"arrival": arrival, "burstiness": burst}
    if shape == "sweep":
        of = draw(st.integers(2, 51))
        fields |= {"sweep_k": draw(st.integers(1, of - 1)), "sweep_of": of}
    elif shape == "ramp":
        lo, hi = sorted(draw(st.lists(numbers, min_size=2, max_size=2, unique=True)))
        fields |= {"rate": lo, "ramp": draw(st.sampled_from(["linear", "exponential"])), "ramp_end": hi}
    else:
        fields["rate"] = draw(numbers | st.just(math.inf))
    if shape != "sweep" and math.isfinite(fields["rate"]) and draw(st.booleans()):
        fields["duration_s"] = draw(numbers)
    workload = draw(st.sampled_from(["prose", "code"]))
    return Cell("rate", draw(st.integers(1, 9000)), draw(st.integers(1, 2048)), 1, workload, **fields)


@given(rate_cells())
def test_every_rate_shape_round_trips_through_its_id(cell):
    assert parse_cell(format_cell(cell)) == cell


@pytest.mark.parametrize(
    "cell_id, fields",
    [
        ("rate-i1k-o128-r4-gamma-b0p5", {"rate": 4.0, "arrival": "gamma", "burstiness": 0.5}),
        ("rate-i1k-o128-r4-gamma-binf", {"rate": 4.0, "arrival": "gamma", "burstiness": math.inf}),
        (
            "rate-i1k-o128-r1to8exp-poisson",
            {"rate": 1.0, "arrival": "poisson", "ramp": "exponential", "ramp_end": 8.0},
        ),
        (
            "rate-i1k-o128-r0p5to2lin-gamma-b2-d60",
            {
                "rate": 0.5,
                "arrival": "gamma",
                "burstiness": 2.0,
                "ramp": "linear",
                "ramp_end": 2.0,
                "duration_s": 60.0,
            },
        ),
        ("rate-i1k-o128-r2-constant-d0p5", {"rate": 2.0, "arrival": "constant", "duration_s": 0.5}),
        ("rate-i1k-o128-r3of6max-poisson", {"arrival": "poisson", "sweep_k": 3, "sweep_of": 6}),
    ],
)
def test_new_rate_ids(cell_id, fields):
    cell = Cell("rate", 1024, 128, 1, **fields)
    assert format_cell(cell) == cell_id and parse_cell(cell_id) == cell


@pytest.mark.parametrize(
    "bad",
    [
        "rate-i1k-o128-r4-gamma",  # gamma needs its burstiness
        "rate-i1k-o128-r4-poisson-b2",  # burstiness is gamma's only
        "rate-i1k-o128-r8to1lin-poisson",  # a ramp goes up
        "rate-i1k-o128-r6of6max-poisson",  # k < N
        "rate-i1k-o128-r0of6max-poisson",
        "rate-i1k-o128-rinf-poisson-d60",  # all at once has no duration
        "rate-i1k-o128-r4-poisson-d0",
        "rate-i1k-o128-r4-gamma-b0",
        "rate-i1k-o128-r1to8lin-poisson-b1",
    ],
)
def test_bad_rate_ids_are_refused(bad):
    with pytest.raises(ValueError):
        parse_cell(bad)


def test_existing_rate_ids_and_definitions_are_unchanged():
    """Ids and definition sha256 of rate cells written before these shapes (values from the
    harness at 1aa383c). Since `poisson` became vllm bench serve's process, a finite-rate
    `-poisson` cell's definition carries `process` (so a run recorded with the former process,
    now `poisson0`, refuses to resume instead of mixing schedules); without that key it is the
    recorded definition, byte for byte. All at once (rate inf) keeps its sha."""
    legacy = CellDef(
        Cell("rate", 1024, 128, 1, rate=2.0, arrival="poisson"),
        n=100,
        params={"isl": 1024, "osl": 128, "seed": 0, "max_concurrency": None},
    )
    assert legacy.id == "rate-i1k-o128-r2-poisson"
    recorded = "ed3a866f07d54b65b11aec5c96baf16f8604bced4084fce49559457bd8b8787c"
    assert legacy.definition_sha256 != recorded
    former = legacy.definition()
    assert former["cell"].pop("process") == "vllm-0.32.0"
    blob = json.dumps(former, sort_keys=True, separators=(",", ":")).encode()
    assert hashlib.sha256(blob).hexdigest() == recorded
    assert set(former["cell"]) == {
        "kind",
        "isl",
        "osl",
        "concurrency",
        "workload",
        "rate",
        "arrival",
    }
    inf = CellDef(
        Cell("rate", 3072, 512, 1, rate=math.inf, arrival="poisson"),
        n=100,
        params={
            "isl": {"mean": 3072, "std": 1024, "min": 512, "max": 8192},
            "osl": {"mean": 512, "std": 128, "min": 128, "max": 1024},
            "seed": 0,
            "max_concurrency": 16,
        },
    )
    assert inf.definition_sha256 == "18f29ae3a8f59b1da4aad7b7b39a9d2a244193002edaf15e5f256ad30c24c960"


@pytest.mark.parametrize("run", ["tiny-v41-20261202T012214Z"])
def test_committed_runs_plan_the_cells_they_recorded(run):
    """A committed run's plan, rebuilt from its manifest, gives the same ids and sha256 (the
    committed smoke run predates the workload field, so its definitions differed before these
    shapes too; this run's did not)."""
    manifest = json.loads((ROOT / "results" / "bench-ab" / run / "manifest.json").read_text())
    stored = manifest["profile"]
    profile = Profile(
        name=stored["name"], max_model_len=stored["max_model_len"], plan=_build(Plan, stored["plan"], "plan")
    )
    rebuilt = {c.id: c.definition_sha256 for c in build_cells(profile)}
    assert rebuilt == {c["cell_id"]: c["definition_sha256"] for c in manifest["cells"]}


# --- gamma arrivals (vllm bench serve --burstiness) ----------------------------------------------


def _gaps(offsets):
    return [b - a for a, b in itertools.pairwise(offsets)]


def test_legacy_processes_are_bit_for_bit_the_old_ones():
    for arrival in ("poisson0", "constant"):
        cell = Cell("rate", 16, 4, 1, rate=7.0, arrival=arrival)
        assert schedule(cell, 500, 11) == arrival_offsets_s(7.0, arrival, 500, 11)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gaps_have_vllms_shape_and_scale(burstiness):
    """Shape B, scale 1/(R·B): mean 1/R, coefficient of variation 1/√B; a KS test against that
    gamma passes and against the exponential (B = 1) fails when B is not 1. A duration-bounded
    cell has the raw draws (no rescaling), so its gaps are the distribution itself."""
    rate = 5.0
    cell = Cell("rate", 16, 4, 1, rate=rate, arrival="gamma", burstiness=burstiness, duration_s=800.0)
    offsets = schedule(cell, 0, 123)
    gaps = [offsets[0], *_gaps(offsets)]
    assert len(gaps) == pytest.approx(rate * 800, rel=0.1)
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.08)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(burstiness**-0.5, rel=0.1)
    assert stats.kstest(gaps, "gamma", args=(burstiness, 0, 1 / (rate * burstiness))).pvalue > 1e-3
    if burstiness != 1.0:
        assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue < 1e-6


def test_gamma_count_cells_end_at_n_over_r_and_are_seeded():
    """vllm bench serve rescales a fixed-rate gamma schedule so the last request goes at n/R;
    the first request waits one delay too. One seed, one schedule, in both arms."""
    cell = Cell("rate", 16, 4, 1, rate=4.0, arrival="gamma", burstiness=0.5)
    offsets = schedule(cell, 200, 9)
    assert offsets == schedule(cell, 200, 9) and offsets != schedule(cell, 200, 10)
    assert offsets[-1] == pytest.approx(200 / 4.0, rel=1e-12) and offsets[0] > 0
    assert all(g >= 0 for g in _gaps(offsets))
    even = Cell("rate", 16, 4, 1, rate=4.0, arrival="gamma", burstiness=math.inf)
    assert schedule(even, 5, 0) == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.25])


# --- ramp-up (vllm bench serve --ramp-up-strategy) -----------------------------------------------


@pytest.mark.parametrize("strategy", ["linear", "exponential"])
def test_ramp_gives_request_i_vllms_rate(strategy):
    """Request i's rate is S + (E − S)·i/(n − 1) (linear) or S·(E/S)^(i/(n − 1)) (exponential);
    with constant gaps the schedule is exactly Σ 1/R_i, and nothing is rescaled."""
    n, lo, hi = 9, 1.0, 16.0
    cell = Cell("rate", 16, 4, 1, rate=lo, arrival="constant", ramp=strategy, ramp_end=hi)
    expected_rates = [
        lo + (hi - lo) * i / (n - 1) if strategy == "linear" else lo * (hi / lo) ** (i / (n - 1))
        for i in range(n)
    ]
    assert [ramp_rate(strategy, lo, hi, i / (n - 1)) for i in range(n)] == pytest.approx(expected_rates)
    gaps = _gaps(schedule(cell, n, 0))
    assert gaps == pytest.approx([1 / r for r in expected_rates[1:]])
    assert expected_rates[4] == pytest.approx(8.5 if strategy == "linear" else 4.0)


def test_gamma_ramp_speeds_up_and_a_duration_ramp_follows_time():
    cell = Cell("rate", 16, 4, 1, rate=1.0, arrival="gamma", burstiness=1.0, ramp="linear", ramp_end=20.0)
    gaps = _gaps(schedule(cell, 3000, 4))
    assert statistics.fmean(gaps[:300]) > 4 * statistics.fmean(gaps[-300:])  # 1.6/s vs 19.4/s
    timed = Cell(
        "rate", 16, 4, 1, rate=2.0, arrival="constant", ramp="exponential", ramp_end=32.0, duration_s=10
    )
    offsets = schedule(timed, 0, 0)
    assert max(offsets) < 10 and len(offsets) == pytest.approx(expected_requests(timed), rel=0.05)
    assert _gaps(offsets)[-1] == pytest.approx(1 / 32.0, rel=0.05)  # the end rate at the end


# --- profile options: one line naming the field, exit 2 ------------------------------------------


@pytest.mark.parametrize(
    "setting, named",
    [
        ("plan.rate={rates: [1], arrivals: [gamma], burstiness: [0]}", "plan.rate.burstiness"),
        ("plan.rate={rates: [1], arrivals: [gamma], burstiness: [-1]}", "plan.rate.burstiness"),
        ("plan.rate={rates: [1], burstiness: [0.5]}", "plan.rate.burstiness"),  # no gamma arrival
        ("plan.rate={rates: [1], arrivals: [gamma], burstiness: [0.3333333]}", "plan.rate.burstiness"),
        ("plan.rate={rates: [1], arrivals: [gamma], burstiness: [2, 2]}", "plan.rate.burstiness"),
        ("plan.rate={rates: [1], arrivals: [poisson, poisson]}", "plan.rate.arrivals"),
        ("plan.rate={ramps: [{strategy: sine, start_rps: 1, end_rps: 4}]}", "plan.rate.ramps[].strategy"),
        ("plan.rate={ramps: [{strategy: linear, start_rps: 0, end_rps: 4}]}", "plan.rate.ramps[].start_rps"),
        ("plan.rate={ramps: [{strategy: linear, start_rps: 4, end_rps: 4}]}", "plan.rate.ramps[].end_rps"),
        ("plan.rate={ramps: [{strategy: linear, start_rps: 1, end_rps: .inf}]}", "plan.rate.ramps[].end_rps"),
        ("plan.rate={ramps: [{strategy: linear, start_rps: 1, end: 4}]}", "plan.rate.ramps"),
        ("plan.rate={ramps: [{strategy: linear, start_rps: 1}]}", "plan.rate.ramps[0]"),  # no default end
        ("plan.rate={rates: [1], durations_s: [0]}", "plan.rate.durations_s"),
        ("plan.rate={rates: [1], durations_s: [-5]}", "plan.rate.durations_s"),
        ("plan.rate={rates: [.inf], durations_s: [60]}", "plan.rate.durations_s"),
        ("plan.rate={rates: [5000], durations_s: [600]}", "plan.rate.durations_s"),
        ("plan.rate={sweep: {points: -1}}", "plan.rate.sweep.points"),
        ("plan.rate={sweep: {points: 51}}", "plan.rate.sweep.points"),
        ("plan.rate={sweep: {points: 2, knee: 1}}", "plan.rate.sweep"),
        ("plan.rate={rates: [1], n: 4, isl: 4000, sweep: {points: 2}}", "max_model_len"),
    ],
)
def test_bad_open_loop_options_are_one_line_exit_2(setting, named, capsys):
    assert main(["validate", "--profile", "smoke", "--set", setting]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err, err


def _cells_of(capsys, *sets):
    assert main(["cells", "--profile", "smoke", *[x for s in sets for x in ("--set", s)]]) == 0
    return {
        line.split("\t")[0]: int(line.split("\t")[1][2:]) for line in capsys.readouterr().out.splitlines()
    }


def test_the_plan_makes_each_shape_next_to_the_count_cells(capsys):
    cells = _cells_of(
        capsys,
        "plan.rate={rates: [2, .inf], arrivals: [poisson, gamma], burstiness: [0.5, 4], n: 30, isl: 64,"
        " osl: 8, durations_s: [5], ramps: [{strategy: linear, start_rps: 1, end_rps: 4}],"
        " sweep: {points: 2}}",
    )
    rate = {k: v for k, v in cells.items() if k.startswith("rate-")}
    assert {
        "rate-i64-o8-r2-poisson",
        "rate-i64-o8-rinf-poisson",  # all at once once: also the sweep's probe
        "rate-i64-o8-r2-gamma-b0p5",
        "rate-i64-o8-r2-gamma-b4",
        "rate-i64-o8-r2-poisson-d5",
        "rate-i64-o8-r2-gamma-b4-d5",
        "rate-i64-o8-r1to4lin-poisson",
        "rate-i64-o8-r1to4lin-gamma-b0p5-d5",
        "rate-i64-o8-rsync-poisson",  # the sweep's synchronous anchor, once
        "rate-i64-o8-r1of3sweep-poisson",
        "rate-i64-o8-r2of3sweep-gamma-b4",
    } <= set(rate)
    assert not any("rinf-gamma" in k or "rsync-gamma" in k for k in rate)
    assert len(rate) == 2 + 3 * (1 + 1 + 2 + 2)
    # a duration cell sends its seeded schedule's arrivals in [0, D): known before the run
    cell = parse_cell("rate-i64-o8-r2-poisson-d5")
    offsets = schedule(cell, 0, rate_seed(0, cell))
    assert rate["rate-i64-o8-r2-poisson-d5"] == len(offsets) and max(offsets) < 5 <= len(offsets) + 5
    assert rate["rate-i64-o8-r2-poisson"] == 30  # the count cell beside it


def test_gamma_alone_makes_its_all_at_once_cell_and_sweep(capsys):
    cells = _cells_of(
        capsys, "plan.rate={rates: [3], arrivals: [gamma], burstiness: [0.5, 2], n: 4, sweep: {points: 1}}"
    )
    rate = sorted(k for k in cells if k.startswith("rate-"))
    assert rate == [
        "rate-i1k-o128-r1of2sweep-gamma-b0p5",
        "rate-i1k-o128-r1of2sweep-gamma-b2",
        "rate-i1k-o128-r3-gamma-b0p5",
        "rate-i1k-o128-r3-gamma-b2",
        "rate-i1k-o128-rinf-gamma-b0p5",  # the probe: the first process
        "rate-i1k-o128-rsync-gamma-b0p5",  # the synchronous anchor: the first process too
    ]


def test_sweep_points_run_after_their_probe_and_other_orders_stay():
    profile = Profile(name="x", max_model_len=4096)
    profile.plan.rate = _build(Plan, {"rate": {"rates": [1, 3], "n": 4, "sweep": {"points": 3}}}, "").rate
    profile.plan.decode.concurrencies = [1, 2]
    cells = build_cells(profile)
    order = [c.id for c in session_order(cells, 7)]
    points = [i for i, c in enumerate(order) if "sweep-" in c]
    assert len(points) == 3 and points == list(range(len(order) - 3, len(order)))
    assert order.index("rate-i1k-o128-rinf-poisson") < points[0]
    assert order.index("rate-i1k-o128-rsync-poisson") < points[0]
    plain = [c for c in cells if not c.cell.is_sweep_point]
    shuffled = sorted(plain, key=lambda c: c.id)
    random.Random(7).shuffle(shuffled)
    assert session_order(plain, 7) == shuffled  # a plan without a sweep: the order it always had


# --- running them against the fake server --------------------------------------------------------


def test_duration_cell_sends_its_schedule_and_says_how_many(fake, tmp_path):
    cell = Cell("rate", 16, 4, 1, rate=40.0, arrival="gamma", burstiness=0.5, duration_s=0.5)
    params = {"isl": 16, "osl": 4, "seed": 0}
    n = len(schedule(cell, 0, rate_seed(0, cell)))
    _, summary = run_cell(fake, tmp_path, cell, n=n, warmup=0, params=params)
    assert summary["validity"]["valid"], summary["validity"]
    assert summary["sent_requests"] == n == summary["completed"] and summary["duration_bound_s"] == 0.5
    assert summary["burstiness"] == 0.5 and summary["offered_rate"] == 40.0
    ramp = Cell("rate", 16, 4, 1, rate=20.0, arrival="poisson", ramp="exponential", ramp_end=80.0)
    _, ramped = run_cell(fake, tmp_path / "r", ramp, n=12, warmup=0, params=params)
    assert ramped["validity"]["valid"] and ramped["offered_rate"] is None
    assert (ramped["ramp"], ramped["ramp_start_rps"], ramped["ramp_end_rps"]) == ("exponential", 20.0, 80.0)


SWEEP_PLAN = {
    "rate": {"rates": [], "n": 6, "isl": 16, "osl": 4, "sweep": {"points": 2}, "max_concurrency": 3},
}


def test_sweep_decides_once_records_and_resumes_to_the_same_rates(fake, tmp_path, capsys):
    profile = write_profile(tmp_path, fake.url, plan=SWEEP_PLAN)
    assert bench(tmp_path, profile) == 0
    layout = RunLayout(tmp_path / "results" / "fake")
    manifest = read_json(layout.manifest)
    decision = manifest["sweeps"]["rate-i16-o4-rinf-poisson"]
    probe = read_json(layout.run_file(RunKey("rate-i16-o4-rinf-poisson", "A", 0), "summary.json"))
    assert decision["probe_run"] == "A.r0" and decision["max_rate"] == probe["request_throughput"]
    sync = read_json(layout.run_file(RunKey("rate-i16-o4-rsync-poisson", "A", 0), "summary.json"))
    assert decision["sync_run"] == "A.r0" and decision["sync_rate"] == sync["request_throughput"]
    low, top = decision["sync_rate"], decision["max_rate"]
    rates = {
        c: low + (top - low) * k / 3
        for c, k in (("rate-i16-o4-r1of3sweep-poisson", 1), ("rate-i16-o4-r2of3sweep-poisson", 2))
    }
    assert decision["rates"] == pytest.approx(rates)
    for cell_id, rate in rates.items():  # every session, both arms, at the recorded rate
        for v, k in (("A", 0), ("B", 0), ("B", 1), ("A", 1)):
            facts = read_json(layout.run_file(RunKey(cell_id, v, k), "cell.json"))
            assert facts["arrivals"]["offered_rate"] == pytest.approx(rate)
    summary = read_json(layout.summary)
    verdicts = {v["cell_id"]: v for v in summary["rate_verdicts"]}
    assert verdicts["rate-i16-o4-r1of3sweep-poisson"]["offered_rate"] == pytest.approx(
        rates["rate-i16-o4-r1of3sweep-poisson"]
    )
    assert verdicts["rate-i16-o4-r2of3sweep-poisson"]["verdict"]["request_throughput"]["mark"] in "?~-+"
    assert summary["sweeps"] == manifest["sweeps"]
    json.loads(layout.summary.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict {c}"))
    assert verdicts["rate-i16-o4-rinf-poisson"]["offered_rate"] == "inf"  # strict: a string, unit beside
    assert [p["offered_rate"] for p in summary["rate_sweep"][0]["points"]][-1] == "inf"
    md = (layout.root / "ab.md").read_text()
    assert "## A/B by offered rate" in md and "r2of3sweep" in md

    # resume after losing two sweep runs: the same recorded rates, never measured again
    for key in (
        RunKey("rate-i16-o4-r2of3sweep-poisson", "B", 1),
        RunKey("rate-i16-o4-r1of3sweep-poisson", "A", 0),
    ):
        for path in layout.run_files(key):
            path.unlink()
    assert bench(tmp_path, profile) == 0
    again = read_json(layout.manifest)["sweeps"]
    assert again == manifest["sweeps"]
    facts = read_json(layout.run_file(RunKey("rate-i16-o4-r2of3sweep-poisson", "B", 1), "cell.json"))
    assert facts["arrivals"]["offered_rate"] == pytest.approx(rates["rate-i16-o4-r2of3sweep-poisson"])

    # runs of one point sent at different rates are not compared (x), never averaged together
    path = layout.run_file(RunKey("rate-i16-o4-r1of3sweep-poisson", "B", 0), "cell.json")
    facts = read_json(path)
    facts["arrivals"]["offered_rate"] *= 2
    write_json(path, facts)
    capsys.readouterr()
    assert main(["report", str(layout.root)]) == 0
    rows = [r for r in read_json(layout.ab)["rows"] if r["cell_id"] == "rate-i16-o4-r1of3sweep-poisson"]
    assert rows and all(r["mark"] == "x" for r in rows)


def test_sweep_without_a_valid_probe_leaves_its_points_missing(fake, tmp_path, capsys):
    profile = write_profile(tmp_path, fake.url, plan=SWEEP_PLAN)
    fake.configure(mode="error_after_200", fail_after_events=1)  # every run invalid, the probe too
    assert bench(tmp_path, profile) == 4
    layout = RunLayout(tmp_path / "results" / "fake")
    assert "sweeps" not in read_json(layout.manifest)
    missing = read_json(layout.summary)["missing_runs"]
    assert sorted(missing) == sorted(
        f"rate-i16-o4-r{k}of3sweep-poisson/{t}" for k in (1, 2) for t in ("A.r0", "A.r1", "B.r0", "B.r1")
    )
    assert "has no valid run yet" in capsys.readouterr().err
    fake.configure()
    assert bench(tmp_path, profile) == 0  # resume: the probe re-run is valid, the points follow
    decision = read_json(layout.manifest)["sweeps"]["rate-i16-o4-rinf-poisson"]
    assert decision["probe_run"] == "A.r0" and not read_json(layout.summary)["missing_runs"]


def test_decision_takes_the_first_valid_probe_run_in_schedule_order(tmp_path):
    layout = RunLayout(tmp_path / "run")
    probe = "rate-i16-o4-rinf-poisson"
    schedule_rows = [{"variant": v, "rep": r} for v, r in (("A", 0), ("B", 0), ("B", 1), ("A", 1))]
    write_json(layout.manifest, {"schedule": schedule_rows})
    point = CellDef(parse_cell("rate-i16-o4-r1of4max-poisson"), n=4, params={"sweep_probe": probe})

    def probe_run(variant, rep, valid, throughput):
        summary = {"validity": {"valid": valid}, "request_throughput": throughput}
        write_json(layout.run_file(RunKey(probe, variant, rep), "summary.json"), summary)

    assert sweep.rate_for(layout, point, [point]) is None  # no probe run yet: not decided
    probe_run("A", 0, False, 50.0)  # invalid: never the measure
    probe_run("B", 1, True, 30.0)
    probe_run("B", 0, True, 20.0)  # B.r0 comes before B.r1 in the schedule
    assert sweep.rate_for(layout, point, [point]) == pytest.approx(5.0)
    probe_run("A", 0, True, 80.0)  # a later valid run changes nothing once decided
    assert sweep.rate_for(layout, point, [point]) == pytest.approx(5.0)
    assert read_json(layout.manifest)["sweeps"][probe]["probe_run"] == "B.r0"


def test_the_commented_profile_example_is_valid(capsys):
    """ga100x6-tp2pp3.yaml carries every open-loop option as a comment (off, so its cells keep
    their ids); uncommented, it validates and makes each shape."""
    text = (ROOT / "harness" / "profiles" / "ga100x6-tp2pp3.yaml").read_text().splitlines()
    start = text.index("  # rate:")
    block = []
    for line in text[start:]:
        if not line.startswith("  #   ") and line != "  # rate:":
            break
        block.append(line.replace("# ", "", 1))
    example = yaml.safe_load("\n".join(block))["rate"]
    assert main(["cells", "--profile", "ga100x6-tp2pp3", "--set", f"plan.rate={json.dumps(example)}"]) == 0
    ids = [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()]
    rate = [i for i in ids if i.startswith("rate-")]
    parts = ("-gamma-b0p5", "-gamma-b2", "r1to8lin", "-d300", "r4of5sweep", "rinf-poisson", "rsync-poisson")
    for part in parts:
        assert any(part in i for i in rate), part
