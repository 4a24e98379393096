"""Load shapes users of `vllm bench serve`, AIPerf and GuideLLM expect (issue 23): open-loop rate
sweeps, goodput under SLOs, selectable percentiles, length distributions, shared prefixes with the
cache on, chat-template prompts with thinking pinned, per-request export, and the checks peers use
(server token counter = client count, greedy output identical with speculation on and off)."""

import csv
import io
import itertools
import json
import statistics

import pytest

from deepinfer_harness.analysis.ab import _quantile, metrics_for
from deepinfer_harness.analysis.run_summary import goodput, realized_lengths
from deepinfer_harness.cells import Cell
from deepinfer_harness.cli import main
from deepinfer_harness.layout import RunKey, RunLayout, read_json
from deepinfer_harness.lengths import arrival_offsets_s, draw, stable_seed
from deepinfer_harness.records import RequestRecord, read_records
from deepinfer_harness.run.client import chat_body

from .test_client_fake import run_cell
from .test_pipeline_fake import bench, write_profile

SHAPES_PLAN = {
    "rate": {
        "rates": [200.0, float("inf")],
        "arrivals": ["poisson"],
        "isl": {"mean": 40, "std": 8, "min": 24, "max": 56},
        "osl": {"min": 4, "max": 8},
        "n": 12,
        "seed": 3,
    },
    "shared_prefix": [{"prefix": 48, "isl": 64, "osl": 4, "n": 4, "c": 2}],
    "chat": {"isl": 24, "osl": 4, "concurrencies": [1], "n": 2, "thinking": False},
    "percentiles": [50, 95],
    "slo": {"ttft_ms": 60000, "tpot_ms": 60000},
}


