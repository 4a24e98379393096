"""`make validate`: prove the whole DeepInfer-SM80 path on the GPUs at hand in minutes, without the weights.

    python scripts/validate.py [--out .cache/validate] [--model DIR] [--dry-run] [--keep-going]

Steps, in order (docs/VALIDATE.md); each records pass / fail / skipped with its numbers:

  CPU  1 environment      GPU(s), driver, capability, torch / triton / vLLM / our revision, binding rows
  CPU  1b ray-cluster     a multi-node cluster's Ray view (`ray status`): its nodes and GPUs, before serving
                          (with --ray-address or RAY_ADDRESS; skipped on one node)
  CPU  2 pipeline-plans   replication plans for 14,14,12, 20,20, 13,14,13, 8,12,20 (and the tiny model's)
  CPU  3 tiny-checkpoint  build the tiny random-weight V4.1 checkpoint (scripts/make_tiny_v41.py)
  CPU  3b engram-memory   Engram tables vs host memory this node can pin (--engram-config: the real one)
  CPU  4 tiny-loads       vLLM 0.32.0's config parser and weight loader take every tensor (CPU classes)
  GPU  5 gpu-tests        the overlay's kernel tests, natively on this GPU
  GPU  6 replication-gpu  pipeline replication round trip with CUDA tensors (two stage caches)
  GPU  7 sm80-report      cross-compile report, rows of the detected arch
  GPU  8 serve-tp1        real engine serving the tiny checkpoint, harness smoke A/B (base vs deepinfer);
                          its greedy tokens are the reference of every later serve step
  GPU  9 serve-tp1-dspark, serve-tp2, serve-pp2 / -dspark (4,2), serve-pp2-clean / -dspark (3,3),
         serve-pp3 / -dspark (3,1,2), serve-tp2-pp2-dspark (TP2 x PP2, 4,2), serve-pp2-entry-dspark
         (1,5), serve-pp3-entry-dspark (1,1,4): where the GPU count
         allows; greedy tokens identical to serve-tp1's, DSpark steps must draft

Without a CUDA GPU it runs the CPU steps, stops at the first GPU step and says so (exit 3).
Exit: 0 every step ran and passed; 1 a step failed; 2 bad input; 3 incomplete (no GPU, or too few GPUs
for a step is *not* incomplete: that step is skipped with its reason). One evidence JSON per run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INCOMPLETE = 0, 1, 2, 3
REFERENCE_PARTITIONS = ((14, 14, 12), (20, 20), (13, 14, 13), (8, 12, 20))
# DSpark as the serve steps run it (the drafter stages mtp.0-2 of the tiny checkpoint)
DSPARK: dict[str, Any] = {"method": "dspark", "num_speculative_tokens": 3}
REFERENCE_SERVE = "serve-tp1"  # every other serve step's greedy tokens must equal this one's
RELEASE_REFERENCE = "serve-release-tp1"  # ... or this one's, for the release-structured checkpoint
RELEASE_DSPARK = {"method": "dspark", "num_speculative_tokens": 5}  # the release's K = dspark_block_size
DIFFERING = "tokens_differing_from_serve_tp1"  # the evidence field of that comparison


@dataclass(frozen=True)
class Serve:
    """One serve step: `vllm serve` of the tiny checkpoint at TP x PP (`partition`:
    VLLM_PP_LAYER_PARTITION), with `speculative` as --speculative-config when set."""

    name: str
    tp: int
    pp: int = 1
    partition: str | None = None
    speculative: dict[str, Any] | None = None
    model: str = "tiny"  # "release": the release-structured checkpoint (scripts/tiny_v41_release.py)

    @property
    def reference(self) -> str:
        return RELEASE_REFERENCE if self.model == "release" else REFERENCE_SERVE

    @property
    def gpus(self) -> int:
        return self.tp * self.pp


# tiny model (6 layers: 0 SWA, 1-2 ratio 2 sharing 1's kv, 3-5 ratio 1 sharing 3's): 4,2 cuts inside
# 3's sharing group, 3,3 is clean, 3,1,2 is the analogue of the reference 14,14,12 (a clean cut,
# then one inside a group)
TINY_SERVE: tuple[Serve, ...] = (
    Serve(REFERENCE_SERVE, 1),
    Serve("serve-tp1-dspark", 1, speculative=DSPARK),
    Serve("serve-tp2", 2),
    Serve("serve-pp2", 1, 2, "4,2"),
    Serve("serve-pp2-dspark", 1, 2, "4,2", DSPARK),
    Serve("serve-pp2-clean", 1, 2, "3,3"),
    Serve("serve-pp2-clean-dspark", 1, 2, "3,3", DSPARK),
    Serve("serve-pp3", 1, 3, "3,1,2"),
    Serve("serve-pp3-dspark", 1, 3, "3,1,2", DSPARK),
    Serve("serve-tp2-pp2-dspark", 2, 2, "4,2", DSPARK),
    # issue 37: stage 0 holds only the sliding-window layer 0 (no indexer-K cache: row pp_kv_layout) and
    # Engram layers 1 and 2 open stages (the step's ids cross; row pp_engram_entry)
    Serve("serve-pp2-entry-dspark", 1, 2, "1,5", DSPARK),
    Serve("serve-pp3-entry-dspark", 1, 3, "1,1,4", DSPARK),
    # the release's own layer structure (issue 37): the reference deployment's cut 14,14,12 with DSpark K=5,
    # Engram layer 14 opening stage 1, layer 20's caches replicated onto stage 2
    Serve(RELEASE_REFERENCE, 1, model="release"),
    Serve("serve-release-pp3-dspark", 1, 3, "14,14,12", RELEASE_DSPARK, model="release"),
)


def planned_serves(gpu_count: int) -> list[Serve]:
    """The serve steps that run on a node with `gpu_count` GPUs (the others are skipped)."""
    return [s for s in TINY_SERVE if s.gpus <= gpu_count]


@dataclass
class Step:
    name: str
    needs_gpu: bool
    status: str = "pending"  # pass | fail | skipped
    seconds: float = 0.0
    detail: dict = field(default_factory=dict)
    reason: str = ""

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "needs_gpu": self.needs_gpu,
            "status": self.status,
            "seconds": round(self.seconds, 2),
            "reason": self.reason,
            **self.detail,
        }


def run(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    try:
        p = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})}
        )
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f} s: {' '.join(cmd)}"
    return p.returncode, (p.stdout + p.stderr)[-4000:]


# ----------------------------------------------------------------------------- environment
def gpus() -> list[dict]:
    """Every CUDA GPU as torch sees it (empty without CUDA)."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append(
            {
                "index": i,
                "name": p.name,
                "capability": f"{p.major}.{p.minor}",
                "memory_gib": round(p.total_memory / 2**30, 1),
                "sm_count": p.multi_processor_count,
            }
        )
    return out


