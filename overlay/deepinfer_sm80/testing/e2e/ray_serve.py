"""Issue 41 item 2's rehearsal: `vllm serve` over two Ray nodes, driven by the harness in URL mode.

    python -m deepinfer_sm80.testing.e2e.ray_serve [--out results/e2e-ray-serve.json]

The a800x16-tp8pp2 launch (TP8 x PP2 over two nodes, DSpark, `--distributed-executor-backend ray`,
`pass_env: RAY_ADDRESS …`) scaled to the tiny checkpoint is the profile `harness/profiles/tiny-v41-ray.yaml`
(PP2 4,2, DSpark K=3, a few dozen tokens per cell). This driver:

1. starts a head and a worker Ray node on localhost (`ray_nodes.RayNodes`: free ports, own loopback
   address and VLLM_HOST_IP each, own process group, each with its `--temp-dir` under the work directory),
   each node in the environment of the patched tree the profile's arm A names (the image a node runs:
   PYTHONPATH, the interpreter switches and the stand-ins' switch, which the actors' interpreters read
   at start), plus GLOO_SOCKET_IFNAME=lo;
2. sets RAY_ADDRESS (the head), VLLM_HOST_IP (the head's) and GLOO_SOCKET_IFNAME as a head node's shell
   has them and starts the server from the harness's own generated command for arm A (`run/launch.py`
   `build_launch`: argv and the environment it gives a local server, plumbing + `pass_env` + the
   profile's env; nothing else of this process reaches the server), niced as the profile says;
3. once /health answers: `ray status` of the head (both nodes, both stand-in devices taken by the
   engine's placement group: one stage per node), then the e2e short prompt as token ids through
   /v1/completions, whose greedy tokens must be the single-stage main engine's (results/e2e-ray.json,
   same checkpoint fingerprint);
4. runs `bench-ab --url A=… --url B=…` (the same server for both arms: the profile declares A/A) and
   reads its summary: every scheduled run present, every invalid run with its violations named, the
   numeric certificate (greedy tokens identical across sessions, NLL of the same server A/A);
5. reads the DSpark counters from /metrics, stops the server (SIGINT, SIGTERM, SIGKILL to its group) and
   both nodes (by process group), and checks that no process of those groups is left.

The JSON has provenance and a `targets` list; a miss names its cause. Pure pieces (profile → launch
facts, `ray status` parsing, the harness's outcome, the targets) need neither Ray nor vLLM (unit tests:
overlay/tests/e2e/test_ray_serve.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deepinfer_sm80.testing.bench import at_least, at_most
from deepinfer_sm80.testing.e2e.engines import MIN_ACCEPTANCE, _prompt
from deepinfer_sm80.testing.e2e.ray_engine import DIED, GLOO_IFNAME
from deepinfer_sm80.testing.e2e.ray_nodes import DEVICE_RESOURCE, HEAD_IP, NodeSpec, RayNodes
from deepinfer_sm80.testing.e2e.tree import ROOT

PROFILE = ROOT / "harness" / "profiles" / "tiny-v41-ray.yaml"
REFERENCE = ROOT / "results" / "e2e-ray.json"  # main's greedy tokens on the short prompt, its checkpoint
WORK = ROOT / ".cache" / "e2e-ray-serve"
SNAPSHOT_WORK = ROOT / ".cache" / "e2e-ray"  # the Ray case's snapshot of the checkpoint (reused, not copied)
OUT = ROOT / "results" / "e2e-ray-serve.json"
ARM = "A"  # the arm whose generated command starts the one server (A/A: B is the same server)
SHORT = _prompt("short", 12)  # the runner's short prompt (runner.plan)
SHORT_TOKENS = 4
PP = 2
RAY_FLAGS = {"--distributed-executor-backend": "ray", "--pipeline-parallel-size": str(PP)}
HOST_ENV_NAMES = ("RAY_ADDRESS", "VLLM_HOST_IP", "GLOO_SOCKET_IFNAME")
TEARDOWN_S = 240.0  # kept back from the budget for stopping the harness, the server and the nodes
MAX_TEMP_DIR = 40  # characters: Ray's session sockets live ~60 below it, and a unix socket path has 107


# ----------------------------------------------------------------------------- pure pieces
def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value after the last `flag` in argv (argparse: the last one wins), None when absent."""
    value = None
    for i, part in enumerate(argv[:-1]):
        if part == flag:
            value = argv[i + 1]
    return value


