"""The e2e Ray case's node lifecycle (ray_nodes.py) and its CPU-platform stand-ins, without Ray or vLLM.

A fake `ray start` (a Python script that prints Ray's ready line and leaves a child in its process group)
stands for a node: the nodes must come up in order, every one of them must go at the end (its leader and
its children, by process group), on a failed start and on an exception inside the `with` block too.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from deepinfer_sm80.testing.e2e import ray_nodes
from deepinfer_sm80.testing.e2e.ray_nodes import (
    PORTS_HEAD,
    PORTS_WORKER,
    READY_LINE,
    NodeSpec,
    RayNodeError,
    RayNodes,
    free_ports,
    node_argv,
    stop_group,
)

# A node: writes its child's pid to CHILD_PID_FILE, prints the ready line (or not), then sleeps; with
# IGNORE_TERM it survives SIGTERM (the stop must then SIGKILL it).
FAKE_NODE = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(os.environ["CHILD_PID_FILE"], "w").write(str(child.pid))
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.environ.get("EXIT_CODE"):
    sys.exit(int(os.environ["EXIT_CODE"]))
if not os.environ.get("NEVER_READY"):
    print(READY_TEXT, flush=True)
time.sleep(300)
""".replace("READY_TEXT", repr(READY_LINE))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not reaped by its parent yet) counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def _spec(tmp_path: Path, name: str, **env: str) -> NodeSpec:
    script = tmp_path / "fake_node.py"
    script.write_text(FAKE_NODE)
    child = tmp_path / f"{name}.child"
    return NodeSpec(
        name,
        "127.0.0.9",
        [sys.executable, str(script)],
        dict(os.environ) | {"CHILD_PID_FILE": str(child)} | env,
        tmp_path / f"{name}.log",
    )


def _child(tmp_path: Path, name: str) -> int:
    path = tmp_path / f"{name}.child"
    for _ in range(100):
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{name}: the fake node wrote no child pid")


def _gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(PORTS_HEAD + PORTS_WORKER)
    assert len(set(ports)) == len(ports)
    for port in ports[:5]:
        with socket.socket() as s:
            s.bind(("", port))  # free now: nothing holds it


def test_node_commands_take_every_port_given_and_assume_none() -> None:
    ports = free_ports(PORTS_HEAD + PORTS_WORKER)
    head = node_argv("ray", "127.0.0.2", None, ports[:PORTS_HEAD])
    worker = node_argv("ray", "127.0.0.3", "127.0.0.2:1234", ports[PORTS_HEAD:])
    assert head[:3] == ["ray", "start", "--block"] and "--head" in head and "--address" not in head
    assert worker[worker.index("--address") + 1] == "127.0.0.2:1234" and "--head" not in worker
    for argv, given in ((head, ports[:PORTS_HEAD]), (worker, ports[PORTS_HEAD:])):
        numbers = [int(x) for a in argv for x in a.split(",") if x.isdigit() and 1024 < int(x) < 65536]
        assert sorted(numbers) == sorted(given)  # every port is one chosen free, none is Ray's default
        assert argv[argv.index("--resources") + 1] == json.dumps({ray_nodes.DEVICE_RESOURCE: 1})
    with pytest.raises(ValueError, match="too few"):
        node_argv("ray", "127.0.0.2", None, ports[: PORTS_HEAD - 1])


def test_cluster_specs_give_each_node_its_own_address() -> None:
    nodes = RayNodes(Path("/nonexistent"), {"X": "1"})
    head, worker = nodes.specs()
    assert nodes.address.startswith(ray_nodes.HEAD_IP + ":")
    assert (head.env["VLLM_HOST_IP"], worker.env["VLLM_HOST_IP"]) == (ray_nodes.HEAD_IP, ray_nodes.WORKER_IP)
    assert head.env["X"] == worker.env["X"] == "1" and head.env["RAY_USAGE_STATS_ENABLED"] == "0"
    assert worker.argv[worker.argv.index("--address") + 1] == nodes.address


