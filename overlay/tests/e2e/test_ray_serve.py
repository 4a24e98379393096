"""The served Ray rehearsal's pieces (ray_serve.py), without Ray or vLLM.

The profile tiny-v41-ray must generate a800x16's Ray launch at the tiny scale (Ray executor, PP2, DSpark,
RAY_ADDRESS through `pass_env` and nothing else of the caller's environment); `ray status` is parsed from
Ray's own format; the harness's summary is read as the rehearsal judges it; the targets name their causes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deepinfer_sm80.testing.e2e import ray_serve as rs
from deepinfer_sm80.testing.e2e.ray_nodes import NodeSpec

ADDRESS = "127.0.0.2:40001"
TREE_ENV = (("DEEPINFER_E2E_CPU", "1"), ("PYTHONPATH", "/tree/hook:/tree/site"), ("TRITON_INTERPRET", "1"))


@pytest.fixture
def launch(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Arm A of the committed profile as the harness generates it (the patched tree's env faked)."""
    from deepinfer_harness.config import load_profile
    from deepinfer_harness.run import launch as launch_mod

    monkeypatch.setattr(launch_mod, "level_env", lambda level, work: TREE_ENV)
    profile = load_profile(str(rs.PROFILE))
    return launch_mod.build_launch(profile, rs.ARM, "/models/tiny", "rid", 0)


