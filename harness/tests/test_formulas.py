import math

import numpy as np
import pytest

from deepinfer_harness.analysis.metrics import (
    frontend_overhead_ms,
    gaps_ns,
    inflight_fraction,
    itl_per_token_ns,
    stream_decode_rates,
    tpot_ns,
    ttft_ns,
    window_counts,
)
from deepinfer_harness.analysis.run_summary import spec_decode
from deepinfer_harness.analysis.stats import (
    MIN_PAIRS,
    RatioCI,
    aa_noise,
    bootstrap_ratio,
    decide,
    mde,
    pairs_needed,
    percentile,
)
from deepinfer_harness.records import RequestRecord

MS = 1_000_000


def rec(times_ms, ks, n, t_send_ms=0, t_end_ms=None, **kw):
    return RequestRecord(
        cell_id="decode-i1k-o8-c1",
        variant="A",
        rep=0,
        session=0,
        index=0,
        t_send_ns=t_send_ms * MS,
        event_times_ns=[t * MS for t in times_ms],
        tokens_per_chunk=ks,
        output_tokens=n,
        max_tokens=n,
        t_end_ns=(t_end_ms if t_end_ms is not None else times_ms[-1]) * MS,
        **kw,
    )


def test_per_request_formulas_by_hand():
    # events at 100, 130, 170, 190 ms carrying 1, 3, 2, 2 tokens; N = 8
    r = rec([100, 130, 170, 190], [1, 3, 2, 2], 8, t_send_ms=10)
    assert ttft_ns(r) == 90 * MS
    assert tpot_ns(r) == pytest.approx((190 - 100) / 7 * MS)
    assert gaps_ns(r) == [30 * MS, 40 * MS, 20 * MS]
    assert itl_per_token_ns(r) == pytest.approx([10 * MS] * 3 + [20 * MS] * 2 + [10 * MS] * 2)
    assert sum(itl_per_token_ns(r)) / 7 == pytest.approx((190 - 100) / (8 - 1) * MS)
    rates = stream_decode_rates(r)
    assert rates["decode_tok_s"] == pytest.approx(7 / 0.090)
    assert rates["step_rate"] == pytest.approx(3 / 0.090)
    assert rates["tokens_per_step"] == pytest.approx(7 / 3)
    assert rates["decode_tok_s"] == pytest.approx(rates["step_rate"] * rates["tokens_per_step"])


def test_frontend_overhead():
    r = rec([50], [1], 1, server_metrics={"time_to_first_token_ms": 30.0, "queue_time_ms": 5.0})
    assert frontend_overhead_ms(r) == pytest.approx(15.0)


def test_window_counts_exclude_first_event_and_outside():
    a = rec([100, 200, 300, 400], [1, 2, 2, 2], 7)
    b = rec([250, 350, 450], [1, 4, 4], 9)
    tokens, events = window_counts([a, b], 150 * MS, 360 * MS)
    # a: 200 (2) + 300 (2); b: first event 250 excluded, 350 (4)
    assert (tokens, events) == (8, 3)


def test_inflight_fraction():
    a = rec([10], [1], 1, t_send_ms=0, t_end_ms=100)
    b = rec([60], [1], 1, t_send_ms=50, t_end_ms=100)
    assert inflight_fraction([a, b], 2, 0, 100 * MS) == pytest.approx(0.5)
    assert inflight_fraction([a, b], 1, 0, 100 * MS) == pytest.approx(1.0)


