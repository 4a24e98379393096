"""The engine on a GPU (issue 38): vLLM 0.32.0 serving the tiny V4.1 checkpoint through the SM8x path with
CUDA graphs and the async scheduler, our kernels compiled, stand-ins only for vLLM's compiled ops.

    python -m deepinfer_sm80.testing.e2e.gpu run   --model DIR --sites DIR --wheels DIR --raw DIR
                                                   [--engines main@optimized,eager@optimized,...]
    python -m deepinfer_sm80.testing.e2e.gpu check --raw DIR --model DIR --out FILE [--no-oracle]

`run` (on the GPU) starts each engine at each level in its own interpreter (`gpu_worker.py`, in
`gpu_env(level)`: the GPU startup hook, overlay, carried wheels, the level's patched site; the capability
forced to 80; DEEPINFER_E2E_CUDA=1) and writes RAW/<engine>-<level>.json as soon as that engine ends,
so a later failure loses nothing. `check` (anywhere) reads them and writes one JSON with provenance and
`targets`: every row counted as `make e2e-cpu` counts it, the oracle's gates and greedy rules
(`runner.engine_targets`), both levels identical, speculation on/off identical, graphs vs eager
identical, the tokens of the committed CPU runs on the same checkpoint (sha256 of its shard), the
prefix-cache hit, CUDA graphs captured and replayed, the async scheduler on.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from deepinfer_sm80.testing.e2e import ENGRAM_CONFIG, MAX_MODEL_LEN, check_checkpoint
from deepinfer_sm80.testing.e2e.models import SELECTING, variant
from deepinfer_sm80.testing.e2e.runner import (
    CHUNK_TOKENS,
    DECODE_ROWS,
    DSPARK,
    EVERY_FORWARD,
    LEVELS,
    LONG_TOKENS,
    SELECTING_ROWS,
    CachedOracle,
    Case,
    Engine,
    _prompt,
    _target,
    engine_targets,
    level_agreement,
    worker_cases,
)
from deepinfer_sm80.testing.e2e.standins import CUDA_STANDINS, cuda_env
from deepinfer_sm80.testing.e2e.tree import ROOT, canonical_level

HOOK_DIR = Path(__file__).resolve().parent / "gpu_hook"
OVERLAY_DIR = ROOT / "overlay"
KV_CACHE_BYTES = 1 << 30
# CUDA graphs without vLLM's torch.compile (inductor is torch 2.11's here, not the 2.13 vLLM expects): whole
# decode steps captured and replayed, the model run eagerly otherwise; it tells a compile failure from a
# graph failure.
NOCOMPILE_GRAPHS = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY", "custom_ops": ["none"]}
# The CPU runs these tokens are compared with (scripts/make_tiny_v41.py, seed 0). The committed ones predate
# recipe 4: they ran on recipe 3 (shard sha256 17ac45df…), whose bytes differ from recipe 4's only in the
# DSpark Markov head (`mtp.2.markov_head.{embed,head}.weight`, tiny_v41_drafter.py); the target model
# drops every `mtp.` tensor at load (vLLM's V4.1 weights mapper), so main's greedy tokens are the same
# function of both. `check` records each file's provenance beside the comparison.
CPU_RUNS = ("results/e2e-cpu.json", "results/e2e-cpu-full-base.json")
# sha256 of the tiny checkpoint's shard as `make tiny-model` writes it on the development machine
# (2026-12-07, recipe 4, digest 4c62cb37…, drafter map 9e784fd5…); the device generates its own with the
# same script and the check compares the two.
CPU_SHARD_SHA256 = "fff3c0cb70e9af27b6e1d03fabb2c837cc8bc80cfa48d4c43521d01929e4d66d"
SHARD = "model-00001-of-00001.safetensors"


_EXCEPTION_LINE = re.compile(r"(?:^|\] )((?:[\w.]+\.)?\w*(?:Error|Exception): .+)$")


def with_root_cause(lines: list[str], error: str) -> str:
    """`error` (the failing traceback's last lines), prefixed by the last exception line logged before
    that traceback when it differs: vLLM often logs the real failure (a subprocess's traceback, a
    worker's) and then raises a generic one (pydantic's "failed to be inspected")."""
    final = next(
        (i for i in range(len(lines) - 1, -1, -1) if lines[i].lstrip().startswith("Traceback")), len(lines)
    )
    for line in reversed(lines[:final]):
        hit = _EXCEPTION_LINE.search(line.strip())
        if hit and hit.group(1) not in error:
            return f"root cause: {hit.group(1)} | {error}"
    return error


def gpu_env(level: str, sites: Path, wheels: Path | None) -> dict[str, str]:
    """PYTHONPATH (GPU hook, overlay, carried wheels, the level's site) and the switches of the GPU run."""
    site = Path(sites) / canonical_level(level) / "site"
    if not (site / "vllm" / "__init__.py").exists():
        raise FileNotFoundError(f"{site}: no vLLM tree (unpack the GPU engine bundle first)")
    return site_env(site, wheels)


def site_env(site: Path, wheels: Path | None) -> dict[str, str]:
    """gpu_env's settings for one unpacked site (also the device-like import probe's, gpu_probe.py)."""
    parts = [str(HOOK_DIR), str(OVERLAY_DIR), *([str(wheels)] if wheels else []), str(site)]
    return cuda_env() | {
        "PYTHONPATH": os.pathsep.join(parts),
        "DEEPINFER_SM80_FORCE_CAPABILITY": "80",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the cases' row counts are read in the engine's process
        "PYTHONUNBUFFERED": "1",
    }


def engine_kwargs(*, eager: bool = False) -> dict[str, Any]:
    """The GPU engine: vLLM's default compilation and CUDA-graph capture (unless `eager`), the async
    scheduler, chunked prefill in CHUNK_TOKENS chunks, prefix caching, 4 sequences at once; norms and
    activations on torch's path (`custom_ops: none`, no compiled `_C` kernels); the MXFP4 experts through
    vLLM's Marlin experts class (sm_80's) with the CUDA MoE stand-in (`--moe-backend marlin`,
    standins.CUDA_STANDINS)."""
    kwargs: dict[str, Any] = {
        "dtype": "bfloat16",
        "kv_cache_dtype": "fp8_ds_mla",
        "max_model_len": MAX_MODEL_LEN,
        "max_num_seqs": 4,
        "kv_cache_memory_bytes": KV_CACHE_BYTES,
        "limit_mm_per_prompt": {"image": 0},
        "engram_config": dict(ENGRAM_CONFIG),
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": CHUNK_TOKENS,
        "enable_prefix_caching": True,
        "async_scheduling": True,
        "moe_backend": "marlin",
        "compilation_config": {"custom_ops": ["none"]},
    }
    if eager:
        kwargs["enforce_eager"] = True
    return kwargs


def plan(engram: bool) -> list[Engine]:
    """main (both levels): short, the 48- and 130-token selecting prompts chunked, a prefix-cache hit and
    four concurrent requests; dspark (both levels): speculation on, tokens = main's; eager (optimized):
    graphs off, tokens = main's; graphs_nocompile (optimized): full decode graphs without torch.compile."""
    every = EVERY_FORWARD + (["engram_lookup"] if engram else [])
    short, long48, long130 = _prompt("short", 12), _prompt("long", LONG_TOKENS["ci"]), _prompt("long", 130)
    rows_short = {lv: every + DECODE_ROWS for lv in LEVELS}
    rows_long = {lv: every + DECODE_ROWS + SELECTING_ROWS[lv] for lv in LEVELS}
    cases = [
        Case("short", [short], 4, rows_short, "12-token prompt, 4 greedy tokens"),
        Case(
            "long_chunked",
            [long48],
            2,
            rows_long,
            f"48-token prompt, indexer top-16, chunks of {CHUNK_TOKENS}",
        ),
        Case(
            "long_130", [long130], 2, rows_long, "130-token prompt: past one 128-token block and the window"
        ),
        Case(
            "prefix_hit",
            [long130 + _prompt("tail", 8)],
            2,
            rows_long,
            "the 130-token prompt + 8 tokens: its first 128-token block from the prefix cache",
            expect_cached=True,
        ),
        Case(
            "concurrent",
            [short, long48, _prompt("c2", 24), _prompt("c3", 40)],
            6,
            rows_long,
            "four requests in one batch (max_num_seqs 4): decode steps of several sequences",
        ),
    ]
    spec = {"speculative_config": DSPARK, "disable_log_stats": False}
    return [
        Engine("main", SELECTING, engine_kwargs(), cases),
        Engine(
            "dspark",
            SELECTING,
            engine_kwargs() | spec,
            [
                Case(
                    "short", [short], 4, {lv: [*every, "dspark_draft"] for lv in LEVELS}, "DSpark, 3 drafts"
                ),
                Case("long_chunked", [long48], 2, rows_long, "DSpark on the 48-token selecting prompt"),
            ],
            spec_of="main",
        ),
        Engine(
            "eager",
            SELECTING,
            engine_kwargs(eager=True),
            [cases[0], cases[1], cases[4]],
            levels=("optimized",),
            same_as="main",
        ),
        Engine(
            "graphs_nocompile",
            SELECTING,
            engine_kwargs() | {"compilation_config": NOCOMPILE_GRAPHS},
            [cases[0], cases[1], cases[4]],
            levels=("optimized",),
            same_as="main",
        ),
    ]


# ----------------------------------------------------------------------------- run (on the GPU)
def run_engine(
    level: str, engine: Engine, model: Path, env: dict[str, str], work: Path, timeout: float
) -> dict:
    run_dir = work / "runs" / f"{engine.name}-{level}"
    run_dir.mkdir(parents=True, exist_ok=True)
    plan_path, out_path, log_path = run_dir / "plan.json", run_dir / "out.json", run_dir / "engine.log"
    out_path.unlink(missing_ok=True)
    plan_path.write_text(
        json.dumps({"model": str(model), "engine": engine.engine, "cases": worker_cases(engine)})
    )
    cmd = [sys.executable, "-m", "deepinfer_sm80.testing.e2e.gpu_worker", str(plan_path), str(out_path)]
    t0 = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            cmd,
            env=os.environ | env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=run_dir,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = 124
        finally:
            import signal

            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    wall = time.perf_counter() - t0
    text = log_path.read_text(errors="replace")
    if rc != 0 or not out_path.exists():
        lines = [ln for ln in text.splitlines() if ln.strip()]
        error_at = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith("Traceback")), None)
        trace = lines[error_at:][-40:] if error_at is not None else lines[-25:]
        return {
            "ok": False,
            "rc": rc,
            "wall_s": wall,
            "error": with_root_cause(lines, " | ".join(lines[-3:])),
            "traceback": trace,
            "log_tail": lines[-60:],
        }
    return {"ok": True, "rc": 0, "wall_s": wall} | json.loads(out_path.read_text())


