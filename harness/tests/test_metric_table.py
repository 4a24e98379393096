"""Issue 24 item 5: every metric declared once (metric_table.py); the compared rows, their order,
the parsing of a key back to its metric, the default δ and the runs.csv columns derive from it."""

import pytest

from deepinfer_harness.analysis.ab import metrics_for
from deepinfer_harness.cells import KINDS
from deepinfer_harness.config import AB
from deepinfer_harness.metric_table import (
    METRICS,
    RUN_COLUMNS,
    delta_name,
    higher_is_better,
    parse_key,
    per_request_latency,
)

# The rows each kind compared before the table existed (ab.COMPARED_METRICS at 13fc43b), in order:
# ab.json, ab.md and ab.csv list rows in this order, so the derivation must keep it.
BEFORE = {
    "prefill-cold": ["median_ttft_ms", "prefill_tok_s", "client_prefill_tok_s"],
    "ttft": ["median_ttft_ms", "p99_ttft_ms", "frontend_overhead_ms"],
    "decode": [
        "decode_tok_s",
        "mean_tpot_ms",
        "decode_steps_per_s",
        "mean_tokens_per_chunk",
        "spec_decode_acceptance_length",
        "ttft_under_load_ms",
        "median_itl_ms",
        "p99_itl_ms",
        "median_e2el_ms",
    ],
    "nll": ["nll_mean"],
    "greedy": ["mean_tpot_ms", "median_e2el_ms"],
    "rate": [
        "request_throughput",
        "output_throughput",
        "median_ttft_ms",
        "mean_tpot_ms",
        "median_itl_ms",
        "median_e2el_ms",
    ],
    "prefix": ["median_ttft_ms", "mean_tpot_ms", "median_e2el_ms", "prefix_cache_hit_rate"],
    "chat": ["median_ttft_ms", "mean_tpot_ms", "median_itl_ms", "median_e2el_ms"],
}


def test_each_kind_compares_what_it_did_in_the_same_order():
    assert set(BEFORE) == set(KINDS)
    for kind, rows in BEFORE.items():
        assert metrics_for(kind, [], (50.0,)) == rows, kind


def test_percentiles_goodput_and_positions_follow_the_fixed_rows():
    runs = [
        {
            "goodput_req_s": 1.0,
            "slo_attainment": 1.0,
            "spec_decode_accept_p1": 0.5,
            "spec_decode_accept_p0": 1,
        }
    ]
    decode = metrics_for("decode", runs, (50.0, 90.0, 99.0))
    assert decode[len(BEFORE["decode"]) :] == [
        "p90_itl_ms",  # p99_itl_ms is a fixed row already
        "p90_e2el_ms",
        "p99_e2el_ms",
        "goodput_req_s",
        "slo_attainment",
        "spec_decode_accept_p0",
        "spec_decode_accept_p1",
    ]
    assert metrics_for("nll", runs, (50.0, 90.0)) == ["nll_mean"]  # no goodput, no percentiles
    assert metrics_for("rate", [], (90.0,))[-4:] == [
        "p90_ttft_ms",
        "p90_tpot_ms",
        "p90_itl_ms",
        "p90_e2el_ms",
    ]


@pytest.mark.parametrize(
    ("key", "higher", "delta", "latency", "quantile"),
    [
        ("median_ttft_ms", False, "ttft_ms", None, None),
        ("p99.9_ttft_ms", False, "p99.9_ttft_ms", "ttft", 99.9),
        ("p95_itl_ms", False, "p95_itl_ms", None, 95.0),  # ITL: one statistic per run
        ("mean_tokens_per_chunk", True, "tokens_per_chunk", None, None),
        ("decode_tok_s", True, "decode_tok_s", None, None),
        ("spec_decode_accept_p3", True, "spec_decode_accept_p3", None, None),
        ("ttft_under_load_ms", False, "ttft_under_load_ms", None, None),
        ("std_ttft_ms", False, "std_ttft_ms", None, None),  # undeclared: a time, lower is better
    ],
)
def test_a_key_parses_back_to_its_declaration(key, higher, delta, latency, quantile):
    assert higher_is_better(key) is higher
    assert delta_name(key) == delta
    assert per_request_latency(key) == latency
    assert parse_key(key).quantile == quantile


def test_default_deltas_and_run_columns_come_from_the_table():
    assert AB().deltas == {"decode_tok_s": 0.02, "ttft_ms": 0.03}
    identity = {"cell_id", "variant", "rep", "session", "completed", "failed", "valid"}
    counts = {"prefix_cache_queries", "prefix_cache_hits", "server_generation_tokens", "offered_rate"}
    lengths = {"isl_mean", "isl_std", "osl_mean", "osl_std"}
    metric_columns = [c for c in RUN_COLUMNS if c not in identity | counts | lengths]
    assert all(parse_key(c).metric is not None for c in metric_columns), metric_columns
    assert len(RUN_COLUMNS) == len(set(RUN_COLUMNS)) == 24
    assert all(m.compared or m.name == "itl_per_token_ms" for m in METRICS.values())