def launch_facts(argv: Sequence[str], env: dict[str, str], address: str) -> dict[str, Any]:
    """What the harness generated for the server: the Ray flags, DSpark, the partition, and whether the
    head's address reached the server's environment through `pass_env`."""
    spec = flag_value(argv, "--speculative-config")
    try:
        method = json.loads(spec).get("method") if spec else None
    except json.JSONDecodeError:
        method = None
    flags = {flag: flag_value(argv, flag) for flag in RAY_FLAGS}
    return {
        "ray_flags": flags,
        "ray_flags_ok": all(flags[f] == v for f, v in RAY_FLAGS.items()),
        "speculative_method": method,
        "partition": env.get("VLLM_PP_LAYER_PARTITION"),
        "ray_address": env.get("RAY_ADDRESS"),
        "ray_address_passed": bool(address) and env.get("RAY_ADDRESS") == address,
    }


def parse_ray_status(text: str) -> dict[str, Any]:
    """`ray status` (integration.ray_status): the nodes up, Active and Idle alike, and the stand-in device
    resource's use (placement-group reservations counted as used); None where it does not say."""
    from deepinfer_sm80.integration.ray_status import parse

    status = parse(text)
    used, total = status.usage.get(DEVICE_RESOURCE, (None, None))
    return {"nodes_up": status.nodes_up, "devices_used": used, "devices_total": total}


def with_temp_dirs(specs: Sequence[NodeSpec], root: Path) -> list[NodeSpec]:
    """Each node's `ray start` gets its own `--temp-dir` under `root` (Ray's default is /tmp/ray)."""
    for spec in specs:
        spec.argv += ["--temp-dir", str(root / spec.name[0])]
    return list(specs)


def temp_root(work: Path) -> tuple[Path, bool]:
    """Where the nodes' temp dirs go: under `work` when the path is short enough for Ray's sockets, else
    a fresh directory under the system temp dir (removed at the end: the bool)."""
    root = work / "rt"
    if len(str(root.resolve())) <= MAX_TEMP_DIR:
        return root, False
    return Path(tempfile.mkdtemp(prefix="dsr-")), True


def harness_argv(profile: Path, model: Path, url: str, run_id: str, work: Path) -> list[str]:
    """`bench-ab` in URL mode: both arms the one server (the profile declares A/A)."""
    return [
        sys.executable, "-m", "deepinfer_harness", "bench-ab",
        "--profile", str(profile),
        "--model", str(model),
        "--url", f"A={url}",
        "--url", f"B={url}",
        "--run-id", run_id,
        "--results", str(work / "bench-ab"),
        "--charts", str(work / "charts"),
        "--no-charts",
        "--no-progress",
    ]  # fmt: skip