def driver() -> str:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return "none (no nvidia-smi)"
    code, out = run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], 30)
    return out.strip().splitlines()[0] if code == 0 and out.strip() else "unknown"


def versions() -> dict:
    out: dict = {"python": platform.python_version()}
    for mod in ("torch", "triton", "vllm", "tilelang"):
        try:
            out[mod] = getattr(__import__(mod), "__version__", "?")
        except Exception as err:  # an install that does not import is itself evidence
            out[mod] = f"not importable ({type(err).__name__})"
    code, sha = run(["git", "rev-parse", "HEAD"], 30)
    out["deepinfer_git_sha"] = sha.strip() if code == 0 else os.environ.get("DEEPINFER_GIT_SHA", "unknown")
    return out


def step_environment(ctx: dict) -> dict:
    detail = {"gpus": ctx["gpus"], "driver": driver(), "versions": versions(), "host": platform.node()}
    try:
        from deepinfer_sm80 import bindings

        cap = int(ctx["gpus"][0]["capability"].replace(".", "")) if ctx["gpus"] else None
        detail["bindings"] = bindings.describe(cap)
    except Exception as err:
        detail["bindings"] = f"unavailable: {type(err).__name__}: {err}"
    return detail


# ----------------------------------------------------------------------------- Ray cluster
RAY_NODES, RAY_GPUS = 2, 16  # the two-node deployment (a800x16-tp8pp2: TP8 x PP2 over two 8-GPU nodes)


