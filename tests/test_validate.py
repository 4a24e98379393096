"""`make validate` (scripts/validate.py) on a machine without a GPU: the CPU steps run, it stops at the
first GPU step, says so, exits 3 and leaves one evidence JSON; the GPU serving commands are well formed;
the serve steps (harness run faked) are planned per GPU count and fail on a greedy-token mismatch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import validate

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "scripts" / "validate.py")


DSPARK = {"method": "dspark", "num_speculative_tokens": 3}
# name: (tp, pp, VLLM_PP_LAYER_PARTITION, speculative config), in step order
SERVE_PLAN: dict[str, tuple[int, int, str | None, dict | None]] = {
    "serve-tp1": (1, 1, None, None),
    "serve-tp1-dspark": (1, 1, None, DSPARK),
    "serve-tp2": (2, 1, None, None),
    "serve-pp2": (1, 2, "4,2", None),
    "serve-pp2-dspark": (1, 2, "4,2", DSPARK),
    "serve-pp2-clean": (1, 2, "3,3", None),
    "serve-pp2-clean-dspark": (1, 2, "3,3", DSPARK),
    "serve-pp3": (1, 3, "3,1,2", None),
    "serve-pp3-dspark": (1, 3, "3,1,2", DSPARK),
    "serve-tp2-pp2-dspark": (2, 2, "4,2", DSPARK),
    "serve-pp2-entry-dspark": (1, 2, "1,5", DSPARK),
    "serve-pp3-entry-dspark": (1, 3, "1,1,4", DSPARK),
    "serve-release-tp1": (1, 1, None, None),
    "serve-release-pp3-dspark": (1, 3, "14,14,12", {"method": "dspark", "num_speculative_tokens": 5}),
}
RUNS_ON = {
    1: ["serve-tp1", "serve-tp1-dspark", "serve-release-tp1"],
    2: ["serve-tp1", "serve-tp1-dspark", "serve-tp2", "serve-pp2", "serve-pp2-dspark", "serve-pp2-clean",
        "serve-pp2-clean-dspark", "serve-pp2-entry-dspark", "serve-release-tp1"],
    3: [n for n in SERVE_PLAN if n != "serve-tp2-pp2-dspark"],
    4: list(SERVE_PLAN),
    8: list(SERVE_PLAN),
}  # fmt: skip


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=600, cwd=ROOT
    )


@pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import torch; exit(torch.cuda.is_available())"]).returncode,
    reason="this test is the no-GPU path",
)
def test_cpu_run_stops_at_first_gpu_step(tmp_path: Path) -> None:
    # the checkpoint steps are test_tiny_v41's (they take a minute); skipped here by name
    p = _run(
        "--out", str(tmp_path), "--model", str(tmp_path / "tiny"), "--skip", "tiny-checkpoint,tiny-loads"
    )
    assert p.returncode == 3, p.stdout + p.stderr
    assert "stopped at 'gpu-tests'" in p.stdout
    (evidence,) = tmp_path.glob("validate-*.json")
    d = json.loads(evidence.read_text())
    assert (d["verdict"], d["stopped_at"], d["gpus"]) == ("incomplete", "gpu-tests", [])
    status = {s["name"]: s["status"] for s in d["steps"]}
    assert status["environment"] == status["pipeline-plans"] == "pass"
    assert all(status[n] == "skipped" for n in ("gpu-tests", "sm80-report", *SERVE_PLAN))
    assert d["versions"]["torch"] and d["targets"] and {"name", "met"} <= set(d["targets"][0])
    plans = next(s for s in d["steps"] if s["name"] == "pipeline-plans")["plans"]
    assert plans["14,14,12"]["payload_bytes_per_token"] == [4, 8908]  # + the ids (Engram 14 on stage 1)


def test_dry_run_serving_commands(tmp_path: Path) -> None:
    p = _run("--dry-run", "--out", str(tmp_path), "--model", str(tmp_path / "tiny"))
    assert p.returncode == 0, p.stderr
    lines = dict(line.split(": ", 1) for line in p.stdout.splitlines())
    assert list(lines) == list(SERVE_PLAN)
    for name, (tp, pp, partition, spec) in SERVE_PLAN.items():
        assert lines[name].startswith(f"VLLM_PP_LAYER_PARTITION={partition} " if partition else " ")
        assert f"topology.tp={tp} " in lines[name] and f"topology.pp={pp} " in lines[name]
        assert (f"speculative={json.dumps(spec)}" in lines[name]) == bool(spec), name
    assert "DEEPINFER_SM80_DISABLE" in lines["serve-tp1"] and "fp8_ds_mla" in lines["serve-tp1"]


def test_unknown_step_is_usage_error(tmp_path: Path) -> None:
    p = _run("--skip", "nope", "--out", str(tmp_path))
    assert p.returncode == 2 and "unknown step" in p.stderr


def test_engram_tables_that_do_not_fit_fail_before_serving(tmp_path: Path) -> None:
    """Engram host memory (issue 22 item 6): tables larger than any host fail the CPU step, by name."""
    cfg = tmp_path / "config.json"
    huge = {"engram_layer_ids": [1, 14], "engram_num_embeddings": [2**40, 2**40], "engram_head_dim": 1024}
    cfg.write_text(json.dumps(huge))
    p = _run(
        "--out", str(tmp_path), "--model", str(tmp_path / "tiny"), "--engram-config", str(cfg),
        "--skip", "tiny-checkpoint,tiny-loads",
    )  # fmt: skip
    assert p.returncode == 1, p.stdout + p.stderr
    (evidence,) = tmp_path.glob("validate-*.json")
    step = next(s for s in json.loads(evidence.read_text())["steps"] if s["name"] == "engram-memory")
    assert step["status"] == "fail" and "does not fit" in step["reason"]
    assert _run("--engram-config", str(tmp_path / "absent.json")).returncode == 2


class FakeHarness:
    """Stands in for `validate.run` of the harness: records each command and writes the run directory
    a smoke A/B leaves (greedy records of both arms, two repetitions, per-run summaries with the
    spec-decode counter deltas when the command sets a speculative config)."""

    PROMPTS = 4

    def __init__(self) -> None:
        self.calls: dict[str, dict[str, Any]] = {}
        self.flip: dict[str, int] = {}  # run id -> how many output tokens of prompt 2 (arm B) to change
        self.no_drafts: set[str] = set()

    def __call__(self, cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
        from deepinfer_harness.records import RequestRecord

        assert "deepinfer_harness" in cmd, cmd
        run_id = cmd[cmd.index("--run-id") + 1]
        sets = dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "--set")
        self.calls[run_id] = {k: json.loads(v) for k, v in sets.items()}
        root = Path(cmd[cmd.index("--results") + 1]) / run_id
        spec = "speculative" in sets and run_id not in self.no_drafts
        for cell in ("greedy-i64-o16-c1", "greedy-i64-o16-c4", "decode-i64-o32-c1"):
            cells = root / "cells" / cell
            cells.mkdir(parents=True)
            for arm in ("A", "B"):
                for rep in (0, 1):
                    lines = []
                    for i in range(self.PROMPTS):
                        changed = arm == "B" and i == 2 and cell.startswith("greedy")
                        flip = self.flip.get(run_id, 0) if changed else 0
                        out = [(7 * i + j) % 1000 + (j < flip) for j in range(16)]
                        rec = RequestRecord(
                            cell, arm, rep, rep, i, prompt_sha256=f"{i:064x}", output_token_ids=out
                        )
                        lines.append(json.dumps(rec.to_json()))
                    (cells / f"{arm}.r{rep}.jsonl").write_text("\n".join(lines) + "\n")
                    summary = {"cell_id": cell, "kind": cell.split("-")[0]}
                    if spec:
                        summary |= {"spec_decode_draft_tokens": 30.0, "spec_decode_accepted_tokens": 12.0}
                    (cells / f"{arm}.r{rep}.summary.json").write_text(json.dumps(summary))
        return 0, f"run {run_id}: done"


def _ctx(tmp_path: Path, n_gpus: int) -> dict[str, Any]:
    gpus = [{"index": i, "name": "NVIDIA A100-SXM4-80GB", "capability": "8.0"} for i in range(n_gpus)]
    return {"out": tmp_path, "model": tmp_path / "tiny", "gpus": gpus}


@pytest.mark.parametrize("n_gpus", [1, 2, 3, 4, 8])
def test_serve_steps_planned_per_gpu_count(
    n_gpus: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which serve steps run on a node of n GPUs, with which TP, PP, partition and DSpark config;
    the others are skipped with their GPU count as the reason."""
    fake = FakeHarness()
    monkeypatch.setattr(validate, "run", fake)
    assert [s.name for s in validate.planned_serves(n_gpus)] == RUNS_ON[n_gpus]
    ctx = _ctx(tmp_path, n_gpus)
    serve_steps = [(s, fn) for s, fn in validate.steps() if s.name.startswith("serve-")]
    assert [s.name for s, _ in serve_steps] == list(SERVE_PLAN)
    for step, fn in serve_steps:
        tp, pp, partition, spec = SERVE_PLAN[step.name]
        if step.name not in RUNS_ON[n_gpus]:
            with pytest.raises(validate.SkipStep, match=f"needs {tp * pp} GPUs, {n_gpus} present"):
                fn(ctx)
            continue
        detail = fn(ctx)
        sets = fake.calls[f"validate-{step.name}"]
        assert (sets["topology.tp"], sets["topology.pp"]) == (tp, pp)
        assert sets["server.env"] == ({"VLLM_PP_LAYER_PARTITION": partition} if partition else {})
        assert sets.get("speculative") == spec
        assert (detail["tp"], detail["pp"], detail["partition"], detail["speculative"]) == (
            tp,
            pp,
            partition,
            spec,
        )
        # arms x reps x the concurrency-1 greedy cell (c4 batches differ under PP: not compared)
        assert detail["greedy_outputs"] == 2 * 2 * FakeHarness.PROMPTS
        if step.name not in ("serve-tp1", "serve-release-tp1"):  # each checkpoint's one-stage reference
            assert detail["tokens_differing_from_serve_tp1"] == 0
            assert detail["greedy_outputs_compared"] == detail["greedy_outputs"]
        if spec:
            # 3 cells x 2 repetitions x (30 drafted, 12 accepted) per arm
            assert detail["spec_decode"]["A"] == {"draft_tokens": 180.0, "accepted_tokens": 72.0}
            assert detail["spec_decode_draft_tokens"] == 360.0
        else:
            assert "spec_decode" not in detail
    assert set(fake.calls) == {f"validate-{n}" for n in RUNS_ON[n_gpus]}