def harness_outcome(run_dir: Path) -> dict[str, Any]:
    """The harness's summary.json as the rehearsal judges it: runs expected / present / invalid (each
    with its violations), the missing ones, the numeric certificate and DSpark acceptance per workload."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return {"summary": None, "error": f"{path}: no summary (the harness stopped before its report)"}
    s = json.loads(path.read_text())
    invalid = [
        {"run": r.get("run"), "violations": list(r.get("violations") or [])}
        for r in s.get("invalid_runs") or []
    ]
    cert = s.get("numeric_certificate") or {}
    runs = [
        {"cell_id": r.get("cell_id"), "variant": r.get("variant"), "rep": r.get("rep"),
         "valid": (r.get("validity") or {}).get("valid"), "completed": r.get("completed"),
         "failed": r.get("failed")}
        for r in s.get("runs") or []
    ]  # fmt: skip
    return {
        "summary": str(path),
        "n_expected": s.get("n_expected"),
        "n_runs": s.get("n_runs"),
        "n_invalid": s.get("n_invalid"),
        "missing_runs": s.get("missing_runs") or [],
        "invalid_runs": invalid,
        "unnamed_invalid": sum(1 for r in invalid if not r["violations"]),
        "runs": runs,
        "certificate_status": cert.get("status"),
        "certificate_checks": [
            {k: c.get(k) for k in ("cell_id", "metric", "measured", "goal", "direction", "met")}
            for c in cert.get("checks") or []
        ],
        "acceptance_by_workload": s.get("acceptance_by_workload"),
    }


def _rel(path: Path) -> str:
    """`path` relative to the repository when it is inside it (the JSON is committed)."""
    full = Path(path).resolve()
    return str(full.relative_to(ROOT)) if full.is_relative_to(ROOT) else str(path)


def reference_tokens(reference: Path, fp: str) -> dict[str, Any]:
    """Main's greedy tokens on the short prompt at the optimized level from the e2e Ray evidence, when it
    was made from the same checkpoint (fingerprint) and prompt; else why there is no reference."""
    if not reference.is_file():
        return {"reference": None, "why": f"{reference}: no such file"}
    data = json.loads(reference.read_text())
    if (data.get("checkpoint") or {}).get("fingerprint") != fp:
        return {"reference": None, "why": f"{reference} was made from another checkpoint (fingerprint)"}
    for engine in data.get("engines") or []:
        if engine.get("name") != "main":
            continue
        for case in ((engine.get("levels") or {}).get("optimized") or {}).get("cases") or []:
            if case.get("name") == "short":
                p = case["prompts"][0]
                if p.get("prompt") == SHORT:
                    return {
                        "reference": list(p["tokens"]),
                        "why": "",
                        "source": f"{_rel(reference)} main/optimized/short",
                    }
    return {"reference": None, "why": f"{reference} has no main/optimized short case on this prompt"}


def _target(
    name: str, measured: float | None, goal: float, unit: str, direction: str, met: bool, cause: str
) -> dict[str, Any]:
    """bench.at_least ("min") / at_most ("max") as a dict; `met` also needs the caller's condition;
    unmeasured (None) is never met and names its cause."""
    if measured is None:
        return {"name": name, "measured": None, "goal": goal, "unit": unit,
                "direction": ">=" if direction == "min" else "<=", "met": False, "cause": cause}  # fmt: skip
    helper = at_least if direction == "min" else at_most
    t = helper(name, float(measured), goal, unit, cause).as_dict()
    if t["met"] and not met:
        t["met"], t["cause"] = False, cause
    return t


def rehearsal_targets(f: dict[str, Any]) -> list[dict[str, Any]]:
    """The rehearsal's targets from its facts (see `rehearse`); each miss names its cause."""
    launch = f.get("launch") or {}
    ray = f.get("ray") or {}
    status = ray.get("status") or {}
    server = f.get("server") or {}
    short = f.get("short") or {}
    harness = f.get("harness") or {}
    spec = f.get("spec_decode") or {}
    drafted = spec.get("vllm:spec_decode_num_draft_tokens")
    accepted = spec.get("vllm:spec_decode_num_accepted_tokens")
    acceptance = accepted / drafted if drafted and accepted is not None else None
    ref, got = short.get("reference"), short.get("tokens")
    same = None if ref is None else 1.0 if got == ref else 0.0
    n_nodes = len(ray.get("nodes") or [])
    expected = harness.get("n_expected")
    present = harness.get("n_runs")
    leftovers = f.get("leftovers")
    t = "ray_serve/optimized"  # engine/level/target, as the runner names its targets
    return [
        _target(f"{t}/ray_nodes_started", n_nodes, PP, "nodes", "min", True,
                ray.get("error") or "the Ray nodes did not start"),
        _target(f"{t}/generated_command_ray_pp2", 1.0 if launch.get("ray_flags_ok") else 0.0, 1, "bool",
                "min", bool(launch.get("ray_flags_ok")),
                f"the harness's command carries {launch.get('ray_flags')}, not {RAY_FLAGS}"),
        _target(f"{t}/generated_command_dspark", 1.0 if launch.get("speculative_method") == "dspark" else 0.0,
                1, "bool", "min", True, f"--speculative-config method {launch.get('speculative_method')!r}"),
        _target(f"{t}/ray_address_passed", 1.0 if launch.get("ray_address_passed") else 0.0, 1, "bool",
                "min", True, f"the server's RAY_ADDRESS {launch.get('ray_address')!r} is not the head's "
                f"{ray.get('address')!r} (server.pass_env)"),
        _target(f"{t}/server_healthy_s", server.get("start_s"), server.get("health_timeout_s") or 0, "s",
                "max", True, server.get("error") or "the server never answered /health"),
        _target(f"{t}/ray_nodes_up", status.get("nodes_up"), PP, "nodes", "min", True,
                ray.get("status_error") or f"`ray status` while serving: {status}"),
        _target(f"{t}/stage_devices_taken", status.get("devices_used"), PP, DEVICE_RESOURCE, "min", True,
                ray.get("status_error") or "the engine's placement group did not take one device per node"),
        _target(f"{t}/short_tokens_equal_main", same, 1, "bool", "min", same == 1.0,
                short.get("error") or short.get("why") or f"served {got} != main's {ref}"),
        _target(f"{t}/dspark_acceptance", acceptance, MIN_ACCEPTANCE, "accepted/drafted", "min", True,
                f"/metrics: {spec or 'no DSpark counters'}"),
        _target(f"{t}/harness_exit_status", harness.get("rc"), 0, "exit status", "max", True,
                harness.get("error") or "the harness's exit status (4: runs missing, 130: stopped)"),
        _target(f"{t}/harness_runs_present", present, expected or 1, "runs", "min",
                bool(expected) and not harness.get("missing_runs"),
                f"missing: {harness.get('missing_runs')}" if harness.get("missing_runs")
                else harness.get("error") or "no summary"),
        _target(f"{t}/harness_invalid_runs_unnamed", harness.get("unnamed_invalid"), 0, "runs", "max", True,
                harness.get("error") or "an invalid run without its violations"),
        _target(f"{t}/harness_certificate_ok", 1.0 if harness.get("certificate_status") == "ok" else 0.0
                if harness.get("summary") else None, 1, "bool", "min", True,
                f"certificate {harness.get('certificate_status')!r}: {harness.get('certificate_checks')}"),
        _target(f"{t}/actors_died_unexpectedly", len(server.get("died_lines") or []) if server else None, 0,
                "log lines", "max", True, "; ".join((server.get("died_lines") or [])[:2]) or "no server log"),
        _target(f"{t}/processes_left", None if leftovers is None else len(leftovers), 0, "processes", "max",
                True, f"left after the stop: {leftovers}"),
    ]  # fmt: skip