@pytest.mark.parametrize(
    "setting, named",
    [
        ("plan.rate.rates=[0]", "plan.rate.rates"),
        ("plan.rate.rates=[2, 2]", "plan.rate.rates"),
        ("plan.rate.arrivals=[burst]", "plan.rate.arrivals"),
        ("plan.rate.n=0", "plan.rate.n"),
        ("plan.rate.max_concurrency=0", "plan.rate.max_concurrency"),
        ("plan.rate.isl={mean: 100}", "plan.rate.isl"),
        ("plan.rate.isl={min: 50, max: 10}", "plan.rate.isl"),
        ("plan.rate.osl={mean: 9, std: 1, min: 10, max: 20}", "plan.rate.osl"),
        ("plan.rate.osl={mean: 12, std: -1, min: 10, max: 20}", "plan.rate.osl"),
        ("plan.rate.isl=0", "plan.rate.isl"),
        ("plan.percentiles=[0]", "plan.percentiles"),
        ("plan.percentiles=[50, 100]", "plan.percentiles"),
        ("plan.percentiles=[90, 90]", "plan.percentiles"),
        ("plan.percentiles=[]", "plan.percentiles"),
        ("plan.slo={ttft: 100}", "plan.slo.ttft"),
        ("plan.slo={tpot_ms: -5}", "plan.slo.tpot_ms"),
        ("plan.shared_prefix=[{prefix: 64, isl: 64, osl: 4, n: 2, c: 1}]", "plan.shared_prefix"),
        ("plan.shared_prefix=[{prefix: 8, isl: 64, osl: 4, n: 2}]", "plan.shared_prefix"),
        ("plan.chat.concurrencies=[1]", "plan.chat.thinking"),
        ("plan.chat.concurrencies=[0]", "plan.chat.concurrencies"),
        ("plan.rate={rates: [1], isl: 4000, osl: 100}", "max_model_len"),
    ],
)
def test_bad_load_shape_values_are_one_line_exit_2(setting, named, capsys):
    assert main(["validate", "--profile", "smoke", "--set", setting]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err, err


def test_good_load_shapes_validate_and_name_their_cells(capsys):
    sets = [
        "plan.rate={rates: [0.5, 4, .inf], arrivals: [poisson, constant], n: 20,"
        " isl: {mean: 256, std: 64, min: 64, max: 512}, osl: {min: 16, max: 48}}",
        "plan.shared_prefix=[{prefix: 192, isl: 256, osl: 16, n: 8, c: 4}]",
        "plan.chat={isl: 128, osl: 16, concurrencies: [1], n: 2, thinking: false}",
    ]
    args = ["cells", "--profile", "smoke"] + [x for s in sets for x in ("--set", s)]
    assert main(args) == 0
    ids = {line.split("\t")[0] for line in capsys.readouterr().out.splitlines()}
    assert {"rate-i256-o32-r0p5-poisson", "rate-i256-o32-rinf-poisson", "rate-i256-o32-r4-constant"} <= ids
    assert {"prefix-i256-p192-o16-c4", "chat-i128-o16-c1"} <= ids
    assert "rate-i256-o32-rinf-constant" not in ids  # all at once: one cell, whatever the arrivals


def test_length_draws_are_seeded_bounded_and_shaped():
    normal = {"mean": 300, "std": 50, "min": 100, "max": 500}
    a = draw(normal, 4000, stable_seed(1, "cell"))
    assert a == draw(normal, 4000, stable_seed(1, "cell"))  # both arms, every session
    assert a != draw(normal, 4000, stable_seed(2, "cell"))
    assert min(a) >= 100 and max(a) <= 500
    # PCG64 draws are the same on every machine; bounds of 5 standard errors, not the values
    assert abs(statistics.fmean(a) - 300) < 5 * 50 / 4000**0.5
    assert abs(statistics.pstdev(a) - 50) < 5
    uniform = draw({"min": 3, "max": 6}, 2000, 7)
    assert set(uniform) == {3, 4, 5, 6}
    assert draw(128, 3, 0) == [128, 128, 128]


def test_arrivals_constant_poisson_and_all_at_once():
    assert arrival_offsets_s(4.0, "constant", 5, 0) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert arrival_offsets_s(float("inf"), "poisson", 3, 0) == [0.0, 0.0, 0.0]
    p = arrival_offsets_s(10.0, "poisson", 5001, 11)
    assert p == arrival_offsets_s(10.0, "poisson", 5001, 11) and p[0] == 0.0
    gaps = [b - a for a, b in itertools.pairwise(p)]
    assert all(g >= 0 for g in gaps)
    assert abs(statistics.fmean(gaps) - 0.1) < 5 * 0.1 / 5000**0.5  # exponential: sd = mean
    assert abs(statistics.pstdev(gaps) - 0.1) < 0.01


def _rec(i, ttft_ms, step_ms, n, ok=True):
    t0 = 1_000_000
    first = t0 + int(ttft_ms * 1e6)
    events = [first + int(j * step_ms * 1e6) for j in range(n)]
    return RequestRecord(
        "rate-i16-o4-r1-poisson",
        "A",
        0,
        0,
        i,
        t_send_ns=t0,
        t_end_ns=events[-1],
        event_times_ns=events,
        tokens_per_chunk=[1] * n,
        output_tokens=n,
        prompt_tokens=16 + i,
        error=None if ok else "http 500",
    )


def test_saturation_is_where_the_run_outlasts_its_schedule():
    from deepinfer_harness.analysis.report import rate_sweep
    from deepinfer_harness.analysis.run_summary import rate_attainment

    # kept up: the last request ends one median E2EL after the last arrival
    assert rate_attainment(10.0, 500.0, 10.5) == 1.0
    assert rate_attainment(10.0, 500.0, 21.0) == 0.5  # a 10.5 s queue built up
    assert rate_attainment(0.0, 500.0, 3.0) is None  # rate inf: no schedule

    def run(rate, attainment, variant="A"):
        cell = f"rate-i16-o4-r{str(rate).replace('.', 'p')}-poisson"
        return {"kind": "rate", "cell_id": cell, "variant": variant, "validity": {"valid": True}} | {
            "rate_attainment": attainment
        }

    sweep = rate_sweep([run(1, 1.0), run(2, 0.97), run(4, 0.6), run(8, 0.3), run(2, 0.5, "B")])
    a = next(s for s in sweep if s["variant"] == "A")
    assert a["saturated_at"] == 4 and [p["offered_rate"] for p in a["points"]] == [1, 2, 4, 8]
    assert next(s for s in sweep if s["variant"] == "B")["saturated_at"] == 2


def test_goodput_counts_requests_meeting_every_slo():
    recs = [
        _rec(0, 100, 10, 5),  # ttft 100, tpot 10, e2el 140: meets all
        _rec(1, 300, 10, 5),  # ttft over
        _rec(2, 100, 50, 5),  # tpot over
        _rec(3, 100, 10, 1),  # one token: no TPOT, judged on TTFT alone
        _rec(4, 100, 10, 5, ok=False),  # failed: never good
    ]
    out = goodput(recs, {"ttft_ms": 200, "tpot_ms": 20}, duration_s=2.0)
    assert out["slo_met_requests"] == 2 and out["slo_attainment"] == 2 / 5 and out["goodput_req_s"] == 1.0
    assert goodput(recs, {"e2el_ms": 150}, 2.0)["slo_met_requests"] == 2  # e2el 140, 340, 300, 100
    assert goodput(recs, {}, 2.0) == {}
    lengths = realized_lengths([r for r in recs if r.ok])
    assert lengths["isl_mean"] == statistics.fmean([16, 17, 18, 19]) and lengths["osl_min"] == 1


def test_selected_percentiles_are_reported_and_compared():
    assert _quantile("p99.9_ttft_ms") == 99.9 and _quantile("p95_e2el_ms") == 95.0
    metrics = metrics_for("rate", [{"goodput_req_s": 1.0}], (50.0, 95.0, 99.9))
    assert {"p95_ttft_ms", "p99.9_e2el_ms", "p95_itl_ms", "p95_tpot_ms", "goodput_req_s"} <= set(metrics)
    assert "p50_ttft_ms" not in metrics  # 50 is the median row
    assert {"p95_itl_ms", "p95_e2el_ms", "median_itl_ms", "median_e2el_ms"} <= set(
        metrics_for("decode", [], (50.0, 95.0))
    )


def test_chat_body_pins_thinking():
    body = chat_body("m", [{"role": "user", "content": "hi"}], 8, salt="s", request_id="r", thinking=False)
    assert body["chat_template_kwargs"] == {"thinking": False}
    assert body["min_tokens"] == body["max_completion_tokens"] == 8 and body["ignore_eos"] is True


def test_rate_cell_server_counter_must_equal_client_tokens(fake, tmp_path):
    fake.configure(generation_counted=0.5)
    cell = Cell("rate", 16, 4, 1, rate=float("inf"), arrival="poisson")
    _, summary = run_cell(fake, tmp_path, cell, n=4, warmup=0, params={"isl": 16, "osl": 4})
    assert not summary["validity"]["valid"]
    assert any(
        "Δgeneration_tokens_total=8 != 16 tokens the client received" in v
        for v in summary["validity"]["violations"]
    )


def test_prefix_cell_without_cache_is_invalid(fake, tmp_path):
    fake.configure(prefix_caching=False)
    _, summary = run_cell(fake, tmp_path, Cell("prefix", 64, 4, 2, prefix=48), n=4)
    assert any("never read from the cache" in v for v in summary["validity"]["violations"])
    fake.configure()
    _, summary = run_cell(fake, tmp_path / "on", Cell("prefix", 64, 4, 2, prefix=48), n=4)
    assert summary["validity"]["valid"], summary["validity"]
    assert (
        summary["prefix_cache_hits"] > 0 and summary["client_cached_tokens"] == summary["prefix_cache_hits"]
    )


def test_shapes_pipeline_export_and_spec_greedy(fake, tmp_path, capsys):
    profile = write_profile(tmp_path, fake.url, plan=SHAPES_PLAN)
    assert bench(tmp_path, profile) == 0
    layout = RunLayout(tmp_path / "results" / "fake")
    summary = read_json(layout.summary)
    assert summary["n_invalid"] == 0, [r["validity"] for r in summary["runs"] if not r["validity"]["valid"]]
    runs = {(r["cell_id"], r["variant"], r["rep"]): r for r in summary["runs"]}
    # prefix-cache counters in every row, whatever the kind
    assert all("prefix_cache_hits" in r and "prefix_cache_queries" in r for r in summary["runs"])
    assert runs[("prefix-i64-p48-o4-c2", "A", 0)]["prefix_cache_hits"] > 0
    assert runs[("rate-i40-o6-r200-poisson", "A", 0)]["prefix_cache_hits"] == 0  # salted: cold
    # realized lengths: the same draws in both arms, with the declared spread
    rate = runs[("rate-i40-o6-r200-poisson", "A", 0)]
    assert rate["isl_std"] > 0 and 24 <= rate["isl_min"] <= rate["isl_max"] <= 56 and 4 <= rate["osl_min"]
    assert rate["isl_mean"] == runs[("rate-i40-o6-r200-poisson", "B", 1)]["isl_mean"]
    assert rate["offered_rate"] == 200.0 and "p95_ttft_ms" in rate and "p99_ttft_ms" not in rate
    assert rate["slo_attainment"] == 1.0 and rate["goodput_req_s"] == pytest.approx(
        rate["request_throughput"]
    )
    key = RunKey("rate-i40-o6-r200-poisson", "A", 0)
    lens_a = [r.prompt_len for r in read_records(layout.run_file(key, "jsonl")) if r.phase == "measure"]
    lens_b = [
        r.prompt_len
        for r in read_records(layout.run_file(RunKey(key.cell_id, "B", 0), "jsonl"))
        if r.phase == "measure"
    ]
    assert sorted(lens_a) == sorted(lens_b) and len(lens_a) == 12
    # chat: thinking pinned in the request; prompt length is the server's rendered count
    with __import__("urllib.request").request.urlopen(f"{fake.url}/fake/last_chat") as resp:
        assert json.loads(resp.read())["chat_template_kwargs"] == {"thinking": False}
    rows = {(r["cell_id"], r["metric"]) for r in read_json(layout.ab)["rows"]}
    assert {("rate-i40-o6-r200-poisson", m) for m in ("p95_e2el_ms", "p95_itl_ms", "goodput_req_s")} <= rows
    assert ("chat-i24-o4-c1", "median_ttft_ms") in rows
    sweeps = {(x["variant"], x["arrival"]): x for x in summary["rate_sweep"]}
    # strict JSON: a rate of inf is the string "inf", its unit beside it
    assert [p["offered_rate"] for p in sweeps[("A", "poisson")]["points"]] == [200.0, "inf"]
    assert sweeps[("A", "poisson")]["rate_unit"] == "requests/s"
    assert "## Open-loop rate sweep" in (layout.root / "ab.md").read_text()
    header = (layout.root / "runs.csv").read_text().splitlines()[0].split(",")
    assert {"prefix_cache_hits", "isl_std", "goodput_req_s"} <= set(header)

    # per-request export: one row per recorded request, timings from the raw stamps
    capsys.readouterr()
    assert main(["export", str(layout.root)]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    n_records = sum(len(read_records(p)) for p in (layout.root / "cells").glob("*/[AB].r*.jsonl"))
    assert len(table) == n_records
    assert all(float(r["ttft_ms"]) > 0 for r in table if r["ok"] == "True")
    assert main(["export", str(layout.root), "--format", "jsonl", "--out", str(tmp_path / "req.jsonl")]) == 0
    lines = [json.loads(x) for x in (tmp_path / "req.jsonl").read_text().splitlines()]
    assert len(lines) == n_records and all(isinstance(x["itl_ms"], list) for x in lines)
    assert main(["export", str(tmp_path)]) == 2  # not a run directory: one line


def test_spec_greedy_identical_and_diverged(fake, tmp_path, capsys):
    plan = {"greedy": {"isl": 32, "osl": 8, "concurrencies": [1], "n": 2}}
    (tmp_path / "s").mkdir()
    (tmp_path / "p").mkdir()
    spec = write_profile(tmp_path / "s", fake.url, plan=plan, speculative={"method": "ngram"})
    plain = write_profile(tmp_path / "p", fake.url, plan=plan)
    assert bench(tmp_path, spec, run_id="spec") == 0
    assert bench(tmp_path, plain, run_id="plain") == 0
    root = tmp_path / "results"
    assert (
        main(["spec-greedy", str(root / "spec"), str(root / "plain"), "--out", str(tmp_path / "g.json")]) == 0
    )
    result = json.loads((tmp_path / "g.json").read_text())
    assert result["status"] == "ok" and {c["variant"] for c in result["checks"]} == {"A", "B"}
    assert all(t["met"] for t in result["targets"]) and result["provenance"]["spec"]["run_id"] == "spec"
    assert main(["spec-greedy", str(root / "plain"), str(root / "spec")]) == 2  # order: spec first
    assert main(["spec-greedy", str(root / "spec"), str(root / "spec")]) == 2
    path = RunLayout(root / "spec").run_file(RunKey("greedy-i32-o8-c1", "B", 1), "jsonl")
    records = [json.loads(x) for x in path.read_text().splitlines()]
    records[-1]["output_token_ids"][3] += 1  # a speculative run whose verifier let a token through
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    capsys.readouterr()
    assert main(["spec-greedy", str(root / "spec"), str(root / "plain")]) == 3
    assert "'first_divergence': 3" in capsys.readouterr().out