def cmd_run(args: argparse.Namespace) -> int:
    model = args.model.resolve()
    cfg = check_checkpoint(model)
    text = cfg.get("text_config", cfg)
    engines = plan(bool(text.get("engram_layer_ids")))
    wanted = [tuple(e.split("@")) if "@" in e else (e, "") for e in args.engines.split(",") if e]
    raw = args.raw.resolve()
    raw.mkdir(parents=True, exist_ok=True)
    by_name = {e.name: e for e in engines}
    deadline = time.monotonic() + args.budget
    for name, lv in wanted:
        engine = by_name[name]
        mdl = variant(model, args.work.resolve(), engine.overrides)
        for level in [canonical_level(lv)] if lv else list(engine.levels):
            if level not in engine.levels:
                continue
            left = deadline - time.monotonic()
            if left < 60:
                print(f"gpu-e2e: {name}@{level} not run (budget spent)", flush=True)
                continue
            env = gpu_env(level, args.sites, args.wheels)
            print(f"gpu-e2e: engine {name} at {level} ...", flush=True)
            out = run_engine(level, engine, mdl, env, args.work.resolve(), min(args.engine_timeout, left))
            out |= {"engine": name, "level": level, "engine_kwargs": engine.engine}
            (raw / f"{name}-{level}.json").write_text(json.dumps(out, indent=1))
            status = (
                f"{out['wall_s']:.0f} s" if out["ok"] else f"FAILED rc={out['rc']}: {out['error'][-400:]}"
            )
            print(f"gpu-e2e: engine {name} at {level}: {status}", flush=True)
            if not out["ok"]:
                print("\n".join(out["traceback"][-30:]), flush=True)
    return 0