def test_spec_decode_from_counter_deltas():
    d = {
        "vllm:spec_decode_num_drafts_total": 100.0,
        "vllm:spec_decode_num_draft_tokens_total": 500.0,
        "vllm:spec_decode_num_accepted_tokens_total": 250.0,
        **{
            f"vllm:spec_decode_num_accepted_tokens_per_pos_total{{position={i}}}": v
            for i, v in enumerate([90.0, 70.0, 50.0, 30.0, 10.0])
        },
    }
    s = spec_decode(d)
    assert s["spec_decode_acceptance_length"] == pytest.approx(3.5)
    assert s["spec_decode_acceptance_rate"] == pytest.approx(50.0)
    assert s["spec_decode_per_position_acceptance_rates"] == pytest.approx([0.9, 0.7, 0.5, 0.3, 0.1])
    assert s["spec_decode_conditional_acceptance_rates"] == pytest.approx([0.9, 7 / 9, 5 / 7, 3 / 5, 1 / 3])
    assert spec_decode({}) == {}


def test_bootstrap_recovers_a_known_ratio():
    rng = np.random.default_rng(7)
    a = rng.uniform(90, 110, size=200)
    true_log_ratio, sigma = math.log(0.8), 0.05
    b = a * np.exp(rng.normal(true_log_ratio, sigma, size=200))
    ci = bootstrap_ratio(list(a), list(b), resamples=4000, seed=1)
    assert ci.ci_low < 0.8 < ci.ci_high
    half_width = (math.log(ci.ci_high) - math.log(ci.ci_low)) / 2
    assert half_width == pytest.approx(1.96 * sigma / math.sqrt(200), rel=0.25)
    small = bootstrap_ratio(list(a[:5]), list(b[:5]), resamples=4000, seed=1)  # percentile path
    assert small.n_pairs == 5 and small.ci_low < small.ratio < small.ci_high


def test_marks_need_pairs_a_floor_and_a_ci_outside_it():
    floor = aa_noise(np.array([0.005, -0.005, 0.004, -0.004]))
    ok = {"comparable": True}
    assert decide(RatioCI(0.8, 0.78, 0.82, 6), True, floor, **ok)[0] == "+"
    assert decide(RatioCI(0.8, 0.78, 0.82, 6), False, floor, **ok)[0] == "-"
    assert decide(RatioCI(0.99, 0.97, 1.01, 6), True, floor, **ok) == ("~", "95 % CI contains 1")
    mark, why = decide(RatioCI(1.004, 1.003, 1.005, 6), True, floor, **ok)  # CI excludes 1, inside floor
    assert mark == "~" and "A/A noise floor" in why
    mark, why = decide(
        RatioCI(0.8, 0.78, 0.82, 6), True, floor, comparable=True, problems="missing runs B.r1"
    )
    assert (mark, why) == ("!", "missing runs B.r1")  # a missing run is '!', not '?'
    assert decide(RatioCI(0.8, 0.78, 0.82, 6), True, floor, comparable=False)[0] == "x"
    mark, why = decide(RatioCI(0.8, None, None, 2), True, floor, **ok)
    assert mark == "?" and f"< {MIN_PAIRS}" in why  # two pairs: no CI, no claim
    assert decide(RatioCI(0.8, 0.78, 0.82, 6), True, None, **ok)[0] == "?"  # no A/A pair
    mark, why = decide(RatioCI(0.8, 0.78, 0.82, 6), True, floor, comparable=True, aa_run=True)
    assert mark == "~" and why.startswith("A/A run") and "drift" in why


def test_noise_floor_counts_the_aa_offset_not_only_its_spread():
    # two A/A pairs, both 1.60x apart: the old floor (CI half-width) was ~0.01; the drift is 47 %
    drift = aa_noise(np.log([1.6, 1.6]))
    assert drift.offset == pytest.approx(math.log(1.6)) and drift.spread == pytest.approx(0.0)
    assert drift.floor == pytest.approx(math.log(1.6)) and drift.floor_rel == pytest.approx(0.6)
    assert drift.sigma == pytest.approx(math.log(1.6))  # RMS about 0: the offset is noise too
    # a 1.5x "win" with a tight CI from 6 pairs stays inside that floor: not called better
    assert decide(RatioCI(1.5, 1.45, 1.55, 6), True, drift, comparable=True)[0] == "~"
    one = aa_noise(np.array([math.log(1.6)]))  # a single A/A pair: floor = |d|, spread unknown
    assert one.n_pairs == 1 and one.spread is None and one.floor == pytest.approx(math.log(1.6))
    # offset 0.01 and spread: floor = |mean| + t(0.975, n-1) * sd / sqrt(n), by hand
    d = np.array([0.02, 0.0, 0.01, 0.01])
    sd = np.std(d, ddof=1)
    t3 = 3.182446305284263  # t(0.975, 3)
    assert aa_noise(d).floor == pytest.approx(0.01 + t3 * sd / 2)
    assert aa_noise(np.array([])) is None