def test_nodes_start_in_order_and_stop_with_their_children(tmp_path: Path) -> None:
    specs = [_spec(tmp_path, "head"), _spec(tmp_path, "worker")]
    nodes = RayNodes(tmp_path, {})
    with _started(nodes, specs):
        leaders = [n.pid for n in nodes.nodes]
        children = [_child(tmp_path, "head"), _child(tmp_path, "worker")]
        assert all(_alive(p) for p in leaders + children)
    assert [s["node"] for s in nodes.stopped] == ["worker", "head"]  # the last started goes first
    assert all(s["stopped"] == "sigterm" for s in nodes.stopped)
    assert all(_gone(p) for p in leaders + children)


class _started:
    """`with` over RayNodes.start(specs) / stop(), as run_ray uses the nodes."""

    def __init__(self, nodes: RayNodes, specs: list[NodeSpec]) -> None:
        self.nodes, self.specs = nodes, specs

    def __enter__(self) -> RayNodes:
        self.nodes.start(self.specs)
        return self.nodes

    def __exit__(self, *exc: object) -> None:
        self.nodes.stop()


def test_a_node_that_exits_stops_those_already_started(tmp_path: Path) -> None:
    nodes = RayNodes(tmp_path, {})
    specs = [_spec(tmp_path, "head"), _spec(tmp_path, "worker", EXIT_CODE="3")]
    with pytest.raises(RayNodeError, match=r"ray worker node \(127\.0\.0\.9\) exited with 3"):
        nodes.start(specs)
    assert nodes.nodes == [] and [s["node"] for s in nodes.stopped] == ["worker", "head"]
    assert _gone(_child(tmp_path, "head")) and _gone(_child(tmp_path, "worker"))


def test_a_node_never_ready_times_out_and_is_stopped(tmp_path: Path) -> None:
    nodes = RayNodes(tmp_path, {}, start_timeout=1.0)
    with pytest.raises(RayNodeError, match="not up after 1 s"):
        nodes.start([_spec(tmp_path, "head", NEVER_READY="1")])
    assert nodes.stopped[0]["stopped"] == "sigterm" and _gone(_child(tmp_path, "head"))


def test_an_error_inside_the_run_still_stops_every_node(tmp_path: Path) -> None:
    nodes = RayNodes(tmp_path, {})
    with pytest.raises(RuntimeError, match="engine failed"), _started(nodes, [_spec(tmp_path, "head")]):
        raise RuntimeError("engine failed")
    assert nodes.nodes == [] and _gone(_child(tmp_path, "head"))


def test_a_node_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    nodes = RayNodes(tmp_path, {}, stop_grace=0.5)
    nodes.start([_spec(tmp_path, "head", IGNORE_TERM="1")])
    leader = nodes.nodes[0].pid
    nodes.stop()
    assert nodes.stopped[0]["stopped"] == "sigkill" and nodes.stopped[0]["rc"] == -signal.SIGKILL
    assert _gone(leader) and _gone(_child(tmp_path, "head"))


def test_stopping_a_node_that_already_exited_is_quiet(tmp_path: Path) -> None:
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    assert stop_group(proc, 0.1) == {"stopped": "already exited", "rc": 0}


# ----------------------------------------------------------------------------- the stand-ins
def test_the_cpu_platform_names_the_nodes_ray_device() -> None:
    """Stand-in for `platforms/interface.py:150` (read at `ray_utils.py:572-576`): the CPU platform's Ray
    device is the resource each e2e node offers once, so one worker (one stage) lands on each node."""
    from deepinfer_sm80.testing.e2e.standins import RAY_DEVICE_KEY, _ray_device_key

    class CpuPlatform:
        ray_device_key = ""

    _ray_device_key(SimpleNamespace(CpuPlatform=CpuPlatform))
    assert CpuPlatform.ray_device_key == RAY_DEVICE_KEY == ray_nodes.DEVICE_RESOURCE