# ----------------------------------------------------------------------------- check (anywhere)
def _cpu_tokens() -> dict[tuple[int, ...], list[int]]:
    """prompt -> greedy tokens of the committed CPU runs' main engine (both plans, every level agreeing)."""
    found: dict[tuple[int, ...], list[int]] = {}
    for rel in CPU_RUNS:
        path = ROOT / rel
        if not path.exists():
            continue
        for eng in json.loads(path.read_text())["engines"]:
            if eng["name"] != "main":
                continue
            for out in eng["levels"].values():
                for case in out.get("cases", []) if out.get("ok") else []:
                    for p in case["prompts"]:
                        found.setdefault(tuple(p["prompt"]), p["tokens"])
    return found


def _cpu_runs_provenance() -> list[dict[str, Any]]:
    """Which committed CPU runs the tokens are compared with: file, date, git sha, plan."""
    rows = []
    for rel in CPU_RUNS:
        path = ROOT / rel
        if path.exists():
            data = json.loads(path.read_text())
            prov = data.get("provenance", {})
            rows.append(
                {
                    "file": rel,
                    "date": prov.get("date"),
                    "git_sha": prov.get("git_sha"),
                    "plan": data.get("plan"),
                }
            )
    return rows


def full_sha(sha: str) -> str:
    """The device's DEEPINFER_GIT_SHA as the full 40-hex sha of this checkout's commit (a short one
    expanded by `git rev-parse`; unchanged when git cannot resolve it, which the provenance test
    then reports)."""
    if re.fullmatch(r"[0-9a-f]{40}", sha) or not re.fullmatch(r"[0-9a-f]{4,39}", sha):
        return sha
    proc = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    out = proc.stdout.strip()
    return out if proc.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", out) else sha