def test_mde_and_pairs_needed_from_the_aa_noise():
    d = np.array([0.01, -0.01, 0.02, -0.02])
    noise = aa_noise(d)
    sigma = math.sqrt(np.mean(d**2))
    assert noise.sigma == pytest.approx(sigma)
    power = 2.8 * sigma / math.sqrt(16)
    assert mde(noise, 16) == pytest.approx(math.expm1(max(noise.floor, power)))
    assert mde(noise, 16) >= noise.floor_rel  # never below what the marks can call
    assert pairs_needed(noise, 0.02) == max(MIN_PAIRS, math.ceil((2.8 * sigma / math.log(1.02)) ** 2))
    drifting = aa_noise(np.log([1.03, 1.03, 1.031]))
    assert pairs_needed(drifting, 0.02) is None  # an offset ≥ δ: more pairs cannot separate δ from drift
    assert pairs_needed(noise, None) is None and mde(None, 4) is None
    # the offset raises σ: same spread, shifted by 0.05
    assert aa_noise(d + 0.05).sigma > noise.sigma


def test_no_ci_below_the_minimum_of_pairs():
    a, b = [100.0, 101.0, 99.0, 100.5], [90.0, 91.0, 89.0, 90.2]
    few = bootstrap_ratio(a, b, 500, 0)
    assert few.n_pairs == 4 and few.ci_low is None and few.ci_high is None and not few.has_ci
    assert few.ratio == pytest.approx(math.exp(np.mean(np.log(np.array(b) / np.array(a)))))
    enough = bootstrap_ratio([*a, 100.2], [*b, 90.1], 500, 0)
    assert enough.n_pairs == 5 and enough.has_ci and enough.ci_low <= enough.ratio <= enough.ci_high


def test_percentile_lives_in_stats():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and math.isnan(percentile([], 50))


def test_gpu_throttle_rule():
    from deepinfer_harness.analysis.validity import gpu_violations

    ok = {
        "clocks.sm": "1410 MHz",
        "clocks.applications.graphics": "1410 MHz",
        "clocks_throttle_reasons.active": "0x0000000000000000",
    }
    idle = ok | {"clocks.sm": "210 MHz", "clocks_throttle_reasons.active": "0x0000000000000001"}
    slow = ok | {"clocks.sm": "1200 MHz"}
    hot = ok | {"clocks_throttle_reasons.active": "0x0000000000000040"}
    assert gpu_violations([[ok, idle]]) == []
    assert "SM clock 1200" in gpu_violations([[slow]])[0]
    assert "0x40" in gpu_violations([[hot]])[0]


def test_two_level_bootstrap_for_percentiles():
    from deepinfer_harness.analysis.stats import two_level_ratio

    rng = np.random.default_rng(3)
    a = [list(rng.exponential(10.0, 400)) for _ in range(6)]
    b = [list(1.25 * rng.exponential(10.0, 400)) for _ in range(6)]
    ci = two_level_ratio(a, b, 90, resamples=2000, seed=1)
    assert ci.method == "two_level_bootstrap" and ci.n_pairs == 6
    assert ci.ci_low < 1.25 < ci.ci_high and ci.ci_low > 1.0
    same = two_level_ratio(a, a, 90, resamples=2000, seed=1)
    assert same.ratio == 1.0 and same.ci_low < 1.0 < same.ci_high  # within-run noise is kept


