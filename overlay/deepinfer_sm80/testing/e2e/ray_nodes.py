"""Two Ray nodes on one machine for the e2e Ray case (issue 41): started by the runner, stopped by PID.

Each node is one `ray start --block` process in its own session; the node's processes (GCS, raylet,
agents, the workers and vLLM's actors) stay in that process group, so stopping a node is SIGTERM to the
group, then SIGKILL to what is left after a grace period: never `ray stop`, which stops every Ray
process of the machine by name. `RayNodes` is a context manager: the nodes go in its `__exit__`, on
failure too.

The nodes stand for two hosts: each has its own loopback address (head 127.0.0.2, worker 127.0.0.3, so
the node IPs differ as two hosts' do and no traffic leaves the loopback range) and its own environment
(`VLLM_HOST_IP` = that address, as every vLLM node of a multi-node deployment must set it). Every port
is chosen free at run time (`free_ports`), none assumed. Ray resolves "127.0.0.1" to the host's
routable address (`ray/_private/services.py` `resolve_ip_for_localhost`), so the nodes take the other
loopback addresses. Each node offers one unit of `DEVICE_RESOURCE` (the stand-in Ray device of the CPU
platform, `standins._ray_device_key`): vLLM's placement group takes one per worker, so PP2 puts one
stage on each node, as one GPU stage per node would.

This module imports neither Ray nor vLLM (it runs `ray` as a command): its unit tests need neither.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEVICE_RESOURCE = "deepinfer_cpu_device"  # one per node; standins._ray_device_key names the same key
HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"
READY_LINE = "Ray runtime started."  # `ray start` prints it once its node has joined the cluster
WORKER_PORTS = 12  # worker processes a node may start (idle pool + the stage actor + runtime-env ones)
OBJECT_STORE_BYTES = 100 << 20  # the smallest store Ray accepts is ~75 MiB; the engine passes no objects
START_TIMEOUT_S = 120.0
STOP_GRACE_S = 15.0


class RayNodeError(RuntimeError):
    """A node did not start (one line: which node, its log's tail)."""


def free_ports(n: int, host: str = "") -> list[int]:
    """n distinct ports free on `host` now ("" = every address, where Ray binds): each is bound at once
    (so none repeats), then all are released for the caller to hand out."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class NodeSpec:
    """One node: its address, environment and command line (every port filled in)."""

    name: str
    ip: str
    argv: list[str]
    env: dict[str, str]
    log: Path


@dataclass
class RayNode:
    spec: NodeSpec
    proc: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.proc.pid


def node_argv(ray_bin: str, ip: str, head_address: str | None, ports: list[int]) -> list[str]:
    """`ray start --block` for a head (head_address None) or a worker node; `ports` are free ports, 7 for a
    worker node + WORKER_PORTS, 2 more for the head (its GCS port is ports[0] there)."""
    p = list(ports)
    argv = [ray_bin, "start", "--block", "--disable-usage-stats", "--node-ip-address", ip]
    if head_address is None:
        argv += ["--head", "--port", str(p.pop(0)), "--include-dashboard=false"]
        argv += ["--dashboard-port", str(p.pop(0)), "--ray-client-server-port", str(p.pop(0))]
    else:
        argv += ["--address", head_address]
    argv += [
        "--num-cpus", "1",
        "--num-gpus", "0",
        "--resources", json.dumps({DEVICE_RESOURCE: 1}),
        "--object-store-memory", str(OBJECT_STORE_BYTES),
        "--node-manager-port", str(p.pop(0)),
        "--object-manager-port", str(p.pop(0)),
        "--dashboard-agent-listen-port", str(p.pop(0)),
        "--dashboard-agent-grpc-port", str(p.pop(0)),
        "--metrics-export-port", str(p.pop(0)),
        "--runtime-env-agent-port", str(p.pop(0)),
        "--worker-port-list", ",".join(str(x) for x in p[:WORKER_PORTS]),
    ]  # fmt: skip
    if len(p) < WORKER_PORTS:
        raise ValueError(f"node_argv: {len(ports)} ports are too few")
    return argv


PORTS_HEAD = 9 + WORKER_PORTS
PORTS_WORKER = 6 + WORKER_PORTS


@dataclass
class RayNodes:
    """A head and a worker node on this machine. `env`: the environment both nodes (and so every Ray
    worker process, vLLM's actors included) start with; each node adds its own VLLM_HOST_IP."""

    work: Path
    env: dict[str, str]
    ray_bin: str = "ray"
    start_timeout: float = START_TIMEOUT_S
    stop_grace: float = STOP_GRACE_S
    nodes: list[RayNode] = field(default_factory=list)
    address: str = ""
    stopped: list[dict[str, object]] = field(default_factory=list)  # per node: pid, how it ended

    def specs(self) -> list[NodeSpec]:
        ports = free_ports(PORTS_HEAD + PORTS_WORKER)
        head_ports, worker_ports = ports[:PORTS_HEAD], ports[PORTS_HEAD:]
        self.address = f"{HEAD_IP}:{head_ports[0]}"
        base = self.env | {"RAY_USAGE_STATS_ENABLED": "0"}
        return [
            NodeSpec(
                "head",
                HEAD_IP,
                node_argv(self.ray_bin, HEAD_IP, None, head_ports),
                base | {"VLLM_HOST_IP": HEAD_IP},
                self.work / "ray-head.log",
            ),
            NodeSpec(
                "worker",
                WORKER_IP,
                node_argv(self.ray_bin, WORKER_IP, self.address, worker_ports),
                base | {"VLLM_HOST_IP": WORKER_IP},
                self.work / "ray-worker.log",
            ),
        ]

    def start(self, specs: Sequence[NodeSpec] | None = None) -> None:
        """Start the nodes one after the other, each once the one before it is up; on any failure stop
        those already started and raise RayNodeError."""
        self.work.mkdir(parents=True, exist_ok=True)
        try:
            for spec in specs if specs is not None else self.specs():
                with spec.log.open("w") as log:
                    proc = subprocess.Popen(
                        spec.argv,
                        env=spec.env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,  # its own process group: the node's processes go with it
                    )
                node = RayNode(spec, proc)
                self.nodes.append(node)
                wait_ready(node, self.start_timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> list[dict[str, object]]:
        """Stop every node started, the last first (SIGTERM to its group, SIGKILL after the grace)."""
        while self.nodes:
            node = self.nodes.pop()
            self.stopped.append(
                {"node": node.spec.name, "pid": node.pid} | stop_group(node.proc, self.stop_grace)
            )
        return self.stopped

    def __enter__(self) -> RayNodes:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_ready(
    node: RayNode, timeout: float, poll: float = 0.5, clock: Callable[[], float] = time.monotonic
) -> None:
    """Until the node's log has READY_LINE; RayNodeError if it exits or `timeout` passes first."""
    deadline = clock() + timeout
    while True:
        text = node.spec.log.read_text(errors="replace") if node.spec.log.exists() else ""
        if READY_LINE in text:
            return
        rc = node.proc.poll()
        if rc is not None or clock() > deadline:
            tail = " | ".join(ln for ln in text.splitlines() if ln.strip())[-400:]
            why = f"exited with {rc}" if rc is not None else f"not up after {timeout:.0f} s"
            raise RayNodeError(
                f"ray {node.spec.name} node ({node.spec.ip}) {why}: {tail} (log {node.spec.log})"
            )
        time.sleep(poll)


def stop_group(proc: subprocess.Popen[bytes], grace: float) -> dict[str, object]:
    """SIGTERM to the process group led by `proc`, SIGKILL to the group after `grace` s if its leader
    is still there, then SIGKILL to the group again for any straggler; the leader is reaped."""
    how = "already exited"
    if proc.poll() is None:
        how = "sigterm"
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            how = "sigkill"
    _signal_group(proc.pid, signal.SIGKILL)  # the node's children that outlived its leader
    proc.wait()
    return {"stopped": how, "rc": proc.returncode}


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
