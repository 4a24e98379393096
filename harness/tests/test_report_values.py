"""Issue 30 defects 1 and 7: the report survives any value a record can hold, a metric of 0 is a
mark with its reason, results JSON is strict, no numpy warning reaches stderr, no ratio prints as
inf× or nan×, `!` means only invalid or missing runs, and stdout is the summary, not every row.
Every run here is written by hand (synthetic_run.py): no server, seconds per report."""

import json
import math
import warnings

import numpy as np
import pytest

from deepinfer_harness.analysis import stats
from deepinfer_harness.analysis.report import ab_line
from deepinfer_harness.analysis.stats import RatioCI, aa_noise, decide
from deepinfer_harness.cli import main
from deepinfer_harness.layout import RunKey, read_json

from .synthetic_run import RATE_CELL, TTFT_CELL, default_timing, write_run

MISSING = object()


def zero_tpot_in_b(variant, rep, cell_id, index):
    """Arm B streams the rate cell's tokens in one burst: every TPOT, ITL and their p90/p99 are 0."""
    ttft, gap = default_timing(variant, rep, cell_id, index)
    return (ttft, 0.0) if variant == "B" and cell_id == RATE_CELL else (ttft, gap)


def rows_of(layout):
    return {(r["cell_id"], r["metric"]): r for r in read_json(layout.ab)["rows"]}


def strict(text):
    def refuse(token):
        raise ValueError(f"non-strict JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_a_latency_percentile_of_0_with_enough_pairs_is_a_mark_not_a_crash(tmp_path, capsys):
    """Was: stats.decide took math.log(0) of the two-level p90 TPOT ratio (6 pairs) → ValueError,
    exit 1, no summary.json or ab.md; `report <run>` crashed the same way."""
    layout = write_run(tmp_path / "run", repetitions=3, timing=zero_tpot_in_b)  # 6 A/B pairs
    assert main(["report", str(layout.root)]) == 0
    assert layout.summary.exists() and (layout.root / "ab.md").exists()
    rows = rows_of(layout)
    for metric in ("p90_tpot_ms", "p99_tpot_ms", "mean_tpot_ms", "median_itl_ms"):
        row = rows[(RATE_CELL, metric)]
        assert row["mark"] == "?" and row["ratio"] is None, row
        assert (
            "no pair with a defined B/A ratio" in row["why"]
            and "B = 0 in r0, r1, r2, r3, r4, r5" in row["why"]
        ), row["why"]
    # the cell's other metrics still decide from their pairs
    assert rows[(RATE_CELL, "p90_ttft_ms")]["n_pairs"] == 6


def test_no_numpy_warning_reaches_stderr(tmp_path, capsys):
    """The same run under warnings-as-errors: ln(0) and 0/0 never reach numpy (they printed
    `RuntimeWarning: divide by zero encountered in log` on stderr before the crash)."""
    layout = write_run(tmp_path / "run", repetitions=3, timing=zero_tpot_in_b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["report", str(layout.root)]) == 0
    assert "Warning" not in capsys.readouterr().err


def test_a_zero_in_some_pairs_leaves_those_out_and_names_them(tmp_path):
    def some_zero(variant, rep, cell_id, index):
        ttft, gap = default_timing(variant, rep, cell_id, index)
        return (ttft, 0.0) if variant == "A" and cell_id == RATE_CELL and rep == 4 else (ttft, gap)

    layout = write_run(tmp_path / "run", repetitions=3, timing=some_zero)
    assert main(["report", str(layout.root)]) == 0
    row = rows_of(layout)[(RATE_CELL, "p90_tpot_ms")]
    assert row["n_pairs"] == 5 and row["pairs_left_out"] == "A = 0 in r4", row
    assert "pairs left out (no defined B/A): A = 0 in r4" in row["why"] and row["mark"] != "!"


def _put(data, field, value):
    *parents, last = field.split(".")
    for part in parents:
        data = data[part]
    if value is MISSING:
        data.pop(last, None)
    else:
        data[last] = value


# numeric fields of a request record and of the server's metrics object; list fields get a
# number instead of a list; the identity fields go missing
FIELDS = (
    "t_send_ns", "t_end_ns", "start_time", "http_status", "prompt_len", "max_tokens", "prompt_tokens",
    "output_tokens", "cached_tokens", "server_metrics.time_to_first_token_ms", "server_metrics.queue_time_ms",
    "event_times_ns", "tokens_per_chunk", "events_per_read", "server_metrics", "index", "session", "phase",
)  # fmt: skip


@pytest.mark.parametrize(
    "value", [0, math.inf, -math.inf, math.nan, MISSING], ids=["0", "inf", "-inf", "nan", "missing"]
)
def test_the_report_survives_any_value_a_record_can_hold(tmp_path, value):
    """Each field above takes the value in one record of one run (NaN and Infinity tokens in the
    JSONL, as json.dumps writes them); the report finishes, never raises or warns, and names the
    records it could not time as failed requests of invalid runs."""
    slots = iter(FIELDS)

    def mutate(key, records):
        if key.variant == "B" and key.rep % 2 == 0:  # A's runs and B's odd reps stay as measured
            for record in records[1:]:
                field = next(slots, None)
                if field is not None:
                    _put(record, field, value)

    layout = write_run(tmp_path / "run", repetitions=3, mutate=mutate)
    assert next(slots, None) is None  # every field was set somewhere
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["report", str(layout.root)]) == 0
    summary = strict(layout.summary.read_text())
    assert summary["n_runs"] == 24


