"""Issue 42's numbered defects, each shown with stand-in processes and files (never vLLM)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deepinfer_harness.cells import parse_cell
from deepinfer_harness.cli import main
from deepinfer_harness.config import ConfigError, load_profile
from deepinfer_harness.layout import RunKey, RunLayout, read_json, write_json
from deepinfer_harness.plan import CellDef
from deepinfer_harness.records import read_records
from deepinfer_harness.run import stale, sweep
from deepinfer_harness.run.ports import cmdline
from deepinfer_harness.run.preflight import read_config
from deepinfer_harness.run.procs import MARKER_ENV, Identity

from .test_pipeline_fake import bench, write_profile
from .test_round_two import NO_PORTS
from .test_run_guards import alive, free_port, start_harness_that_dies, wait_for


def _pid_file(results: Path, run_id: str, record: dict) -> Path:
    path = results / run_id / "logs" / "A.s0.server.pid"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def _foreign(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """A process of someone else's: its own session, like another user's engine."""
    return subprocess.Popen(argv, start_new_session=True, env=env)


def _reap(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 9)
    proc.wait()


# defect 1: a process titled VLLM:: that is not ours is never killed


def test_a_foreign_vllm_titled_process_named_by_a_pid_file_is_left_alone(tmp_path):
    results = tmp_path / "results"
    proc = _foreign(["bash", "-c", 'exec -a "VLLM::EngineCore" sleep 300'])
    try:
        assert wait_for(lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"VLLM::"))
        ident = Identity.of(proc.pid)
        assert ident is not None
        argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "m"]
        base = {"pid": proc.pid, "pgid": proc.pid, "argv": argv, "base_url": "http://127.0.0.1:1"}
        _pid_file(results, "r1", base)  # the file of an older harness: no start time, no marker
        assert stale.clear(results, "r1", {1}) == []
        # even with its true start time and a marker recorded: the title is not the command line
        facts = {"start_ticks": ident.start_ticks, "boot_id": ident.boot_id, "marker": "m"}
        _pid_file(results, "r1", base | facts)
        assert stale.clear(results, "r1", {1}) == []
        assert alive(proc.pid) and proc.poll() is None
    finally:
        _reap(proc)


def test_a_process_matching_all_but_one_recorded_fact_is_never_stopped(tmp_path):
    """Same command line (a vLLM one) but no marker, or the marker but another start time."""
    results = tmp_path / "results"
    script = tmp_path / "vllm_serve.py"
    script.write_text("import time; time.sleep(300)\n")
    argv = [sys.executable, str(script), "vllm", "serve"]
    unmarked = _foreign(argv)
    marked = _foreign(argv, env={**os.environ, MARKER_ENV: "tok"})
    try:
        # Popen returns when the child's exec has begun; /proc/<pid>/cmdline and environ read empty
        # until the kernel has set up the new image's arguments (measured here: ~10 ms, longer
        # under load), and a process with an empty command line is rightly not ours
        assert wait_for(lambda: cmdline(unmarked.pid) == argv and cmdline(marked.pid) == argv)
        for proc, ticks_shift, marker in ((unmarked, 0, "tok"), (marked, 1, "tok"), (marked, 0, "other")):
            ident = Identity.of(proc.pid)
            assert ident is not None
            record = {
                "pid": proc.pid,
                "pgid": proc.pid,
                "start_ticks": ident.start_ticks + ticks_shift,
                "boot_id": ident.boot_id,
                "marker": marker,
                "argv": argv,
                "base_url": "http://127.0.0.1:1",
            }
            path = _pid_file(results, "r1", record)
            assert stale.clear(results, "r1", {1}) == [], record
            assert not path.exists() and proc.poll() is None
        # all facts match: this one is ours, and it is the only one stopped
        ident = Identity.of(marked.pid)
        assert ident is not None
        _pid_file(
            results,
            "r1",
            {
                "pid": marked.pid,
                "pgid": marked.pid,
                "start_ticks": ident.start_ticks,
                "boot_id": ident.boot_id,
                "marker": "tok",
                "argv": argv,
                "base_url": "http://127.0.0.1:1",
            },
        )
        assert stale.clear(results, "r1", {1})[0].startswith(f"stopped vLLM server PID {marked.pid} ")
        assert wait_for(lambda: marked.poll() is not None) and unmarked.poll() is None
    finally:
        _reap(unmarked)
        _reap(marked)


def test_an_orphan_of_ours_records_what_cannot_collide(tmp_path):
    results, port = tmp_path / "results", free_port()
    pid = start_harness_that_dies(results, "r1", port)
    try:
        record = json.loads((results / "r1" / "logs" / "A.s0.server.pid").read_text())
        ident = Identity.of(pid)
        assert ident is not None and record["start_ticks"] == ident.start_ticks
        assert record["boot_id"] == ident.boot_id and len(record["marker"]) == 32
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"{MARKER_ENV}={record['marker']}".encode() in env
    finally:
        if alive(pid):
            os.killpg(pid, 9)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


# defect 2: one profile per run: a resume that changes any field refuses, naming it

PREFILL_ONLY = {
    "decode": {"isl": 64, "osl": 32, "concurrencies": [], "warmup_s": 0.1, "window_s": 0.4, "min_steps": 10},
    "nll": [],
    "greedy": {"isl": 32, "osl": 8, "concurrencies": [], "n": 4},
    "ttft_isls": [],
    "prefill": {"isls": [128], "n": 2, "concurrent": []},
}


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_resume_that_changes_the_profile_refuses_naming_the_field(fake_server, tmp_path, capsys):
    fake_server.configure()
    profile = write_profile(tmp_path, fake_server.url, plan=PREFILL_ONLY)
    assert bench(tmp_path, profile, "--no-charts") == 0
    root = tmp_path / "results" / "fake"
    before = _tree(root)
    capsys.readouterr()
    assert bench(tmp_path, profile, "--no-charts", "--set", "validity.loop_lag_share=0.05") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "validity.loop_lag_share (null → 0.05)" in err[0], err
    assert "one profile per run" in err[0]
    assert _tree(root) == before  # nothing ran, nothing rewritten
    assert bench(tmp_path, profile, "--no-charts") == 0  # the same profile resumes


# defect 5: inputs that passed validation, then crashed or wasted a run: one line, exit 2, first


def _one_line_exit_2(argv: list[str], capsys, needle: str) -> None:
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and needle in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("plan.decode.window_s=.inf", "plan.decode.window_s = inf: must be finite"),
        ("plan.slo.ttft_ms=.inf", "plan.slo.ttft_ms = inf: must be finite"),
        ("plan.decode.warmup_s=.nan", "plan.decode.warmup_s = nan: must be finite"),
    ],
)
def test_a_non_finite_number_is_refused_where_it_means_nothing(override, needle, capsys, tmp_path):
    for cmd in (["validate"], ["bench-ab", "--dry-run", "--results", str(tmp_path), *NO_PORTS]):
        _one_line_exit_2([*cmd, "--profile", "smoke", "--set", override], capsys, needle)
    assert load_profile("smoke", ["plan.rate.rates=[.inf]"]).plan.rate.rates == [math.inf]  # all at once


def test_a_key_given_twice_in_a_profile_is_refused(capsys, tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("name: dup\nplan:\n  decode:\n    window_s: 10\n    window_s: 20\n")
    _one_line_exit_2(
        ["validate", "--profile", str(path)], capsys, "plan.decode.window_s is given twice (lines 4 and 5)"
    )
    path.write_text("name: dup\nab:\n  aa: true\nab:\n  repetitions: 2\n")
    _one_line_exit_2(["validate", "--profile", str(path)], capsys, "ab is given twice (lines 2 and 4)")


def test_a_served_model_name_the_url_server_does_not_serve_is_refused(fake_server, tmp_path, capsys):
    fake_server.configure()
    profile = write_profile(tmp_path, fake_server.url, plan=PREFILL_ONLY, served_model_name="wrong")
    capsys.readouterr()
    assert bench(tmp_path, profile, "--no-charts") == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: served_model_name = 'wrong': server A at {fake_server.url} serves ['fake']", err
    assert not (tmp_path / "results" / "fake" / "manifest.json").exists()  # nothing ran


@pytest.fixture
def finished_run(fake_server, tmp_path, capsys):
    fake_server.configure()
    profile = write_profile(tmp_path, fake_server.url, plan=PREFILL_ONLY)
    assert bench(tmp_path, profile, "--no-charts") == 0
    capsys.readouterr()
    return profile, tmp_path / "results" / "fake"


@pytest.mark.parametrize("name", ["manifest.json", "A.r0.summary.json", "A.r0.cell.json"])
def test_a_truncated_result_file_is_one_line_on_resume_and_report(finished_run, tmp_path, capsys, name):
    profile, root = finished_run
    path = root / name if name == "manifest.json" else next((root / "cells").glob(f"*/{name}"))
    path.write_text(path.read_text()[:40])
    before = _tree(root)
    needle = f"{path}: not valid JSON at line"
    _one_line_exit_2(["report", str(root)], capsys, needle)
    _one_line_exit_2(_bench_argv(tmp_path, profile), capsys, needle)
    assert _tree(root) == before  # nothing lost, nothing rewritten


def test_a_garbage_line_inside_a_jsonl_is_refused_a_torn_last_line_is_not(finished_run, tmp_path, capsys):
    profile, root = finished_run
    path = next((root / "cells").glob("*/A.r0.jsonl"))
    good = path.read_text()
    path.write_text(good + '{"torn": ')  # a kill mid-write: no newline after it
    assert len(read_records(path)) == len(good.splitlines())
    lines = good.splitlines()
    path.write_text("\n".join([lines[0], "garbage", *lines[1:]]) + "\n")
    before = _tree(root)
    _one_line_exit_2(_bench_argv(tmp_path, profile), capsys, f"{path}: line 2 is not JSON")
    _one_line_exit_2(["report", str(root)], capsys, f"{path}: line 2 is not JSON")
    assert _tree(root) == before


def _bench_argv(tmp_path: Path, profile: Path) -> list[str]:
    results, charts = str(tmp_path / "results"), str(tmp_path / "charts")
    profile_args = ["--profile", str(profile), "--run-id", "fake", "--no-progress"]
    return ["bench-ab", *profile_args, "--results", results, "--charts", charts]


def test_skip_check_model_is_not_undone_by_the_host_memory_check(tmp_path, capsys):
    empty = tmp_path / "ckpt"
    empty.mkdir()
    base = ["bench-ab", "--profile", "tiny-v41", "--results", str(tmp_path / "r"), "--dry-run", *NO_PORTS]
    _one_line_exit_2([*base, "--model", str(empty)], capsys, "has no config.json")  # the model check
    capsys.readouterr()
    assert main([*base, "--model", str(empty), "--skip-check", "model"]) == 0, capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"has no config\.json"):  # never "not valid JSON"
        read_config(empty)


# defect 3: a probe invalid for host load alone still anchors the sweep; the exit says the true cause

PROBE = "rate-i16-o4-rinf-poisson"
HOST_LOAD = "host load: client event-loop lag p99 3.00 ms > 5% of the cell's p99 TTFT 20.0 ms"


def test_a_probe_invalid_for_host_load_alone_anchors_the_sweep(tmp_path):
    layout = RunLayout(tmp_path / "run")
    write_json(layout.manifest, {"schedule": [{"variant": "A", "rep": 0}, {"variant": "B", "rep": 0}]})
    point = CellDef(parse_cell("rate-i16-o4-r1of4max-poisson"), n=4, params={"sweep_probe": PROBE})
    summary = {"validity": {"valid": False, "violations": [HOST_LOAD]}, "request_throughput": 40.0}
    write_json(layout.run_file(RunKey(PROBE, "A", 0), "summary.json"), summary)
    assert sweep.rate_for(layout, point, [point]) == pytest.approx(10.0)
    decision = read_json(layout.manifest)["sweeps"][PROBE]
    assert decision["probe_run"] == "A.r0" and decision["probe_run_validity"] == "invalid for host load alone"
    # a correctness failure is never an anchor, with or without host load beside it
    other = RunLayout(tmp_path / "other")
    write_json(other.manifest, {"schedule": [{"variant": "A", "rep": 0}]})
    broken = {
        "validity": {"valid": False, "violations": [HOST_LOAD, "request 3: HTTP 500"]},
        "request_throughput": 40.0,
    }
    write_json(other.run_file(RunKey(PROBE, "A", 0), "summary.json"), broken)
    assert sweep.rate_for(other, point, [point]) is None
    why = sweep.unplaced(other, [point])[PROBE]
    assert why == (  # the rule that blocked it, not the host load beside it (round six)
        f"the sweep points of {PROBE} have no rate: every run of {PROBE} broke a rule other than host "
        "load (A.r0: request 3: HTTP 500)"
    )


def test_missing_sweep_points_are_blamed_on_their_probe_not_a_dead_server(fake_server, tmp_path, capsys):
    plan = {"rate": {"rates": [], "n": 6, "isl": 16, "osl": 4, "sweep": {"points": 2}, "max_concurrency": 3}}
    profile = write_profile(tmp_path, fake_server.url, plan=plan)
    fake_server.configure(mode="error_after_200", fail_after_events=1)  # every run invalid, the probe too
    try:
        assert bench(tmp_path, profile, "--no-charts") == 4
    finally:
        fake_server.configure()
    last = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("error: "))
    want = f"error: 8 runs missing (the sweep points of {PROBE} have no rate: every run of "
    assert last.startswith(want), last
    assert "server died" not in last and "host load" in last  # "a rule other than host load"


# defect 7: ratios of zero: no pair dropped, none counted as B/A = 1


def test_a_zero_on_one_side_is_kept_and_zeros_on_both_count_for_nothing():
    from deepinfer_harness.analysis.stats import bootstrap_ratio, undefined_pair

    assert undefined_pair(0, 3, zero_is_value=True) is None  # an acceptance rate of 0: kept
    assert undefined_pair(2, 0, zero_is_value=True) is None
    assert undefined_pair(0, 0) == "A = 0 and B = 0"  # a 0 ms latency in both arms: left out, not 1
    assert undefined_pair(0, 3) == "A = 0"
    only = bootstrap_ratio([0, 0, 0, 0, 0], [0, 0, 0, 0, 3], resamples=2000)
    assert only is not None and only.ratio == math.inf and only.method == "paired_bootstrap_ratio_of_sums"
    lost = bootstrap_ratio([2, 2, 2, 2, 2], [2, 2, 2, 2, 0], resamples=2000)
    assert lost is not None and lost.ratio == pytest.approx(0.8) and lost.n_pairs == 5
    mixed = bootstrap_ratio([0, 0, 4, 4, 4], [0, 0, 2, 2, 2], resamples=2000)
    assert mixed is not None and mixed.ratio == pytest.approx(0.5)  # the 0/0 pairs do not pull it to 1
    assert mixed.ci_low == mixed.ci_high == pytest.approx(0.5)
    same = bootstrap_ratio([0, 0, 0, 0, 0], [0, 0, 0, 0, 0], resamples=2000)
    assert same is not None and same.ratio == 1.0  # every arm 0: equal
    plain = bootstrap_ratio([2, 2, 2, 2, 2], [3, 3, 3, 3, 3], resamples=2000)
    assert plain is not None and plain.method == "paired_bootstrap_logratio"  # no zero: unchanged


# defect 4: host load asks one question: could the client's own stalls have changed this verdict?


def test_a_fast_cell_on_an_idle_host_is_not_invalid_for_its_own_timings():
    from deepinfer_harness.analysis.validity import check_run
    from deepinfer_harness.cells import Cell
    from deepinfer_harness.prometheus import Snapshot

    limits = {"first_request_factor": 3.0, "inflight_fraction": 0.95, "loop_lag_share": 0.05}
    idle = {"loop_lag": {"loop_lag_p50_ms": 0.2, "loop_lag_p99_ms": 0.6, "loop_lag_max_ms": 1.0}}
    fast = {"median_ttft_ms": 2.0, "p99_ttft_ms": 3.0}  # a tiny model: sub-ms stalls are > 5% of it
    out = check_run(Cell("prefill-cold", 64), [], [], idle, Snapshot(), Snapshot(), fast, limits)
    assert not [v for v in out["violations"] if v.startswith("host load")], out["violations"]


def _row(mark: str, low: float, high: float) -> tuple[dict, object]:
    from deepinfer_harness.analysis.stats import RatioCI

    ci = RatioCI((low * high) ** 0.5, low, high, 6)
    return {"mark": mark, "why": "95 % CI excludes 1 and |effect| > A/A noise floor"}, ci


def test_the_lag_rule_marks_a_row_only_when_an_arm_sided_lag_could_change_its_verdict():
    from deepinfer_harness.analysis.ab import _judge_host_load, host_load_bound

    values = [(10.0, 8.0)] * 6  # B 20 % faster
    common = [(2.0, 1.6)] * 6  # a large lag, the same share of each arm's time: ABBA cancels it
    assert host_load_bound(values, common) == pytest.approx(0.0)
    row, ci = _row("-", 0.78, 0.82)
    _judge_host_load(row, ci, values, common)
    assert row["mark"] == "-" and row["host_load_bound"] == pytest.approx(0.0)
    small = [(0.05, 0.06)] * 6  # B's lag a little larger: 0.25 % shift at most
    row, ci = _row("-", 0.78, 0.82)
    _judge_host_load(row, ci, values, small)
    assert row["mark"] == "-" and 0 < row["host_load_bound"] < 0.01  # far from 1: stands
    one_sided = [(0.1, 2.0)] * 6  # only B's client stalled, by a quarter of its time
    row, ci = _row("-", 0.78, 0.82)
    _judge_host_load(row, ci, values, one_sided)
    assert row["mark"] == "!" and row["why"].startswith("host load: the client's own stalls could move B/A")
    row, ci = _row("~", 0.95, 1.04)  # no difference found; a one-sided lag could be hiding one
    _judge_host_load(row, ci, values, one_sided)
    assert row["mark"] == "!"
    assert host_load_bound(values, [None] * 6) is None  # runs recorded without a lag: not judged


# defect 6: a declared A/A ends in one verdict a newcomer can read


def test_a_declared_aa_run_ends_in_one_self_test_verdict(fake_server, tmp_path, capsys):
    fake_server.configure()
    profile = write_profile(tmp_path, fake_server.url, plan=PREFILL_ONLY)  # ab.aa: true
    assert bench(tmp_path, profile, "--no-charts") == 0
    out = capsys.readouterr()
    verdict = "self-test (A/A): passed: 4 of 4 runs valid, no row claims or flags a difference"
    assert out.out.splitlines()[0] == verdict and out.err.strip().splitlines()[-1] == verdict
    summary = read_json(tmp_path / "results" / "fake" / "summary.json")
    assert summary["self_test"] == {"passed": True, "line": verdict}


def test_a_failed_self_test_names_what_failed(fake_server, tmp_path, capsys):
    profile = write_profile(tmp_path, fake_server.url, plan=PREFILL_ONLY)
    fake_server.configure(restart_after_requests=2)  # a "restart" inside the first run
    try:
        bench(tmp_path, profile, "--no-charts")
    finally:
        fake_server.configure()
    line = capsys.readouterr().err.strip().splitlines()
    verdict = [x for x in line if x.startswith("self-test (A/A): ")]
    assert len(verdict) == 1 and verdict[0].startswith("self-test (A/A): FAILED: 1 runs invalid (first: "), (
        verdict
    )
    assert "restart" in verdict[0]


def test_a_live_harness_keeps_its_pid_file_even_while_it_names_no_match(tmp_path):
    """Another harness's scan never removes the PID file of a run whose harness is alive: that
    server may be mid-exec (empty command line); once the holder is gone the file is removed."""
    results = tmp_path / "results"
    results.mkdir()
    holder_script = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, f'{os.getpid()}\\n'.encode())\n"
        "print('held', flush=True)\n"
        "time.sleep(300)\n"
    )
    lock = results / ".live.lock"
    owner = subprocess.Popen(
        [sys.executable, "-c", holder_script, str(lock)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "held"
        record = {"pid": owner.pid, "pgid": owner.pid, "start_ticks": 1, "boot_id": "x", "marker": "m"}
        path = _pid_file(results, "live", record | {"argv": ["vllm", "serve"], "base_url": ""})
        assert stale.clear(results, "other", {1}) == []
        assert path.exists()
    finally:
        _reap(owner)
    assert stale.clear(results, "other", {1}) == []
    assert not path.exists()