def test_host_timing_rules_on_constructed_facts():
    """Host load on constructed facts (the pipeline tests switch it off: a shared host): a run is
    invalid for host load only past an absolute cap, where set (issue 42 defect 4: the lag is no
    longer judged against the cell's own timings, which made the fastest cells invalid on an idle
    host; whether the lag could change a verdict is decided per A/B row, test_round_four); a probe
    that took no sample decides nothing."""
    from deepinfer_harness.analysis.validity import check_run
    from deepinfer_harness.cells import Cell
    from deepinfer_harness.prometheus import Snapshot

    base = {"first_request_factor": 3.0, "inflight_fraction": 0.95}
    share = base | {"loop_lag_share": 0.05}
    lag = {"loop_lag": {"loop_lag_p50_ms": 0.2, "loop_lag_p99_ms": 6.0, "loop_lag_max_ms": 51.0}}

    def host(cell, facts, summary, limits):
        out = check_run(cell, [], [], facts, Snapshot(), Snapshot(), summary, limits)
        return [v for v in out["violations"] if v.startswith("host load")]

    prefill = Cell("prefill-cold", 64)
    assert host(prefill, lag, {"median_ttft_ms": 100.0, "p99_ttft_ms": 200.0}, share) == []
    assert host(prefill, lag, {"median_ttft_ms": 3.0, "p99_ttft_ms": 100.0}, share) == []  # fast: still valid
    decode = Cell("decode", 64, osl=32, concurrency=4)
    fast = {"median_itl_ms": 3.0, "p99_itl_ms": 9.0, "median_ttft_ms": 500.0, "p99_ttft_ms": 900.0}
    assert host(decode, lag, fast, share) == []
    caps = base | {"loop_lag_p99_ms": 5.0, "loop_lag_max_ms": 50.0}
    assert host(prefill, lag, {"median_ttft_ms": 1e6, "p99_ttft_ms": 1e6}, caps) == [
        "host load: client event-loop lag p99 6.0 ms > the 5 ms cap",
        "host load: client event-loop lag max 51.0 ms > the 50 ms cap",
    ]
    quiet = {"loop_lag": {"loop_lag_p99_ms": 4.0, "loop_lag_max_ms": 49.0}}
    assert host(prefill, quiet, {}, caps) == []
    nan = {"loop_lag": {"loop_lag_p50_ms": None, "loop_lag_p99_ms": None, "loop_lag_max_ms": float("nan")}}
    assert host(prefill, nan, {"median_ttft_ms": 1.0, "p99_ttft_ms": 1.0}, share | caps) == []


def test_host_load_fields_refuse_bad_values():
    from deepinfer_harness.config import ConfigError, Validity

    assert Validity(loop_lag_share=None).loop_lag_share is None  # null turns the rule off
    for field in ("loop_lag_share", "loop_lag_p99_ms", "loop_lag_max_ms"):
        with pytest.raises(ConfigError, match=f"validity.{field}"):
            Validity(**{field: 0})


def test_headline_says_how_many_runs_were_invalid_for_host_load_alone():
    from deepinfer_harness.analysis.report import headline

    def summary(invalid):
        return {"aa_run": True, "n_runs": 4, "n_expected": 4, "missing_runs": [], "marks": {},
                "n_invalid": len(invalid), "invalid_runs": invalid}  # fmt: skip

    loaded = {"host_load_only": True, "loop_lag_p99_ms": 1.6, "violations": ["host load: ..."]}
    broken = {"host_load_only": False, "loop_lag_p99_ms": 9.0, "violations": ["A #0: HTTP 500"]}
    assert ", 2 invalid (1 for host load alone: client lag p99 up to 1.60 ms), 0 missing" in headline(
        summary([loaded, broken])
    )
    assert ", 1 invalid, 0 missing" in headline(summary([broken]))
    assert ", 0 invalid, 0 missing" in headline(summary([]))
