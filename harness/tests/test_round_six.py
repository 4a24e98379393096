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