def test_server_values_of_0_inf_nan_in_valid_runs(tmp_path):
    """A server's per-request metrics of 0, inf or NaN: no prefill tok/s from a 0 ms TTFT (was
    ZeroDivisionError), no frontend overhead from NaN; every run stays valid and every row decides."""

    def mutate(key, records):
        for i, rec in enumerate(records):
            rec["server_metrics"] = {
                "time_to_first_token_ms": [0.0, math.inf, math.nan][i % 3],
                "queue_time_ms": 0,
            }

    def zero_ttft(variant, rep, cell_id, index):
        return (
            (0.0, 1.0)
            if cell_id == TTFT_CELL and variant == "B"
            else default_timing(variant, rep, cell_id, index)
        )

    layout = write_run(tmp_path / "run", repetitions=3, timing=zero_ttft, mutate=mutate)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["report", str(layout.root)]) == 0
    run = read_json(layout.run_file(RunKey(TTFT_CELL, "B", 0), "summary.json"))
    assert run["validity"]["valid"] and run["median_ttft_ms"] == 0 and run["client_prefill_tok_s"] is None
    assert run["server_ttft_ms"] == 0.0 and run["prefill_tok_s"] is None
    row = rows_of(layout)[(TTFT_CELL, "median_ttft_ms")]
    assert row["mark"] == "?" and "B = 0" in row["why"]


def test_results_json_is_strict_and_a_rate_of_inf_is_a_string_with_its_unit(tmp_path):
    layout = write_run(tmp_path / "run", repetitions=1)
    assert main(["report", str(layout.root)]) == 0
    for path in [*layout.root.rglob("*.json"), *layout.root.rglob("*.jsonl")]:
        for text in path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]:
            data = strict(text)
            json.dumps(data, allow_nan=False)
    summary = read_json(layout.summary)
    rate = next(r for r in summary["runs"] if r["cell_id"] == RATE_CELL)
    assert rate["offered_rate"] == "inf" and rate["rate_unit"] == "requests/s"
    sweep = summary["rate_sweep"][0]
    assert sweep["points"][0]["offered_rate"] == "inf" and sweep["rate_unit"] == "requests/s"
    assert read_json(layout.manifest)["profile"]["plan"]["rate"]["rates"] == ["inf"]