def test_ray_actor_device_ids_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-in for `ray_executor_v2.py:152`: Ray reports no accelerator ids for a custom resource; the
    actor gets its node's one device, id 0, and the node id as upstream returns it. Where Ray does report
    the key, upstream's method runs."""
    from deepinfer_sm80.testing.e2e.standins import RAY_DEVICE_KEY, _ray_accelerator_ids

    reported: dict[str, list[str]] = {"GPU": []}
    context = SimpleNamespace(get_accelerator_ids=lambda: reported, get_node_id=lambda: "node-b")
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(get_runtime_context=lambda: context))

    class RayWorkerProc:
        def get_node_and_physical_gpu_ids(self) -> Any:
            return "upstream"

    _ray_accelerator_ids(SimpleNamespace(RayWorkerProc=RayWorkerProc))
    _ray_accelerator_ids(SimpleNamespace(RayWorkerProc=RayWorkerProc))  # idempotent: wrapped once
    assert RayWorkerProc().get_node_and_physical_gpu_ids() == ("node-b", [0])
    reported[RAY_DEVICE_KEY] = ["3"]
    assert RayWorkerProc().get_node_and_physical_gpu_ids() == "upstream"


# ----------------------------------------------------------------------------- the engine and its checks
def test_the_evidence_plan_runs_pp2_dspark_over_ray() -> None:
    from deepinfer_sm80.testing.e2e import runner
    from deepinfer_sm80.testing.e2e.ray_engine import NAME, RAY_KIND

    (engine,) = [e for e in runner.plan("full", engram=True) if e.name == NAME]
    assert engine.kind == RAY_KIND and engine.engine["distributed_executor_backend"] == "ray"
    assert engine.engine["pipeline_parallel_size"] == 2 and engine.partition == "4,2"
    assert engine.engine["speculative_config"]["method"] == "dspark" and engine.levels == ("optimized",)
    assert (engine.spec_of, engine.aux_of) == ("main", "dspark")  # main's tokens, dspark's drafter inputs
    assert engine.env["DEEPINFER_E2E_SCHEDULER"] == "async"  # RayExecutorV2 schedules asynchronously
    assert NAME not in {e.name for e in runner.plan("ci", engram=True)}


def test_actor_env_carries_the_switches_but_not_the_nodes_own_address() -> None:
    from deepinfer_sm80.testing.e2e.ray_engine import actor_env

    got = actor_env(
        {
            "DEEPINFER_E2E_CPU": "1",
            "DEEPINFER_E2E_COVERAGE_DIR": "/c",
            "TRITON_INTERPRET": "1",
            "VLLM_PP_LAYER_PARTITION": "4,2",
            "VLLM_HOST_IP": "127.0.0.2",
            "GLOO_SOCKET_IFNAME": "lo",
            "PYTHONPATH": "/hook",
            "HOME": "/root",
        }
    )
    assert got == {
        "DEEPINFER_E2E_CPU": "1",
        "DEEPINFER_E2E_COVERAGE_DIR": "/c",
        "TRITON_INTERPRET": "1",
        "VLLM_PP_LAYER_PARTITION": "4,2",
        "GLOO_SOCKET_IFNAME": "lo",
    }


def test_ray_targets_need_a_stage_per_node_every_dump_and_no_death() -> None:
    from deepinfer_sm80.testing.e2e.ray_engine import ray_targets
    from deepinfer_sm80.testing.e2e.runner import _target

    actors = [
        {"stage": 0, "node_ip": "127.0.0.2", "dump": "/c/1.json"},
        {"stage": 1, "node_ip": "127.0.0.3", "dump": "/c/2.json"},
    ]
    good = {"ray_actors": actors, "ray": {"died_lines": []}}
    assert all(t["met"] for t in ray_targets("e/optimized", good, _target))
    one_node = {"ray_actors": [a | {"node_ip": "127.0.0.2"} for a in actors], "ray": {"died_lines": []}}
    assert [t["met"] for t in ray_targets("e", one_node, _target)] == [False, True, True]
    no_dump = {"ray_actors": actors[:1], "ray": {"died_lines": []}}
    assert [t["met"] for t in ray_targets("e", no_dump, _target)] == [False, False, True]
    died = good | {"ray": {"died_lines": ["RayWorkerProc rank=[1] died unexpectedly"]}}
    assert [t["met"] for t in ray_targets("e", died, _target)] == [True, True, False]