def shard_sha256(model: Path) -> str:
    h = hashlib.sha256()
    with (Path(model) / SHARD).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def gpu_targets(
    engine: Engine, level: str, out: dict[str, Any], cpu: dict[tuple[int, ...], list[int]], same_ckpt: bool
) -> list[dict[str, Any]]:
    """What only the GPU run has: graphs captured/replayed, async scheduler, tokens = the CPU engine's."""
    tag = f"{engine.name}/{level}"
    facts = out.get("engine_facts", {})
    targets = [
        _target(
            f"{tag}/async_scheduling",
            int(bool(facts.get("async_scheduling"))),
            1,
            "bool",
            "min",
            bool(facts.get("async_scheduling")),
            "vLLM resolved async_scheduling to False",
        ),
    ]
    if not engine.engine.get("enforce_eager"):
        captured = out.get("graphs_captured_at_load", 0)
        targets.append(
            _target(
                f"{tag}/cuda_graphs_captured",
                captured,
                1,
                "graphs",
                "min",
                captured > 0,
                "no CUDA graph captured at load",
            )
        )
        replays = sum(c.get("graph_replays", 0) for c in out.get("cases", []))
        targets.append(
            _target(
                f"{tag}/cuda_graph_replays_in_cases",
                replays,
                1,
                "replays",
                "min",
                replays > 0,
                "no step of the cases replayed a graph",
            )
        )
    if same_ckpt:
        for case in out.get("cases", []):
            for i, p in enumerate(case["prompts"]):
                ref = cpu.get(tuple(p["prompt"]))
                if ref is None:
                    continue
                n = min(len(ref), len(p["tokens"]))
                diff = sum(a != b for a, b in zip(ref[:n], p["tokens"][:n], strict=True))
                suffix = f"#{i}" if len(case["prompts"]) > 1 else ""
                targets.append(
                    _target(
                        f"{tag}/{case['name']}{suffix}/tokens_differing_from_cpu_engine",
                        diff,
                        0,
                        "tokens",
                        "max",
                        diff == 0,
                        "the GPU engine's greedy tokens differ from the CPU engine's",
                    )
                )
    return targets