def test_generated_command_is_the_ray_launch(launch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", ADDRESS)
    monkeypatch.setenv("VLLM_HOST_IP", "127.0.0.2")
    monkeypatch.setenv("DEEPINFER_NOT_PASSED", "x")
    env = launch.process_env()
    facts = rs.launch_facts(launch.argv, env, ADDRESS)
    assert facts["ray_flags_ok"] and facts["ray_address_passed"]
    assert facts["speculative_method"] == "dspark" and facts["partition"] == "4,2"
    assert launch.argv[launch.argv.index("serve") + 1] == "/models/tiny"  # `vllm serve MODEL`
    assert env["VLLM_HOST_IP"] == "127.0.0.2" and env["DEEPINFER_E2E_CPU"] == "1"
    assert env["DEEPINFER_E2E_SCHEDULER"] == "async"
    assert "DEEPINFER_NOT_PASSED" not in env  # only pass_env names reach the server
    assert rs.flag_value(launch.argv, "--max-num-seqs") == "1"  # the CPU engine's flags come last


def test_address_not_passed_is_seen(launch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    facts = rs.launch_facts(launch.argv, launch.process_env(), ADDRESS)
    assert not facts["ray_address_passed"]
    facts = rs.launch_facts([a for a in launch.argv if a != "ray"], {}, ADDRESS)
    assert not facts["ray_flags_ok"]


def test_profile_is_a800x16_scaled() -> None:
    from deepinfer_harness.config import load_profile
    from deepinfer_harness.plan import build_cells

    big = load_profile("a800x16-tp8pp2")
    tiny = load_profile(str(rs.PROFILE))
    assert tiny.server.pass_env == big.server.pass_env
    assert (tiny.topology.nodes, tiny.topology.ray, tiny.topology.pp) == (2, True, big.topology.pp)
    assert tiny.speculative["method"] == big.speculative["method"] == "dspark"
    assert sum(tiny.topology.pp_partition) == tiny.topology.num_hidden_layers == 6
    assert tiny.ab.aa  # one server for both arms
    kinds = {c.cell.kind for c in build_cells(tiny)}
    assert (
        kinds <= {c.cell.kind for c in build_cells(big)}
        and {"decode", "greedy", "nll", "prefill-cold"} <= kinds
    )


RAY_STATUS = """======== Autoscaler status: 2026-12-07 19:01:02.000000 ========
Node status
---------------------------------------------------------------
Active:
 1 node_4f1c0d8a2b
Idle:
 1 node_9e77aa0c31
Pending:
 (no pending nodes)
Recent failures:
 (no failures)

Resources
---------------------------------------------------------------
Total Usage:
 0.0/2.0 CPU
 2.0/2.0 deepinfer_cpu_device (2.0 used of 2.0 reserved in placement groups)
 0B/3.72GiB memory
From request_resources:
 (no resource requests)
Pending Demands:
 (no resource demands)
"""


def test_parse_ray_status() -> None:
    assert rs.parse_ray_status(RAY_STATUS) == {"nodes_up": 2, "devices_used": 2.0, "devices_total": 2.0}
    empty = rs.parse_ray_status("Active:\n (no active nodes)\nPending:\n")
    assert empty == {"nodes_up": 0, "devices_used": None, "devices_total": None}
    assert rs.parse_ray_status("")["nodes_up"] is None


def test_temp_dirs(tmp_path: Path) -> None:
    specs = [NodeSpec(n, "127.0.0.2", ["ray", "start"], {}, tmp_path / n) for n in ("head", "worker")]
    out = rs.with_temp_dirs(specs, tmp_path / "rt")
    assert [s.argv[-2:] for s in out] == [
        ["--temp-dir", str(tmp_path / "rt" / "h")],
        ["--temp-dir", str(tmp_path / "rt" / "w")],
    ]
    root, remove = rs.temp_root(tmp_path / ("x" * 60))
    try:
        assert remove and len(str(root)) <= rs.MAX_TEMP_DIR + 20 and root.is_dir()
    finally:
        root.rmdir()


def _summary(tmp_path: Path, invalid: list[dict[str, Any]], status: str = "ok") -> Path:
    run = tmp_path / "run"
    run.mkdir()
    runs = [
        {"cell_id": "greedy-i12-o4-c1", "variant": v, "rep": 0, "validity": {"valid": True}} for v in "AB"
    ]
    (run / "summary.json").write_text(
        json.dumps(
            {
                "n_expected": 2,
                "n_runs": 2,
                "n_invalid": len(invalid),
                "missing_runs": [],
                "invalid_runs": invalid,
                "runs": runs,
                "numeric_certificate": {"status": status, "checks": [{"metric": "greedy_exact_match_rate"}]},
            }
        )
    )
    return run


def test_harness_outcome(tmp_path: Path) -> None:
    out = rs.harness_outcome(_summary(tmp_path, [{"run": "decode/A.r0", "violations": []}]))
    assert out["unnamed_invalid"] == 1 and out["certificate_status"] == "ok" and len(out["runs"]) == 2
    assert "no summary" in rs.harness_outcome(tmp_path / "nothing")["error"]


def test_reference_tokens(tmp_path: Path) -> None:
    ref = tmp_path / "e2e-ray.json"
    case = {"name": "short", "prompts": [{"prompt": rs.SHORT, "tokens": [1, 2, 3, 4]}]}
    ref.write_text(
        json.dumps(
            {
                "checkpoint": {"fingerprint": "f1"},
                "engines": [{"name": "main", "levels": {"optimized": {"cases": [case]}}}],
            }
        )
    )
    assert rs.reference_tokens(ref, "f1")["reference"] == [1, 2, 3, 4]
    other = rs.reference_tokens(ref, "f2")
    assert other["reference"] is None and "another checkpoint" in other["why"]
    assert rs.reference_tokens(tmp_path / "none.json", "f1")["reference"] is None


def _facts(tmp_path: Path) -> dict[str, Any]:
    return {
        "launch": rs.launch_facts(
            ["--distributed-executor-backend", "ray", "--pipeline-parallel-size", "2",
             "--speculative-config", '{"method": "dspark"}'],
            {"RAY_ADDRESS": ADDRESS},
            ADDRESS,
        ),
        "ray": {"address": ADDRESS, "nodes": [{"node": "head"}, {"node": "worker"}],
                "status": rs.parse_ray_status(RAY_STATUS)},
        "server": {"start_s": 120.0, "health_timeout_s": 1200, "died_lines": []},
        "short": {"tokens": [1, 2], "reference": [1, 2]},
        "harness": {"rc": 0} | rs.harness_outcome(_summary(tmp_path, [{"run": "x", "violations": ["lag"]}])),
        "spec_decode": {"vllm:spec_decode_num_draft_tokens": 24.0,
                        "vllm:spec_decode_num_accepted_tokens": 9.0},
        "leftovers": [],
    }  # fmt: skip


def test_targets_all_met(tmp_path: Path) -> None:
    targets = rs.rehearsal_targets(_facts(tmp_path))
    assert [t["name"] for t in targets if not t["met"]] == []
    assert all(t["direction"] in (">=", "<=") for t in targets)


def test_targets_name_their_misses(tmp_path: Path) -> None:
    facts = _facts(tmp_path)
    facts["short"] = {"tokens": [1, 3], "reference": [1, 2]}
    facts["harness"] = {"rc": 4, "error": "the harness was stopped at the rehearsal's budget"}
    facts["leftovers"] = [4242]
    facts["server"]["died_lines"] = ["RayActorError: died unexpectedly"]
    miss = {t["name"].split("/")[-1]: t for t in rs.rehearsal_targets(facts) if not t["met"]}
    assert "served [1, 3] != main's [1, 2]" in miss["short_tokens_equal_main"]["cause"]
    assert "budget" in miss["harness_exit_status"]["cause"]
    assert miss["harness_runs_present"]["measured"] is None
    assert miss["harness_certificate_ok"]["measured"] is None
    assert "4242" in miss["processes_left"]["cause"]
    assert "died unexpectedly" in miss["actors_died_unexpectedly"]["cause"]
    nothing = rs.rehearsal_targets({})  # nothing ran: no target is met, each names why
    assert not any(t["met"] for t in nothing) and all(t["cause"] for t in nothing)


def test_group_pids_finds_a_session_and_its_end() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        assert proc.pid in rs._group_pids([proc.pid])
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
    assert rs._group_pids([proc.pid]) == []