def ray_view(status_text: str) -> dict[str, Any]:
    """`ray status`'s view (integration.ray_status): the nodes up (Active and Idle: a cluster with no work
    yet lists its nodes as idle) and each resource's total."""
    from deepinfer_sm80.integration.ray_status import parse

    status = parse(status_text)
    resources = {name: total for name, (_, total) in status.usage.items()}
    return {"active_nodes": status.nodes_up or 0, "resources": resources}


def step_ray_cluster(ctx: dict) -> dict:
    """Before a multi-node `vllm serve --distributed-executor-backend ray`: the cluster holds the nodes and
    GPUs the deployment asks for (vLLM would otherwise wait up to 30 min for its placement group)."""
    address = ctx.get("ray_address")
    if not address:
        raise SkipStep("no Ray cluster named (--ray-address or RAY_ADDRESS): a one-node run")
    ray = shutil.which("ray")
    if ray is None:
        raise AssertionError("`ray` is not installed here (the image carries it; make setup installs it)")
    code, text = run([ray, "status", "--address", address], timeout=120)
    if code != 0:
        raise AssertionError(f"`ray status --address {address}` exited {code}: {text.strip()[-300:]}")
    view = ray_view(text)
    want_nodes, want_gpus = ctx.get("ray_nodes", RAY_NODES), ctx.get("ray_gpus", RAY_GPUS)
    gpus = view["resources"].get("GPU", 0.0)
    detail = view | {"address": address, "want_nodes": want_nodes, "want_gpus": want_gpus}
    if view["active_nodes"] < want_nodes or gpus < want_gpus:
        raise StepFailure(
            f"Ray at {address} has {view['active_nodes']} active node(s) and {gpus:g} GPU(s); the deployment "
            f"needs {want_nodes} and {want_gpus} (start every node's `ray start`, check VLLM_HOST_IP and "
            "the node's --node-ip-address: docker/README.md)",
            detail,
        )
    return detail


# ----------------------------------------------------------------------------- CPU steps
def step_plans(ctx: dict) -> dict:
    from deepinfer_sm80.integration.pp.plan import build_plan
    from deepinfer_sm80.integration.pp.topology import Topology, v41_flash_fields

    topo = Topology.from_config(v41_flash_fields())
    plans = {}
    for part in REFERENCE_PARTITIONS:
        p = build_plan(topo, part)
        plans[",".join(map(str, part))] = {
            "needs_replication": p.needs_replication,
            "payload_bytes_per_token": [p.payload_bytes_per_token(r) for r in range(len(part) - 1)],
            "replica_kv_bytes_per_token": [p.replica_kv_bytes_per_token(r) for r in range(len(part))],
        }
    # + 4 B/token of token ids wherever a later stage holds Engram layer 14 (docs/BLOCKERS.md row 24)
    expect = {"14,14,12": [4, 8908], "20,20": [0], "13,14,13": [2636, 10956], "8,12,20": [4, 0]}
    got = {k: v["payload_bytes_per_token"] for k, v in plans.items()}
    if got != expect:
        raise AssertionError(f"plan bytes {got} != hand-computed {expect}")
    return {"plans": plans}


def release_model(ctx: dict) -> Path:
    """The release-structured checkpoint beside the tiny one (MODEL-release)."""
    return ctx["model"].parent / f"{ctx['model'].name}-release"


def step_tiny(ctx: dict) -> dict:
    import make_tiny_v41
    import tiny_v41_release

    manifest = make_tiny_v41.build(ctx["model"])
    tiny_v41_release.build(release_model(ctx))
    from deepinfer_sm80.integration.pp.plan import build_plan
    from deepinfer_sm80.integration.pp.topology import Topology

    topo = {"tiny": Topology.from_file(ctx["model"]), "release": Topology.from_file(release_model(ctx))}
    needs = {}
    for serve in TINY_SERVE:
        if serve.partition:
            plan = build_plan(topo[serve.model], tuple(map(int, serve.partition.split(","))))
            needs[f"{serve.model}:{serve.partition}"] = [st["needs"] for st in plan.to_dict()["stages"]]
    return {"manifest": manifest, "tiny_plans": needs}


