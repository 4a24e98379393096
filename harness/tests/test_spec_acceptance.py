"""Speculative decoding per cell and per workload, A vs B, next to tokens/s (issue 30): acceptance
length and rate from vLLM's spec-decode counters, scraped before and after every run, in every
kind that generates, in summary.json and in ab.md."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from deepinfer_harness.analysis.ab import metrics_for
from deepinfer_harness.analysis.report import spec_decode_by_workload
from deepinfer_harness.layout import RunLayout, read_json
from deepinfer_harness.prometheus import SPEC_DECODE_COUNTERS

from .conftest import HERE, FakeServer
from .test_pipeline_fake import bench, write_profile

VLLM_METRICS = Path(__file__).resolve().parents[2] / ".cache/vllm-0.32.0/vllm/v1/spec_decode/metrics.py"


@pytest.mark.skipif(not VLLM_METRICS.exists(), reason="vLLM 0.32.0 source not unpacked in .cache")
def test_counter_names_are_vllms():
    """Each name the harness reads is a Counter vLLM 0.32.0 declares (prometheus adds `_total`)."""
    declared = set(re.findall(r'"(vllm:spec_decode_[a-z_]+)"', VLLM_METRICS.read_text()))
    assert {name.removesuffix("_total") for name in SPEC_DECODE_COUNTERS} <= declared


def test_acceptance_rows_only_where_a_server_drafts():
    spec = [{"spec_decode_acceptance_length": 3.0, "spec_decode_acceptance_rate": 40.0}]
    for kind in ("greedy", "rate", "prefix", "chat"):
        rows = metrics_for(kind, spec, (50.0,))
        assert {"spec_decode_acceptance_length", "spec_decode_acceptance_rate"} <= set(rows), kind
        assert not {"spec_decode_acceptance_length", "spec_decode_acceptance_rate"} & set(
            metrics_for(kind, [{}], (50.0,))
        )  # no speculation: the rows a run without it always had
    assert "spec_decode_acceptance_rate" in metrics_for("decode", spec, (50.0,))
    assert "spec_decode_acceptance_length" not in metrics_for("nll", spec, (50.0,))


def test_workload_acceptance_pools_the_counters():
    def run(cell_id, variant, drafts, draft_tokens, accepted, valid=True, kind="decode"):
        return {
            "cell_id": cell_id,
            "kind": kind,
            "variant": variant,
            "validity": {"valid": valid},
            "spec_decode_num_drafts": drafts,
            "spec_decode_draft_tokens": draft_tokens,
            "spec_decode_accepted_tokens": accepted,
        }

    rows = spec_decode_by_workload(
        [
            run("decode-i64-o32-c1", "A", 100, 500, 100),
            run("greedy-i64-o16-c1", "A", 300, 1500, 900, kind="greedy"),  # weighs by its drafts
            run("decode-i64-o32-c1", "B", 100, 500, 400),
            run("decode-i64-o32-c1", "B", 100, 500, 0, valid=False),  # never pooled
            run("decode-i64-o32-c1-wcode", "A", 10, 50, 5),
        ]
    )
    prose = next(r for r in rows if r["workload"] == "prose")
    assert prose["A"]["acceptance_length"] == pytest.approx(1 + 1000 / 400)
    assert prose["A"]["acceptance_rate_pct"] == pytest.approx(100 * 1000 / 2000)
    assert prose["B"]["acceptance_length"] == pytest.approx(5.0) and prose["kinds"] == ["decode", "greedy"]
    code = next(r for r in rows if r["workload"] == "code")
    assert code["B"] is None and code["A"]["acceptance_length"] == pytest.approx(1.5)


@pytest.fixture
def second_fake():
    proc = subprocess.Popen([sys.executable, str(HERE / "fakeserver.py")], stdout=subprocess.PIPE, text=True)
    server = FakeServer(proc, int(proc.stdout.readline()))
    yield server
    proc.terminate()
    proc.wait(timeout=10)


PLAN = {
    "decode": {"isl": 32, "osl": 24, "concurrencies": [2], "warmup_s": 0.1, "window_s": 0.3, "min_steps": 5},
    "greedy": {"isl": 32, "osl": 12, "concurrencies": [1], "n": 2},
    "rate": {"rates": [float("inf")], "n": 4, "isl": 16, "osl": 12},
}


def test_acceptance_a_vs_b_per_cell_and_workload(fake, second_fake, tmp_path):
    """A drafts 2 tokens per step of K = 5 (1 accepted: length 2, 20 %), B 4 (3 accepted: length
    4, 60 %): every generating cell reports both arms' acceptance next to its tokens/s, and the
    A/B rows compare them."""
    fake.configure(tokens_per_chunk=2)
    second_fake.configure(tokens_per_chunk=4)
    profile = write_profile(
        tmp_path,
        fake.url,
        plan=PLAN,
        server={"mode": "url", "urls": {"A": fake.url, "B": second_fake.url}},
        ab={"repetitions": 1, "bootstrap_resamples": 200, "aa": False},
    )
    assert bench(tmp_path, profile) == 0
    layout = RunLayout(tmp_path / "results" / "fake")
    summary = read_json(layout.summary)
    assert summary["n_invalid"] == 0, summary["invalid_runs"]
    by_cell = {c["cell_id"]: c for c in summary["spec_decode"]["by_cell"]}
    assert set(by_cell) == {"decode-i32-o24-c2", "greedy-i32-o12-c1", "rate-i16-o12-rinf-poisson"}
    for cell_id, c in by_cell.items():
        assert c["A"]["acceptance_length"] == pytest.approx(2.0), cell_id
        assert c["B"]["acceptance_length"] == pytest.approx(4.0), cell_id
        assert c["A"]["acceptance_rate_pct"] == pytest.approx(20.0)
        assert c["B"]["acceptance_rate_pct"] == pytest.approx(60.0)
        assert c["A"]["tokens_per_s"] > 0 and c["B"]["tokens_per_s"] > 0
        assert c["spec_decode_acceptance_length_ab"]["ratio"] == pytest.approx(2.0)
    assert by_cell["decode-i32-o24-c2"]["tokens_per_s_metric"] == "decode_tok_s"
    assert by_cell["rate-i16-o12-rinf-poisson"]["tokens_per_s_metric"] == "output_throughput"
    (prose,) = summary["spec_decode"]["by_workload"]
    assert prose["A"]["acceptance_length"] == pytest.approx(2.0)
    assert prose["B"]["acceptance_rate_pct"] == pytest.approx(60.0)
    rows = {(r["cell_id"], r["metric"]) for r in read_json(layout.ab)["rows"]}
    for cell_id in by_cell:
        assert (cell_id, "spec_decode_acceptance_length") in rows
        assert (cell_id, "spec_decode_acceptance_rate") in rows
    assert ("greedy-i32-o12-c1", "spec_decode_accept_p2") in rows  # per position, every kind
    md = (layout.root / "ab.md").read_text()
    assert "## Speculative decoding" in md and "accept len A" in md
    json.loads(layout.summary.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict {c}"))