def test_token_mismatch_fails_the_step_and_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serve-pp2 answering 3 tokens of one prompt differently from serve-tp1: that step fails with the
    count in the evidence, the steps before pass, later ones are skipped (no --keep-going)."""
    fake = FakeHarness()
    fake.flip["validate-serve-pp2"] = 3
    monkeypatch.setattr(validate, "run", fake)
    monkeypatch.setattr(validate, "gpus", lambda: _ctx(tmp_path, 8)["gpus"])
    before = "environment,pipeline-plans,tiny-checkpoint,engram-memory,tiny-loads,gpu-tests,replication-gpu"
    code = validate.main(
        ["--out", str(tmp_path), "--model", str(tmp_path / "tiny"), "--skip", before + ",sm80-report"]
    )
    assert code == validate.EXIT_FAIL
    (evidence,) = tmp_path.glob("validate-*.json")
    steps = {s["name"]: s for s in json.loads(evidence.read_text())["steps"]}
    assert [steps[n]["status"] for n in ("serve-tp1", "serve-tp1-dspark", "serve-tp2")] == ["pass"] * 3
    assert steps["serve-tp1-dspark"]["tokens_differing_from_serve_tp1"] == 0
    pp2 = steps["serve-pp2"]
    assert pp2["status"] == "fail" and "differ from serve-tp1" in pp2["reason"]
    # 3 tokens in each of arm B's 2 outputs of prompt 2 (the c1 greedy cell x 2 repetitions)
    assert pp2["tokens_differing_from_serve_tp1"] == 6
    first = pp2["greedy_diverged"][0]
    assert (first["arm"], first["cell"], first["tokens_differing"], first["first_divergence"]) == (
        "B",
        "greedy-i64-o16-c1",
        3,
        0,
    )
    assert all(steps[n]["reason"] == "an earlier step failed" for n in list(SERVE_PLAN)[4:])


def test_dspark_step_without_drafts_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeHarness()
    fake.no_drafts.add("validate-serve-tp1-dspark")
    monkeypatch.setattr(validate, "run", fake)
    ctx = _ctx(tmp_path, 1)
    plan = dict((s.name, fn) for s, fn in validate.steps())
    plan["serve-tp1"](ctx)
    with pytest.raises(validate.StepFailure, match="no draft tokens") as err:
        plan["serve-tp1-dspark"](ctx)
    assert err.value.detail["spec_decode"]["A"]["draft_tokens"] == 0.0
    assert err.value.detail["tokens_differing_from_serve_tp1"] == 0


def test_serve_step_without_reference_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validate, "run", FakeHarness())
    plan = dict((s.name, fn) for s, fn in validate.steps())
    with pytest.raises(validate.StepFailure, match="serve-tp1 recorded no greedy tokens"):
        plan["serve-pp2"](_ctx(tmp_path, 2))


# `ray status` of the e2e Ray case's two CPU nodes (Ray 2.56.1), and the same view of a GPU pair
RAY_STATUS_CPU = """======== Autoscaler status: 2026-12-07 17:12:00.313890 ========
Node status
---------------------------------------------------------------
Active:
 1 node_1d4ae9e9255795c6c805ba7c4f8d559fc93ed39fb64a377ded566e53
 1 node_d27bd733d2f66fe3afa7bea544b5a8e1217675a0479e4ab0bd2c853c