def step_engram_memory(ctx: dict) -> dict:
    """vLLM's default Engram cpu_offload pins every table in host RAM: check it fits before serving."""
    from deepinfer_sm80.integration.engram_memory import check_engram_host_memory

    source = ctx.get("engram_config") or ctx["model"] / "config.json"
    if not Path(source).exists():
        raise SkipStep(f"no checkpoint config at {source} (pass --engram-config CONFIG_JSON)")
    result = check_engram_host_memory(source, dp_per_node=ctx.get("dp_per_node", 1))
    print(f"  {result.message}")
    if not result.ok:
        raise AssertionError(result.message)
    return {"config": str(source), **result.as_dict()}


def step_tiny_loads(ctx: dict) -> dict:
    script = ROOT / "scripts" / "make_tiny_v41.py"
    cmd = [sys.executable, str(script), "--out", str(ctx["model"]), "--check", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if p.returncode != 0:
        lines = p.stderr.strip().splitlines()
        raise AssertionError(lines[-1] if lines else f"exit {p.returncode}")
    return {"load_check": json.loads(p.stdout.strip().splitlines()[-1])["load_check"]}


# ----------------------------------------------------------------------------- GPU steps
def step_gpu_tests(ctx: dict) -> dict:
    junit = ctx["out"] / "gpu-tests.xml"
    code, out = run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "overlay/tests",
            f"--junitxml={junit}",
        ],
        3600,
    )
    tail = out.strip().splitlines()[-1] if out.strip() else ""
    if code != 0:
        raise AssertionError(f"overlay GPU tests: {tail}")
    return {"summary": tail, "junit": str(junit)}


def step_replication_gpu(ctx: dict) -> dict:
    code, out = run(
        [sys.executable, "-m", "deepinfer_sm80.testing.pp.gpu_roundtrip", "--out", str(ctx["out"])], 900
    )
    result = json.loads((ctx["out"] / "pp_roundtrip.json").read_text()) if code in (0, 1) else {}
    if code != 0:
        raise AssertionError(
            f"replication round trip: {out.strip().splitlines()[-1] if out.strip() else code}"
        )
    return {"targets": result.get("targets", []), "timing": result.get("timing", [])}


def step_sm80_report(ctx: dict) -> dict:
    arch = int(ctx["gpus"][0]["capability"].replace(".", ""))
    path = ctx["out"] / "sm80-compile.json"
    code, out = run([sys.executable, "-m", "deepinfer_sm80.testing.sm80_report", "--json", str(path)], 1800)
    rows = [k for k in json.loads(path.read_text())["kernels"] if k["arch"] == arch] if path.exists() else []
    detail = {"arch": arch, "kernels": len(rows), "problems": [k for k in rows if k["problems"]][:10]}
    if arch not in (80, 86, 89):
        detail["note"] = f"sm_{arch} is not an SM8x/Ada target; the report still compiles for sm_80/86/89"
    if code != 0:
        raise AssertionError(f"cross-compile report exit {code}: {out.strip().splitlines()[-1]}")
    return detail


def harness_command(model: Path, serve: Serve, run_id: str, out: Path) -> tuple[list[str], dict]:
    """The harness smoke A/B on the real engine: arm A sends every binding row to base, B as shipped.
    Its greedy cell (token-id prompts, temperature 0, `return_token_ids`) records the output ids
    and its per-run summaries the spec-decode counter deltas from /metrics."""
    from deepinfer_sm80 import bindings

    base_all = ",".join(b.name for b in bindings.BINDINGS)
    env = {"VLLM_PP_LAYER_PARTITION": serve.partition} if serve.partition else {}
    flags = [
        "--enforce-eager",
        "--max-num-seqs",
        "8",
        "--limit-mm-per-prompt",
        '{"image": 0}',
        "--gpu-memory-utilization",
        "0.5",
    ]
    sets: dict[str, Any] = {
        "topology.tp": serve.tp,
        "topology.pp": serve.pp,
        "dtype": "bfloat16",
        "kv_cache_dtype": "fp8_ds_mla",
        "labels": {"A": "base", "B": "deepinfer"},
        "ab.aa": False,
        "env": {},
        "serve_flags": flags,
        "server.command": ["{python}", "-m", "vllm.entrypoints.cli.main", "serve"],
        "server.nice": 0,
        "server.env": env,
        "server.variant_env": {"A": {"DEEPINFER_SM80_DISABLE": base_all}},
    }
    if serve.speculative:  # the harness adds --speculative-config (and per-request spec metrics)
        sets["speculative"] = serve.speculative
    cmd = [
        sys.executable,
        "-m",
        "deepinfer_harness",
        "bench-ab",
        "--profile",
        "smoke",
        "--model",
        str(model),
        "--run-id",
        run_id,
        "--fresh",
        "--no-charts",
        "--results",
        str(out / "bench-ab"),
    ]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={json.dumps(v)}"]
    return cmd, env


