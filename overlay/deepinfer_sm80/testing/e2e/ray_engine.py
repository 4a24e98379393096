"""The e2e Ray case (issue 41): PP2 with DSpark over vLLM's Ray executor, across two Ray nodes on localhost.

    python -m deepinfer_sm80.testing.e2e.ray_engine PLAN.json OUT.json   (the driver; run by `run_ray`)

vLLM 0.32.0's `distributed_executor_backend="ray"` is `RayExecutorV2` (`envs.py:944`,
VLLM_USE_RAY_V2_EXECUTOR_BACKEND defaults to 1), a `MultiprocExecutor` whose workers are Ray actors placed
by a placement group (one device bundle per worker) and which runs the asynchronous scheduler. `run_ray`
starts a head and a worker node (`ray_nodes.RayNodes`: free ports, own loopback address and VLLM_HOST_IP
each, stopped by process group at the end, on failure too), then runs the runner's engine process with
this module as its driver: it connects to the head (RAY_ADDRESS) with a runtime environment that carries
the e2e switches to the actors, runs the plan's cases through `worker.run`, and before the executor goes
asks every stage actor to write its row counts (`coverage.dump`), then shuts the engine down itself.

Why the first try's per-stage rows never came back: the actors' coverage directory reached them only
through the driver variables RayExecutorV2 sets in `initialize_worker` (`ray_executor_v2.py:173-177`),
after the actor's interpreter had started and `coverage.install` had decided there was nothing to dump to;
and at shutdown the executor kills its actors (`ray.kill`, `ray_executor_v2.py:569-574`, SIGKILL: no
atexit). Here the runtime environment gives them the directory at start, and the driver's collective
`_dump_rows` writes every stage's counts while the actors live. An engine left to the interpreter's exit
meets Ray torn down under a live executor: in a run here whose case had failed, Ray's atexit disconnected
first, the executor's `ray.kill` reconnected through RAY_ADDRESS and failed on the old session's actor
handles, and the driver segfaulted; the first try's actor that "died unexpectedly" is the executor's
monitor (`ray_executor_v2.py:522-525`) seeing an actor go before `shutdown` set `shutting_down`. Here the
driver shuts the engine down itself, after the cases or when one fails (executor first: its monitor
stops before the kills), then disconnects from Ray; the engine log is searched for both messages.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from deepinfer_sm80.testing.e2e import coverage, server_env
from deepinfer_sm80.testing.e2e.engines import ASYNC, Engine, pp_engine
from deepinfer_sm80.testing.e2e.ray_nodes import HEAD_IP, RayNodeError, RayNodes

NAME = "ray_pp2_dspark"
PARTITION = "4,2"  # pp2_shared: the cut that relays the most across the boundary (replicas, top-k, aux 3, 4)
RAY_KIND = "ray"
# The variables the actors must have when their interpreter starts (the stand-ins' switch, the interpreter
# and capability, the coverage directory, the scheduler and partition): every one with these prefixes in
# the driver's environment, as vLLM's own copy does by prefix (`ray/ray_env.py:36-44`), less the address
# each node sets for itself. PYTHONPATH is the node's own (the same tree on every node, as in one image).
ACTOR_ENV_PREFIXES = ("DEEPINFER_", "VLLM_", "TRITON_")
NODE_OWN = frozenset({"VLLM_HOST_IP", "VLLM_HOST_PORT"})
DIED = ("died unexpectedly", "RayActorError", "ActorHandleNotFoundError")  # an unclean shutdown
GLOO_IFNAME = {"GLOO_SOCKET_IFNAME": "lo"}  # the stages' gloo pairs on loopback, as a node names its NIC
DUMP_TIMEOUT_S = 120.0
# vLLM's mp executor (RayExecutorV2's base) gives a step 300 s (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, envs.py);
# the first try's concurrent case timed out on one step while other engines' sweeps loaded the 2 cores
# (load average 40): the Ray case gives a step what release.py gives the 40-layer engines
STEP_TIMEOUT = {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800"}


def ray_engine(short: list[int], every: list[str]) -> Engine:
    """PP2 at PARTITION with DSpark at the DeepInfer level over Ray: the mp engine pp2_shared_dspark's
    cases, rows and twins (main's tokens, dspark's drafter inputs), its executor Ray's."""
    base = pp_engine(
        NAME,
        PARTITION,
        True,
        short,
        every,
        f"pipeline parallel {PARTITION} with DSpark over Ray (RayExecutorV2): stage 0 on the head node, "
        "stage 1 on the worker node, the stages' tensors over gloo between the nodes' addresses",
        ("optimized",),
    )
    return replace(
        base,
        engine=base.engine | {"distributed_executor_backend": "ray"},
        kind=RAY_KIND,
        env=base.env | ASYNC | STEP_TIMEOUT,
    )