Pending:
 (no pending nodes)
Recent failures:
 (no failures)

Resources
---------------------------------------------------------------
Total Usage:
 0.0/2.0 CPU
 2.0/2.0 deepinfer_cpu_device (2.0 used of 2.0 reserved in placement groups)
 0B/21.43GiB memory
 0B/200.00MiB object_store_memory

From request_resources:
 (none)
Pending Demands:
 (no resource demands)
"""


def test_ray_view_reads_nodes_and_resources() -> None:
    view = validate.ray_view(RAY_STATUS_CPU)
    assert view == {"active_nodes": 2, "resources": {"CPU": 2.0, "deepinfer_cpu_device": 2.0}}
    gpu = RAY_STATUS_CPU.replace(" 0.0/2.0 CPU\n", " 0.0/256.0 CPU\n 0.0/16.0 GPU\n")
    assert validate.ray_view(gpu)["resources"]["GPU"] == 16.0
    # a node with no work yet is listed as idle, and is up: a fresh cluster before `vllm serve`
    idle = RAY_STATUS_CPU.replace("\n 1 node_d27b", "\nIdle:\n 1 node_d27b")
    assert "Idle:" in idle and validate.ray_view(idle)["active_nodes"] == 2


def test_ray_cluster_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skipped without a cluster; fails naming what `ray status` shows when nodes or GPUs are missing."""
    with pytest.raises(validate.SkipStep, match="no Ray cluster"):
        validate.step_ray_cluster({"ray_address": None})
    monkeypatch.setattr(validate.shutil, "which", lambda name: "/bin/ray")
    monkeypatch.setattr(validate, "run", lambda cmd, timeout: (0, RAY_STATUS_CPU))
    with pytest.raises(
        validate.StepFailure, match=r"2 active node\(s\) and 0 GPU\(s\); the deployment needs 2 and 16"
    ):
        validate.step_ray_cluster({"ray_address": "head:6379"})
    two_gpu_nodes = RAY_STATUS_CPU.replace(" 0.0/2.0 CPU\n", " 0.0/16.0 GPU\n")
    monkeypatch.setattr(validate, "run", lambda cmd, timeout: (0, two_gpu_nodes))
    assert validate.step_ray_cluster({"ray_address": "h:1"})["active_nodes"] == 2
    one_node = two_gpu_nodes.replace(" 1 node_d27b", " (gone) node_d27b")
    monkeypatch.setattr(validate, "run", lambda cmd, timeout: (0, one_node))
    with pytest.raises(validate.StepFailure, match=r"1 active node\(s\)"):
        validate.step_ray_cluster({"ray_address": "h:1"})