def run_root(out: Path, serve: Serve) -> Path:
    """The harness's run directory of a serve step (`--results OUT/bench-ab --run-id validate-NAME`)."""
    return out / "bench-ab" / f"validate-{serve.name}"


# (arm, greedy cell, prompt sha256) -> that prompt's output token ids, one list per measured request
GreedyTokens = dict[tuple[str, str, str], list[list[int]]]


def greedy_tokens(root: Path) -> GreedyTokens:
    """Every measured greedy output of a harness run directory's concurrency-1 greedy cells, read from its
    request records. Higher concurrencies are left out: a batch of 4 is composed differently under PP or
    DSpark than on one stage, so its GEMMs round differently and a near-tie of the random-weight model may
    flip a token without anything being wrong (the CPU end-to-end run compares one sequence at a time too)."""
    from deepinfer_harness.cells import parse_cell
    from deepinfer_harness.records import read_records

    out: GreedyTokens = {}
    for path in sorted((root / "cells").glob("*/[AB].r*.jsonl")):
        cell = parse_cell(path.parent.name)
        if cell.kind != "greedy" or cell.concurrency != 1:
            continue
        for r in read_records(path):
            if r.phase == "measure" and r.ok and r.output_token_ids is not None:
                key = (r.variant, r.cell_id, r.prompt_sha256)
                out.setdefault(key, []).append(list(r.output_token_ids))
    return out


def compare_greedy(got: GreedyTokens, reference: GreedyTokens) -> dict[str, Any]:
    """Token by token against the reference's first output of the same arm, cell and prompt: a
    position that differs counts one, as does every token one output has beyond the other."""
    differing, compared, diverged = 0, 0, []
    for key in sorted(got.keys() & reference.keys()):
        ref = reference[key][0]
        for tokens in got[key]:
            compared += 1
            n = sum(a != b for a, b in zip(tokens, ref, strict=False)) + abs(len(tokens) - len(ref))
            if n:
                differing += n
                first = next((j for j, (a, b) in enumerate(zip(tokens, ref, strict=False)) if a != b), None)
                arm, cell, sha = key
                diverged.append(
                    {
                        "arm": arm,
                        "cell": cell,
                        "prompt_sha256": sha[:16],
                        "tokens_differing": n,
                        "first_divergence": min(len(tokens), len(ref)) if first is None else first,
                    }
                )
    return {
        "greedy_outputs_compared": compared,
        DIFFERING: differing,
        "greedy_prompts_unmatched": len(got.keys() ^ reference.keys()),
        "greedy_diverged": diverged[:8],
    }


def spec_decode_counters(root: Path) -> dict[str, dict[str, float]]:
    """Per arm, the vllm:spec_decode_num_draft_tokens / _accepted_tokens deltas the harness took
    from /metrics around each cell run (its per-run summaries), summed over the run."""
    out: dict[str, dict[str, float]] = {}
    for path in sorted((root / "cells").glob("*/[AB].r*.summary.json")):
        summary = json.loads(path.read_text())
        arm = out.setdefault(path.name[0], {"draft_tokens": 0.0, "accepted_tokens": 0.0})
        arm["draft_tokens"] += summary.get("spec_decode_draft_tokens") or 0.0
        arm["accepted_tokens"] += summary.get("spec_decode_accepted_tokens") or 0.0
    return out


class StepFailure(AssertionError):
    """A failed step that keeps its numbers for the evidence."""

    def __init__(self, message: str, detail: dict) -> None:
        super().__init__(message)
        self.detail = detail