def actor_env(environ: dict[str, str]) -> dict[str, str]:
    """The runtime environment's variables for the stage actors (ACTOR_ENV_PREFIXES, less NODE_OWN)."""
    own = {k: v for k, v in environ.items() if k.startswith(ACTOR_ENV_PREFIXES) and k not in NODE_OWN}
    return own | {k: v for k, v in GLOO_IFNAME.items() if k in environ}


def run_ray(
    level: str,
    engine: Engine,
    model: Path,
    work: Path,
    timeout: float,
    run_engine: Callable[..., dict[str, Any]],
) -> dict[str, Any]:
    """Start the two nodes, run the engine through `run_engine` (the runner's) with this module as its
    driver, stop both nodes whatever happened; the output gains `ray` (address, nodes, how each stopped)."""
    run_dir = work / "runs" / f"{engine.name}-{level}"
    node_env = os.environ | server_env(level, work) | GLOO_IFNAME
    for key in ("DEEPINFER_E2E_CPU", coverage.ENV_DIR):  # the actors get them from the runtime env only
        node_env.pop(key, None)
    nodes = RayNodes(run_dir / "ray", node_env, ray_bin=str(Path(sys.executable).with_name("ray")))
    t0 = time.perf_counter()
    out: dict[str, Any]
    try:
        nodes.start()
        info = {
            "address": nodes.address,
            "nodes": [{"node": n.spec.name, "ip": n.spec.ip} for n in nodes.nodes],
        }
        driver_env = {"RAY_ADDRESS": nodes.address, "VLLM_HOST_IP": HEAD_IP} | GLOO_IFNAME
        out = run_engine(level, engine, model, work, timeout, worker=__name__, extra_env=driver_env)
    except RayNodeError as err:
        info = {"address": nodes.address}
        out = {
            "ok": False,
            "rc": 1,
            "wall_s": time.perf_counter() - t0,
            "log": str(run_dir),
            "error": str(err),
        }
    finally:
        stopped = nodes.stop()
    log = Path(out.get("log", ""))
    text = log.read_text(errors="replace") if log.is_file() else ""
    info |= {"stopped": stopped, "died_lines": [ln for ln in text.splitlines() if any(d in ln for d in DIED)]}
    return out | {"ray": info}


def ray_targets(tag: str, out: dict[str, Any], target: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    """The Ray case's own targets (`target` is the runner's `_target`): each stage ran in an actor on its
    own node, every stage actor's rows came back, and no actor died before the executor let it go."""
    ray = out.get("ray", {})
    actors = out.get("ray_actors", [])
    stages = {a["stage"] for a in actors if a.get("stage") is not None}
    node_ips = {a["node_ip"] for a in actors}
    dumped = sum(1 for a in actors if a.get("dump"))
    died = ray.get("died_lines", [])
    pp = 2
    return [
        target(f"{tag}/ray_nodes_running_a_stage", len(node_ips), pp, "nodes", "min", len(node_ips) >= pp,
               f"the stage actors ran on {sorted(node_ips)}: not one stage per node"),
        target(f"{tag}/stage_actors_rows_dumped", dumped, pp, "actors", "min",
               dumped >= pp and stages == set(range(pp)),
               f"the actors of stages {sorted(stages)} wrote {dumped} row dumps"),
        target(f"{tag}/actors_died_unexpectedly", len(died), 0, "log lines", "max", not died,
               "; ".join(died[:2]) or "an actor died before the executor shut it down"),
    ]  # fmt: skip


# ----------------------------------------------------------------------------- the driver (engine process)
def _dump_rows(worker: Any) -> dict[str, Any]:
    """Runs in each stage actor (`collective_rpc`): its row counts written now, where it runs."""
    import ray

    path = coverage.dump()
    return {
        "pid": os.getpid(),
        "stage": coverage._pp_stage(),
        "node_ip": ray.util.get_node_ip_address(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "dump": str(path) if path else None,
    }


def _finish(llm: Any, ok: bool) -> dict[str, Any]:
    """Every stage actor's rows dumped while it lives (after the cases ran: `ok`), then the engine shut down
    (executor first: its monitor joined, the actors killed), then this driver's Ray connection closed, on
    failure too: left to the interpreter's exit, Ray's atexit disconnects first and the executor's
    `ray.kill` then reconnects (RAY_ADDRESS) and fails on the old session's handles."""
    import ray

    actors: list[dict[str, Any]] = []
    try:
        if ok:
            actors = llm.collective_rpc(_dump_rows, timeout=DUMP_TIMEOUT_S)
    finally:
        try:
            llm.llm_engine.engine_core.shutdown()
        finally:
            ray.shutdown()
    return {"ray_actors": actors}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(f"usage: python -m {__name__} PLAN.json OUT.json", file=sys.stderr)
        return 2
    import ray

    from deepinfer_sm80.testing.e2e import worker

    ray.init(address=os.environ["RAY_ADDRESS"], runtime_env={"env_vars": actor_env(dict(os.environ))})
    plan = json.loads(Path(args[0]).read_text())
    out = worker.run(plan, finish=_finish)
    Path(args[1]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