def test_stdout_is_the_summary_not_every_row(tmp_path, capsys):
    layout = write_run(tmp_path / "run", repetitions=3, timing=zero_tpot_in_b)
    assert main(["report", str(layout.root)]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = read_json(layout.ab)["rows"]
    claims = [r for r in rows if r["mark"] in "-+"]
    assert out[0].startswith("A/B: 24 of 24 runs, 0 invalid, 0 missing; marks")
    assert len(out) < len(rows) and len(out) <= len(claims) + 6
    assert all(f"  {r['line']}" in out for r in claims)  # what it claims, row by row
    assert out[-1].startswith(f"every row ({len(rows)}): ") and str(layout.root / "ab.md") in out[-1]
    assert not any("p90_tpot_ms" in line for line in out)  # a '?' row is counted, not printed


@pytest.mark.parametrize("ratio", [math.inf, math.nan, 0.0, -1.0, None])
def test_no_ratio_prints_as_inf_or_nan(ratio):
    arm = {"estimate": 1.0, "sd": None, "n_valid": 1}
    row = {"cell_id": "c", "metric": "m", "a": arm, "b": arm, "ratio": ratio, "n_pairs": 6, "min_pairs": 5,
           "ci_low": math.inf, "ci_high": math.nan, "mark": "?", "why": "w"}  # fmt: skip
    line = ab_line(row)
    assert "B/A n/a" in line and "inf×" not in line and "nan×" not in line and "inf" not in line, line


def test_bang_means_only_invalid_or_missing_runs():
    floor = aa_noise(np.array([0.01, -0.01]))
    ok = {"comparable": True}
    assert decide(None, True, floor, **ok)[0] == "?"  # was '!' "no valid pair" with every run valid
    mark, why = decide(None, True, floor, **ok, left_out="B = 0 in r0, r1")
    assert mark == "?" and why == "no pair with a defined B/A ratio: B = 0 in r0, r1"
    assert decide(None, True, floor, **ok, problems="invalid runs A.r0")[0] == "!"
    for bad in (0.0, math.inf, math.nan):  # never math.log of it
        assert decide(RatioCI(bad, bad, bad, 6), True, floor, **ok)[0] == "?"
    assert decide(RatioCI(0.5, 0.0, 0.7, 6), True, floor, **ok)[0] == "?"


def test_one_percentile_implementation_for_runs_and_bootstrap_rows(monkeypatch):
    """stats.percentile (a run's value) and the two-level bootstrap's per-row percentile are one
    function, numpy's linear interpolation."""
    calls = []
    real = stats.percentile_rows

    def spy(x, q):
        calls.append(np.shape(x))
        return real(x, q)

    monkeypatch.setattr(stats, "percentile_rows", spy)
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert stats.percentile(values, 30) == pytest.approx(np.percentile(values, 30))
    rng = np.random.default_rng(1)
    a = [list(rng.exponential(10.0, 50)) for _ in range(5)]
    stats.two_level_ratio(a, a, 90, resamples=100, seed=0)
    assert (1, 5) in calls and (100, 50) in calls  # a run, then 100 resampled rows of a run
    assert math.isnan(stats.percentile([], 50)) and math.isnan(stats.percentile([1.0, math.nan], 50))


def test_records_are_written_strict_and_read_back_as_numbers(tmp_path):
    from deepinfer_harness.records import JsonlWriter, RequestRecord, read_records

    plp = {"n": 4, "lp": [-1.0, -math.inf, math.nan], "top1": [1, 2, 3], "rank": [1, 1, 1]}
    rec = RequestRecord(
        "nll-i4", "A", 0, 0, 0, prompt_logprobs=plp, server_metrics={"queue_time_ms": math.inf}
    )
    with JsonlWriter(tmp_path / "r.jsonl") as out:
        out.write(rec)
    line = (tmp_path / "r.jsonl").read_text()
    assert strict(line)["prompt_logprobs"]["lp"] == [-1.0, "-inf", None]
    back = read_records(tmp_path / "r.jsonl")[0]
    assert back.prompt_logprobs["lp"][:2] == [-1.0, -math.inf] and back.prompt_logprobs["lp"][2] is None
    assert back.server_metrics == {"queue_time_ms": math.inf} and back.ok