def make_serve_step(serve: Serve) -> Callable[[dict], dict]:
    name = serve.name

    def step(ctx: dict) -> dict:
        if len(ctx["gpus"]) < serve.gpus:
            raise SkipStep(f"needs {serve.gpus} GPUs, {len(ctx['gpus'])} present")
        model = release_model(ctx) if serve.model == "release" else ctx["model"]
        cmd, _ = harness_command(model, serve, f"validate-{name}", ctx["out"])
        code, out = run(cmd, 3600)
        lines = [ln for ln in out.splitlines() if ln.strip()]
        root = run_root(ctx["out"], serve)
        detail: dict[str, Any] = {
            "tp": serve.tp,
            "pp": serve.pp,
            "partition": serve.partition,
            "speculative": serve.speculative,
            "harness_exit": code,
            "harness_tail": lines[-12:],
            "run_dir": str(root),
        }
        if code != 0:
            raise StepFailure(f"{name}: harness exit {code}: {lines[-1] if lines else ''}", detail)
        tokens = greedy_tokens(root)
        detail["greedy_outputs"] = sum(len(v) for v in tokens.values())
        if not tokens:
            raise StepFailure(f"{name}: no greedy token ids recorded under {root}", detail)
        ctx.setdefault("greedy_tokens", {})[name] = tokens
        problems = []
        if name != serve.reference:
            reference = ctx["greedy_tokens"].get(serve.reference)
            if reference is None:
                raise StepFailure(
                    f"{name}: {serve.reference} recorded no greedy tokens in this run, nothing to compare",
                    detail,
                )
            detail |= compare_greedy(tokens, reference) | {"reference": serve.reference}  # DIFFERING: vs it
            if detail[DIFFERING]:
                first = detail["greedy_diverged"][0]
                problems.append(
                    f"{detail[DIFFERING]} greedy tokens differ from {serve.reference}'s (first: arm "
                    f"{first['arm']} {first['cell']} position {first['first_divergence']})"
                )
            if detail["greedy_prompts_unmatched"]:
                problems.append(
                    f"{detail['greedy_prompts_unmatched']} greedy prompts not answered by both "
                    f"{name} and {serve.reference}"
                )
        if serve.speculative:
            counters = spec_decode_counters(root)
            detail["spec_decode"] = counters
            detail["spec_decode_draft_tokens"] = sum(c["draft_tokens"] for c in counters.values())
            detail["spec_decode_accepted_tokens"] = sum(c["accepted_tokens"] for c in counters.values())
            idle = sorted(arm for arm, c in counters.items() if c["draft_tokens"] <= 0)
            if not counters or idle:
                where = f"arm {', '.join(idle)}" if idle else "any arm"
                problems.append(f"no draft tokens (vllm:spec_decode_num_draft_tokens) on {where}")
        if problems:
            raise StepFailure(f"{name}: " + "; ".join(problems), detail)
        return detail

    return step


class SkipStep(Exception):
    """The step cannot run here (a reason, not a failure)."""


