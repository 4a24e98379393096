"""Replication across processes: one pipeline stage per process, gloo on CPU or NCCL on GPUs.

    python -m deepinfer_sm80.testing.pp.dist_roundtrip --backend nccl --out DIR      # 2 GPUs
    python -m deepinfer_sm80.testing.pp.dist_roundtrip --backend gloo --out DIR      # CPU

Per step each process receives the payload next to stand-ins for upstream's `hidden_states` /
`pre_mix` (point-to-point sends into preallocated buffers, key order fixed, as vLLM's PP receive),
writes its replicas, runs its producers and sends on (testing/pp/rig.py). The producer also sends
its cache pages on a separate test channel and the consumer compares them byte for byte. Cases: the
stages 1 -> 2 of 14,14,12 and 0 -> 1 of 26,14 (a ratio-1 consumer without an index source of its own
reads top-k over the boundary); with --time, the send/recv time of payload + hidden states against
hidden states alone at T = 16, 512, 8192 (real hidden width 4 x 5120). Writes pp_dist.json with
`targets`. tests/test_pp_replication.py runs it with gloo in 2 and 3 processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CASES = {"14,14,12": [1, 2], "26,14": [0, 1], "13,14,13": [0, 1, 2]}
HIDDEN_STANDIN = 64  # hidden width in the correctness run (irrelevant to the mechanism)


def _worker(
    proc: int,
    world: int,
    stages: list[int],
    partition: list[int],
    store: str,
    out: str,
    fault: str,
    backend: str,
    timing: bool,
) -> None:
    from deepinfer_sm80.integration.pp.plan import build_plan
    from deepinfer_sm80.integration.pp.topology import Topology, v41_flash_fields
    from deepinfer_sm80.ops import pp_records as P
    from deepinfer_sm80.testing.pp import rig as R

    device = torch.device(f"cuda:{proc}") if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=proc, world_size=world)
    plan = build_plan(Topology.from_config(v41_flash_fields()), tuple(partition))
    rank = stages[proc]
    proc_of = {s: p for p, s in enumerate(stages)}
    rig = R.StageRig(plan, rank, device)
    toks = R.schedule(R.default_steps())
    step_no = [0]

    def frame_of(n: int, tensors: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        base = {
            "hidden_states": torch.full((n, 4, HIDDEN_STANDIN), float(rank), device=device),
            "pre_mix": torch.ones(n, 4, device=device),
        }
        return {**base, **(tensors or {})}

    def send(dst_stage: int, tensors: dict[str, torch.Tensor]) -> None:
        frame = frame_of(next(iter(tensors.values())).shape[0], tensors)
        for key in sorted(frame):  # one fixed key order on both sides
            dist.send(frame[key].contiguous(), dst=proc_of[dst_stage])

    def recv(src_stage: int, into: dict[str, torch.Tensor]) -> None:
        frame = frame_of(next(iter(into.values())).shape[0], into)
        for key in sorted(frame):
            dist.recv(frame[key], src=proc_of[src_stage])
        if fault == "drop" and rank == stages[-1] and step_no[0] == 6:
            for v in into.values():
                v.zero_()  # a payload lost after preemption must be caught

    def reads_from(s: int, r: int) -> bool:
        return any(i.producer in plan.stages[r].layers for i in plan.stages[s].needs)

    consumers = {r: [s for s in stages if reads_from(s, r) and s != r] for r in stages}
    producers = [r for r in stages if rank in consumers[r]]
    mismatches: list[str] = []
    nonzero = 0
    for i, tok in enumerate(toks):
        step_no[0] = i

        def get_truth() -> dict[str, torch.Tensor]:
            merged: dict[str, torch.Tensor] = {}
            for src in producers:
                box: list = [None]
                dist.recv_object_list(box, src=proc_of[src], device=device if device.type == "cuda" else None)
                merged.update({k: v.to(device) for k, v in box[0].items()})
            return merged

        bad = R.stage_step(
            rig,
            i,
            tok,
            recv if rank != stages[0] else None,
            send if rank != stages[-1] else None,
            get_truth if producers else None,
        )
        mismatches += [f"step {i} stage {rank}: {b}" for b in bad]
        mine = R.truth(rig, tok)
        nonzero += sum(int(v.count_nonzero()) for k, v in mine.items() if "/" in k)
        for dst in consumers[rank]:
            keep = {
                k: v.cpu()
                for k, v in mine.items()
                if any(k.startswith(i.key) for i in plan.stages[dst].needs)
            }
            dist.send_object_list([keep], dst=proc_of[dst], device=device if device.type == "cuda" else None)
    timed = _time(plan, rank, stages, proc_of, device) if timing and len(stages) == 2 else []
    kernel = type(P._pp_records_kernel).__name__
    result = {
        "stage": rank,
        "mismatches": mismatches,
        "nonzero_source_bytes": nonzero,
        "kernel": kernel,
        "timing": timed,
    }
    Path(f"{out}.{proc}").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _time(plan, rank: int, stages: list[int], proc_of: dict, device: torch.device) -> list[dict]:  # noqa: ANN001
    """Send/recv time of payload + hidden states vs hidden states alone (sender's clock, median of 20)."""
    from deepinfer_sm80.integration.pp.payload import empty_payload

    sender = rank == stages[0]
    peer = proc_of[stages[1] if sender else stages[0]]
    rows = []
    for n in (16, 512, 8192):
        hidden = torch.zeros(n, 4, 5120, dtype=torch.bfloat16, device=device)
        pre = torch.zeros(n, 4, device=device)
        extra = empty_payload(plan, stages[1], n, device)
        out: dict = {"tokens": n, "payload_bytes": sum(t.numel() * t.element_size() for t in extra.values())}
        for label, frame in (
            ("hidden_only", [hidden, pre]),
            ("with_payload", [hidden, pre, *extra.values()]),
        ):
            samples = []
            for rep in range(25):
                dist.barrier()
                t0 = time.perf_counter()
                for t in frame:
                    (dist.send if sender else dist.recv)(t, peer)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if rep >= 5:
                    samples.append((time.perf_counter() - t0) * 1e6)
            out[f"{label}_us"] = statistics.median(samples)
        rows.append(out)
    return rows


def run_case(
    name: str, tmp: Path, backend: str = "gloo", fault: str = "", timing: bool = False
) -> list[dict]:
    stages = CASES[name]
    partition = [int(x) for x in name.split(",")]
    store, out = tmp / f"store-{name}-{fault}", tmp / f"result-{name}-{fault}"
    store.unlink(missing_ok=True)
    # never plain fork: a parent that imported vLLM has threads, and a forked child can deadlock in gloo.
    # forkserver: one clean server process (started once, torch preloaded) forks the stages cheaply.
    method = "spawn" if backend == "nccl" else "forkserver"
    if method == "forkserver":
        mp.set_forkserver_preload(["torch", "deepinfer_sm80.testing.pp.rig"])
    args = (len(stages), stages, partition, str(store), str(out), fault, backend, timing)
    mp.start_processes(_worker, args=args, nprocs=len(stages), start_method=method)
    return [json.loads(Path(f"{out}.{p}").read_text()) for p in range(len(stages))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    ap.add_argument("--out", required=True)
    ap.add_argument("--time", action="store_true")
    args = ap.parse_args(argv)
    if args.backend == "nccl" and torch.cuda.device_count() < 2:
        print(f"error: NCCL needs 2 GPUs, {torch.cuda.device_count()} present", file=sys.stderr)
        return 2
    if args.backend == "gloo":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = {}
    for name in ("14,14,12", "26,14"):
        runs[name] = run_case(name, out, args.backend, timing=args.time and name == "14,14,12")
    identical = all(not r["mismatches"] for res in runs.values() for r in res)
    targets = [
        {
            "name": f"replicas byte-identical over {args.backend}",
            "measured": int(identical),
            "goal": 1,
            "unit": "bool",
            "direction": "==",
            "met": identical,
        }
    ]
    for row in runs["14,14,12"][0]["timing"]:
        ratio = row["with_payload_us"] / row["hidden_only_us"]
        name = f"send time with payload / hidden only, T={row['tokens']}"
        targets.append(
            {
                "name": name,
                "measured": round(ratio, 3),
                "goal": 1.25,
                "unit": "x",
                "direction": "<=",
                "met": ratio <= 1.25,
            }
        )
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if args.backend == "nccl" else None
    info = {"backend": args.backend, "gpus": torch.cuda.device_count(), "nccl": nccl}
    (out / "pp_dist.json").write_text(json.dumps({**info, "runs": runs, "targets": targets}, indent=1))
    print(json.dumps(targets, indent=1))
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