# ----------------------------------------------------------------------------- the run
def _group_pids(pgids: Sequence[int]) -> list[int]:
    """Live processes (not zombies) whose process group is one of `pgids`."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) in pgids:
            out.append(int(stat.parent.name))
    return sorted(out)


def _stop_harness(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C to the harness's group (it stops its cells and writes its report), then SIGKILL."""
    from deepinfer_sm80.testing.e2e.serve import stop_group

    stop_group(proc, ((signal.SIGINT, 90.0), (signal.SIGKILL, 10.0)))


def rehearse(args: argparse.Namespace) -> dict[str, Any]:
    from deepinfer_harness.config import load_profile
    from deepinfer_harness.run.launch import build_launch, level_env
    from deepinfer_sm80.testing.e2e.models import SELECTING, fingerprint, snapshot, variant
    from deepinfer_sm80.testing.e2e.serve import _healthy, _post, _spec_counters, _stop

    t0 = time.monotonic()
    end = t0 + args.budget_s
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    run_id = f"tiny-v41-ray-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    profile = load_profile(str(args.profile))
    ckpt = snapshot(Path(args.model), Path(args.snapshot_work))
    model = variant(ckpt, work, SELECTING)
    facts: dict[str, Any] = {
        "run_id": run_id,
        "profile": _rel(Path(args.profile)),
        "profile_sha256": hashlib.sha256(Path(args.profile).read_bytes()).hexdigest(),
        "model": {
            "source": str(args.model),
            "snapshot": str(ckpt),
            "fingerprint": fingerprint(ckpt),
            "served": str(model),
            "config_overrides": SELECTING,
        },
    }
    short: dict[str, Any] = {"prompt": SHORT} | reference_tokens(Path(args.reference), fingerprint(ckpt))
    facts["short"] = short
    launch = build_launch(profile, ARM, str(model), run_id, 0)
    tree_env = dict(level_env(profile.server.levels[ARM], profile.server.level_work))
    node_env = dict(os.environ) | tree_env | GLOO_IFNAME
    ray_bin = str(Path(sys.executable).with_name("ray"))
    nodes = RayNodes(work / "ray", node_env, ray_bin=ray_bin)
    troot, remove_troot = temp_root(work)
    tmp_ray_before = Path("/tmp/ray").exists()
    ray: dict[str, Any] = {"temp_root": str(troot)}
    server: dict[str, Any] = {"health_timeout_s": profile.server.health_timeout_s}
    harness: dict[str, Any] = {}
    facts |= {"ray": ray, "server": server, "harness": harness}
    proc: subprocess.Popen[bytes] | None = None
    hproc: subprocess.Popen[bytes] | None = None
    pgids: list[int] = []
    log_path = work / "server.log"
    try:
        nodes.start(with_temp_dirs(nodes.specs(), troot))
        pgids += [n.pid for n in nodes.nodes]
        ray |= {
            "address": nodes.address,
            "nodes": [{"node": n.spec.name, "ip": n.spec.ip} for n in nodes.nodes],
        }
        host = {"RAY_ADDRESS": nodes.address, "VLLM_HOST_IP": HEAD_IP} | GLOO_IFNAME
        os.environ.update(host)  # the head node's shell: what `pass_env` copies from
        env = launch.process_env()
        facts["launch"] = launch_facts(launch.argv, env, nodes.address) | {
            "argv": launch.argv,
            "command": launch.describe(),
            "env": launch.recorded_env(),
            "nice": launch.nice,
        }
        argv = (["nice", "-n", str(launch.nice)] if launch.nice else []) + launch.argv
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        pgids.append(proc.pid)
        server |= {"log": str(log_path), "url": launch.base_url}
        t_start = time.monotonic()
        health_end = min(t_start + profile.server.health_timeout_s, end - TEARDOWN_S)
        while not _healthy(launch.base_url):
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode} before /health")
            if time.monotonic() > health_end:
                raise TimeoutError(f"the server was not healthy after {time.monotonic() - t_start:.0f} s")
            time.sleep(2.0)  # polling: /health has no event to wait on
        server["start_s"] = time.monotonic() - t_start
        print(f"ray-serve: healthy after {server['start_s']:.0f} s at {launch.base_url}", flush=True)
        st = subprocess.run(
            [ray_bin, "status", "--address", nodes.address], capture_output=True, text=True, timeout=180,
            env=node_env | {"RAY_ADDRESS": nodes.address},
        )  # fmt: skip
        ray["status"] = parse_ray_status(st.stdout)
        ray["status_text"] = st.stdout[-2000:]
        if st.returncode:
            ray["status_error"] = f"ray status exited with {st.returncode}: {st.stderr.strip()[-300:]}"
        try:
            t = time.monotonic()
            body = {"model": profile.served_model_name, "prompt": SHORT, "max_tokens": SHORT_TOKENS,
                    "temperature": 0.0, "return_token_ids": True}  # fmt: skip
            reply = _post(launch.base_url + "/v1/completions", body, max(end - TEARDOWN_S - t, 60.0))
            short["tokens"] = list(reply["choices"][0].get("token_ids") or [])
            short["wall_s"] = time.monotonic() - t
            print(
                f"ray-serve: short prompt -> {short['tokens']}, main's {short.get('reference')}", flush=True
            )
        except (urllib.error.URLError, OSError, KeyError, ValueError) as err:
            short["error"] = f"{type(err).__name__}: {err}"
        hargv = ["nice", "-n", str(args.harness_nice), *harness_argv(
            Path(args.profile), model, launch.base_url, run_id, work)]  # fmt: skip
        harness |= {"argv": hargv[3:], "log": str(work / "harness.log")}
        t = time.monotonic()
        with (work / "harness.log").open("wb") as hlog:
            hproc = subprocess.Popen(hargv, cwd=ROOT, stdout=hlog, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        try:
            harness["rc"] = hproc.wait(timeout=max(end - TEARDOWN_S - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            harness["error"] = f"the harness was stopped at the rehearsal's budget ({args.budget_s:.0f} s)"
            _stop_harness(hproc)
            harness["rc"] = hproc.returncode
        harness["wall_s"] = time.monotonic() - t
        run_dir = work / "bench-ab" / run_id
        if not (run_dir / "summary.json").exists() and (run_dir / "manifest.json").exists():
            # a harness stopped at the budget leaves its runs' files: its own `report` derives the summary
            rep = subprocess.run(
                [sys.executable, "-m", "deepinfer_harness", "report", str(run_dir)],
                cwd=ROOT, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            harness["report_rederived"] = {"rc": rep.returncode, "stderr_tail": rep.stderr.strip()[-300:]}
        outcome = harness_outcome(run_dir)
        stopped_why = harness.get("error", "")
        harness |= outcome | {"error": "; ".join(x for x in (stopped_why, outcome.get("error", "")) if x)}
        try:
            facts["spec_decode"] = _spec_counters(launch.base_url)
        except (urllib.error.URLError, OSError, ValueError) as err:
            facts["spec_decode_error"] = f"{type(err).__name__}: {err}"
    except Exception as err:  # reported in the JSON; the finally below stops everything
        facts["error"] = f"{type(err).__name__}: {err}"
        if "address" not in ray:
            ray["error"] = facts["error"]
        elif "start_s" not in server:
            server["error"] = facts["error"]
    finally:
        if hproc is not None:
            _stop_harness(hproc)
        if proc is not None:
            _stop(proc)
            server["rc"] = proc.returncode
        ray["stopped"] = nodes.stop()
        time.sleep(1.0)
        facts["leftovers"] = _group_pids(pgids)
        if remove_troot:
            shutil.rmtree(troot, ignore_errors=True)
        ray["tmp_ray_created"] = Path("/tmp/ray").exists() and not tmp_ray_before
    text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    server["died_lines"] = [ln for ln in text.splitlines() if any(d in ln for d in DIED)]
    server["log_tail"] = [ln for ln in text.splitlines() if ln.strip()][-5:]
    hlog_path = work / "harness.log"
    if hlog_path.is_file():
        lines = hlog_path.read_text(errors="replace").splitlines()
        harness["log_tail"] = [ln for ln in lines if ln.strip()][-8:]
    facts["wall_s"] = time.monotonic() - t0
    return facts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {__name__}", description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=ROOT / ".cache" / "tiny-v41")
    p.add_argument("--profile", type=Path, default=PROFILE)
    p.add_argument("--work", type=Path, default=WORK)
    p.add_argument("--snapshot-work", type=Path, default=SNAPSHOT_WORK)
    p.add_argument("--reference", type=Path, default=REFERENCE)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--budget-s", type=float, default=3000.0, help="the whole rehearsal, teardown included")
    p.add_argument("--harness-nice", type=int, default=5)
    args = p.parse_args(argv)
    from deepinfer_sm80.testing.provenance import provenance

    prov = provenance("python -m deepinfer_sm80.testing.e2e.ray_serve " + shlex.join(argv or sys.argv[1:]))
    facts = rehearse(args)
    targets = rehearsal_targets(facts)
    met = sum(1 for t in targets if t["met"])
    out = {
        "provenance": prov | {"load_avg_at_end": list(os.getloadavg())},
        "what": "issue 41 item 2: `vllm serve` PP2 4,2 + DSpark over two Ray nodes on localhost, launched "
        "from the harness's generated command (profile tiny-v41-ray, a800x16-tp8pp2 scaled to the tiny "
        "checkpoint) and driven by the harness in URL mode; CPU-interpreter timings say nothing about a GPU",
        **facts,
        "targets": targets,
        "all_met": met == len(targets),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"ray-serve: {met}/{len(targets)} targets met in {facts['wall_s']:.0f} s -> {args.out}")
    for t in targets:
        if not t["met"]:
            print(f"ray-serve: NOT MET {t['name']}: {t['measured']} vs {t['goal']} ({t['cause']})")
    return 0 if met == len(targets) else 1


if __name__ == "__main__":
    sys.exit(main())