def steps() -> list[tuple[Step, Callable[[dict], dict]]]:
    out = [
        (Step("environment", False), step_environment),
        (Step("ray-cluster", False), step_ray_cluster),
        (Step("pipeline-plans", False), step_plans),
        (Step("tiny-checkpoint", False), step_tiny),
        (Step("engram-memory", False), step_engram_memory),
        (Step("tiny-loads", False), step_tiny_loads),
        (Step("gpu-tests", True), step_gpu_tests),
        (Step("replication-gpu", True), step_replication_gpu),
        (Step("sm80-report", True), step_sm80_report),
    ]
    out += [(Step(s.name, True), make_serve_step(s)) for s in TINY_SERVE]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".cache/validate", help="evidence directory (outside git by default)")
    ap.add_argument(
        "--model", default=".cache/tiny-v41", help="where the tiny checkpoint is (built if absent)"
    )
    ap.add_argument("--dry-run", action="store_true", help="print the GPU serving commands, run nothing")
    ap.add_argument("--keep-going", action="store_true", help="run later steps after a failure")
    ap.add_argument("--skip", default="", help="comma-separated step names to skip (e.g. tiny-loads)")
    ap.add_argument("--engram-config", help="config.json of the checkpoint to serve (Engram host memory)")
    ap.add_argument("--dp-per-node", type=int, default=1, help="DP replicas per node (Engram tables each)")
    ap.add_argument(
        "--ray-address", default=os.environ.get("RAY_ADDRESS"), help="check this Ray cluster's nodes and GPUs"
    )
    ap.add_argument("--ray-nodes", type=int, default=RAY_NODES, help="active Ray nodes the cluster must have")
    ap.add_argument("--ray-gpus", type=int, default=RAY_GPUS, help="GPUs the Ray cluster must have")
    args = ap.parse_args(argv)
    if args.engram_config and not Path(args.engram_config).exists():
        print(f"error: --engram-config: {args.engram_config} does not exist", file=sys.stderr)
        return EXIT_USAGE
    if args.dp_per_node < 1:
        print(f"error: --dp-per-node must be >= 1, got {args.dp_per_node}", file=sys.stderr)
        return EXIT_USAGE
    out, model = (ROOT / args.out).resolve(), (ROOT / args.model).resolve()
    plan = steps()
    skip = {s for s in args.skip.split(",") if s}
    unknown = skip - {s.name for s, _ in plan}
    if unknown:
        print(f"error: --skip: unknown step(s) {sorted(unknown)}", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        for serve in TINY_SERVE:
            cmd, env = harness_command(model, serve, f"validate-{serve.name}", out)
            print(f"{serve.name}: {' '.join(f'{k}={v}' for k, v in env.items())} {' '.join(cmd)}")
        return EXIT_OK
    out.mkdir(parents=True, exist_ok=True)
    ctx = {"out": out, "model": model, "gpus": gpus(), "dp_per_node": args.dp_per_node,
           "engram_config": Path(args.engram_config).resolve() if args.engram_config else None,
           "ray_address": args.ray_address, "ray_nodes": args.ray_nodes,
           "ray_gpus": args.ray_gpus}  # fmt: skip
    stopped = ""
    failed = False
    for step, fn in plan:
        if step.name in skip:
            step.status, step.reason = "skipped", "--skip"
            continue
        if failed and not args.keep_going:
            step.status, step.reason = "skipped", "an earlier step failed"
            continue
        if step.needs_gpu and not ctx["gpus"]:
            stopped = stopped or step.name
            step.status, step.reason = "skipped", "no CUDA GPU: validation stops at the first GPU step"
            continue
        t0 = time.monotonic()
        try:
            step.detail = fn(ctx)
            step.status = "pass"
        except SkipStep as why:
            step.status, step.reason = "skipped", str(why)
        except Exception as err:
            step.status, step.reason = "fail", f"{type(err).__name__}: {err}".splitlines()[0][:500]
            step.detail = getattr(err, "detail", None) or step.detail
            failed = True
        step.seconds = time.monotonic() - t0
        why = f": {step.reason}" if step.reason else ""
        print(f"[{step.status:>7}] {step.name} ({step.seconds:.1f} s){why}")
    verdict = "fail" if failed else ("incomplete" if stopped else "pass")
    targets = [
        {
            "name": s.name,
            "measured": s.status,
            "goal": "pass",
            "unit": "status",
            "direction": "==",
            "met": s.status == "pass",
            "cause": s.reason,
        }
        for s, _ in plan
    ]
    env_step = plan[0][0].detail
    evidence = {
        "schema": 1,
        "what": "make validate evidence (attach to a bug report)",
        "verdict": verdict,
        "stopped_at": stopped or None,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "gpus": ctx["gpus"],
        "driver": env_step.get("driver"),
        "versions": env_step.get("versions"),
        "steps": [s.as_dict() for s, _ in plan],
        "targets": targets,
    }
    host = (platform.node() or "host").replace("/", "_")
    sha = (env_step.get("versions") or {}).get("deepinfer_git_sha", "unknown")[:7]
    path = out / f"validate-{host}-{sha}.json"
    path.write_text(json.dumps(evidence, indent=1, default=str))
    if stopped:
        print(f"INCOMPLETE: no CUDA GPU here; the CPU steps ran and validation stopped at '{stopped}'")
    print(f"verdict {verdict}; evidence: {path}")
    return {"pass": EXIT_OK, "fail": EXIT_FAIL, "incomplete": EXIT_INCOMPLETE}[verdict]


if __name__ == "__main__":
    raise SystemExit(main())
