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
from deepinfer_harness.layout import RunLayout, write_json
from deepinfer_harness.lengths import arrival_offsets_s
from deepinfer_harness.manifest import DefinitionMismatch, init_manifest
from deepinfer_harness.plan import CellDef, abba_schedule

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
