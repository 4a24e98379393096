"""Pipeline replication across processes over gloo: the producing stage writes, the next replicates.

Each process is one pipeline stage of the real V4.1 topology. Per step it receives the payload next
to stand-ins for upstream's `hidden_states` / `pre_mix` (point-to-point tensor sends into
preallocated buffers, as vLLM's PP receive does), writes its replicas, runs its producers (the real
584-byte V4 record encoder for compressed KV, e4m3 + fp32 for indexer K), and sends on. The producer
also sends its cache pages to every consumer on a separate test channel, and the consumer compares
them byte for byte: after chunked prefill, decode, preemption with block reuse and recompute.
The pp_records kernel runs under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

os.environ.setdefault("TRITON_INTERPRET", "1")  # before deepinfer_sm80.ops defines its kernels
HIDDEN = 64  # stand-in width for hidden_states [T, hc, H] (the real 5120 is irrelevant to the mechanism)


def _worker(
    proc: int, world: int, stages: list[int], partition: list[int], store: str, out: str, fault: str
) -> None:
    from deepinfer_sm80.integration.pp import rig as R
    from deepinfer_sm80.integration.pp.plan import build_plan
    from deepinfer_sm80.integration.pp.topology import Topology, v41_flash_fields
    from deepinfer_sm80.ops import pp_records as P

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=proc, world_size=world)
    plan = build_plan(Topology.from_config(v41_flash_fields()), tuple(partition))
    rank = stages[proc]  # the pipeline stage this process plays
    proc_of = {s: p for p, s in enumerate(stages)}
    rig = R.StageRig(plan, rank, "cpu")
    kernel = type(P._pp_records_kernel).__name__
    toks = R.schedule(R.default_steps())
    step_no = [0]

    def send(dst_stage: int, tensors: dict[str, torch.Tensor]) -> None:
        n = next(iter(tensors.values())).shape[0]
        frame = {
            "hidden_states": torch.full((n, 4, HIDDEN), float(rank)),
            "pre_mix": torch.ones(n, 4),
            **tensors,
        }
        for key in sorted(frame):  # fixed key order on both sides, as send_tensor_dict's metadata gives
            dist.send(frame[key].contiguous(), dst=proc_of[dst_stage])

    def recv(src_stage: int, into: dict[str, torch.Tensor]) -> None:
        n = next(iter(into.values())).shape[0]
        frame = {"hidden_states": torch.empty(n, 4, HIDDEN), "pre_mix": torch.empty(n, 4), **into}
        for key in sorted(frame):
            dist.recv(frame[key], src=proc_of[src_stage])
        if fault == "drop" and rank == stages[-1] and step_no[0] == 6:
            for v in into.values():
                v.zero_()  # a lost payload after preemption must be caught

    def reads_from(s: int, r: int) -> bool:
        return any(i.producer in plan.stages[r].layers for i in plan.stages[s].needs)

    consumers = {r: [s for s in stages if reads_from(s, r)] for r in stages}
    producers = [r for r in stages if rank in consumers[r] and r != rank]
    mismatches: list[str] = []
    nonzero = 0
    for i, tok in enumerate(toks):
        step_no[0] = i

        def get_truth() -> dict[str, torch.Tensor]:
            merged: dict[str, torch.Tensor] = {}
            for src in producers:
                box: list = [None]
                dist.recv_object_list(box, src=proc_of[src])
                merged.update(box[0])
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
            if dst != rank:
                keep = {
                    k: v for k, v in mine.items() if any(k.startswith(i.key) for i in plan.stages[dst].needs)
                }
                dist.send_object_list([keep], dst=proc_of[dst])
    torch.save(
        {"stage": rank, "mismatches": mismatches, "nonzero_source_bytes": nonzero, "kernel": kernel},
        f"{out}.{proc}",
    )
    dist.destroy_process_group()


def _run(tmp_path: Path, stages: list[int], partition: list[int], fault: str = "") -> list[dict]:
    store, out = tmp_path / "store", tmp_path / "result"
    args = (len(stages), stages, partition, str(store), str(out), fault)
    mp.start_processes(_worker, args=args, nprocs=len(stages), start_method="fork")  # fork: no re-import
    return [torch.load(f"{out}.{p}") for p in range(len(stages))]


def test_two_processes_14_14_12(tmp_path: Path) -> None:
    """Stages 1 (layers 14-27: writes layer 20's caches and candidates) and 2 (28-39: replicas)."""
    res = _run(tmp_path, [1, 2], [14, 14, 12])
    assert res[0]["nonzero_source_bytes"] > 0, "the producer wrote nothing: the comparison would be vacuous"
    assert res[1]["mismatches"] == []
    assert {r["kernel"] for r in res} == {"InterpretedFunction"}, "the Triton kernel must be what ran"


def test_three_processes_13_14_13_relay(tmp_path: Path) -> None:
    """vLLM's default PP3 split: both boundaries ship (ratio-2 layer 8, then layer 20, top-k of 8 and 24)."""
    res = _run(tmp_path, [0, 1, 2], [13, 14, 13])
    assert all(r["mismatches"] == [] for r in res), [r["mismatches"][:3] for r in res]
    assert res[0]["nonzero_source_bytes"] > 0 and res[1]["nonzero_source_bytes"] > 0


def test_lost_payload_is_detected(tmp_path: Path) -> None:
    """The check can fail: a zeroed payload at the step after preemption leaves the replica stale."""
    res = _run(tmp_path, [1, 2], [14, 14, 12], fault="drop")
    assert any("step 6" in m for m in res[1]["mismatches"]), res[1]["mismatches"][:3]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