def cmd_check(args: argparse.Namespace) -> int:
    from deepinfer_sm80.testing.provenance import provenance

    raw = args.raw.resolve()
    model = args.model.resolve()
    cfg = check_checkpoint(model)
    text = cfg.get("text_config", cfg)
    engines = plan(bool(text.get("engram_layer_ids")))
    setup = json.loads((raw / "setup.json").read_text()) if (raw / "setup.json").exists() else {}
    if not setup.get("versions") and (raw / "versions.json").exists():  # runs before versions were folded in
        setup["versions"] = json.loads((raw / "versions.json").read_text())
    device_sha = setup.get("checkpoint_sha256")
    local_sha = shard_sha256(model)
    same = device_sha == local_sha == CPU_SHARD_SHA256
    prov = dict(setup.get("provenance") or provenance())
    prov["git_sha"] = full_sha(str(prov.get("git_sha", "")))
    prov["note"] = "torch/triton are the lent GPU image's, not the project's pins (torch 2.13, triton 3.7.1)"
    report: dict[str, Any] = {
        "provenance": prov,
        "checked_by": provenance(),
        "device_setup": setup,
        "stand_ins": {k: {"replaces": v[0], "on_sm80": v[1]} for k, v in CUDA_STANDINS.items()},
        "checkpoint": {
            "device_sha256": device_sha,
            "check_sha256": local_sha,
            "make_tiny_model_sha256": CPU_SHARD_SHA256,
        },
        "cpu_runs": _cpu_runs_provenance(),
        "engines": [],
        "targets": [
            _target(
                "checkpoint_sha256_equal_to_make_tiny_model",
                int(same),
                1,
                "bool",
                "min",
                same,
                "the device wrote other checkpoint bytes than `make tiny-model`: the CPU comparison is void",
            ),
        ],
    }
    oracle = None
    if not args.no_oracle:
        from deepinfer_sm80.testing.oracle import V41Oracle

        oracle = CachedOracle(V41Oracle.load(variant(model, raw / "check-work", SELECTING)))
    cpu = _cpu_tokens()
    done: dict[str, dict[str, dict[str, Any]]] = {}
    for engine in engines:
        outs: dict[str, dict[str, Any]] = {}
        for level in LEVELS:
            path = raw / f"{engine.name}-{level}.json"
            if level not in engine.levels:
                continue
            if not path.exists():
                report["targets"].append(
                    _target(
                        f"{engine.name}/{level}/engine_ran",
                        None,
                        1,
                        "bool",
                        "min",
                        False,
                        "not run on the GPU (device budget or an earlier step)",
                    )
                )
                continue
            out = json.loads(path.read_text())
            if not out.get("ok") and "root cause" not in str(out.get("error", "")):
                out["error"] = with_root_cause(list(out.get("log_tail") or []), str(out.get("error", "")))
            outs[level] = out
            report["targets"] += engine_targets(level, engine, out, oracle, done)
            if out.get("ok"):
                report["targets"] += gpu_targets(engine, level, out, cpu, same)
        done[engine.name] = outs
        if set(LEVELS) <= set(outs):
            report["targets"] += level_agreement(engine, outs)
        report["engines"].append(
            {
                "name": engine.name,
                "engine_kwargs": engine.engine,
                "cases": [{"name": c.name, "what": c.what} for c in engine.cases],
                "levels": outs,
            }
        )
    failed = [t["name"] for t in report["targets"] if not t["met"]]
    report["all_met"] = not failed
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    met = len(report["targets"]) - len(failed)
    print(f"gpu-e2e check: {met}/{len(report['targets'])} targets met -> {args.out}")
    for name in failed:
        print(f"gpu-e2e check: NOT MET {name}")
    return 0 if not failed else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m deepinfer_sm80.testing.e2e.gpu", description=__doc__.splitlines()[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", type=Path, required=True)
    r.add_argument("--sites", type=Path, required=True, help="holds <level>/site/vllm (the unpacked bundle)")
    r.add_argument("--wheels", type=Path, default=None, help="the carried wheels' pip --target dir")
    r.add_argument("--raw", type=Path, required=True, help="one JSON per engine and level lands here")
    r.add_argument("--work", type=Path, default=Path("/tmp/gpu-e2e-work"), help="plans, logs, model variants")
    r.add_argument(
        "--engines",
        default="main@optimized,eager@optimized,graphs_nocompile@optimized,main@base,dspark@optimized,dspark@base",
    )
    r.add_argument("--engine-timeout", type=float, default=300.0)
    r.add_argument("--budget", type=float, default=480.0, help="seconds for all engines")
    c = sub.add_parser("check")
    c.add_argument("--raw", type=Path, required=True)
    c.add_argument("--model", type=Path, default=ROOT / ".cache" / "tiny-v41")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--no-oracle", action="store_true")
    args = ap.parse_args(argv)
    return cmd_run(args) if args.cmd == "run" else cmd_check(args)


if __name__ == "__main__":
    sys.exit(main())
