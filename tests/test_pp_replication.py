"""Pipeline replication across processes over gloo: the producing stage writes, the next replicates.

testing/pp/dist_roundtrip.py: one process per pipeline stage of the real V4.1 topology. Per step
each receives the payload next to stand-ins for upstream's `hidden_states` / `pre_mix` (point-to-point
sends into preallocated buffers), writes its replicas, runs its producers (the real 584-byte V4
record encoder for compressed KV, e4m3 + fp32 for indexer K) and sends on; the producer's pages come
over a separate test channel and the consumer compares them byte for byte, after chunked prefill,
decode, preemption with block reuse and recompute. The pp_records Triton kernel runs interpreted.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

if (
    not torch.cuda.is_available()
):  # before deepinfer_sm80.ops defines its kernels (as overlay/tests/conftest.py)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from deepinfer_sm80.testing.pp.dist_roundtrip import run_case


def test_two_processes_14_14_12(tmp_path: Path) -> None:
    """Stages 1 (layers 14-27: writes layer 20's caches and candidates) and 2 (28-39: replicas)."""
    res = run_case("14,14,12", tmp_path)
    assert res[0]["nonzero_source_bytes"] > 0, "the producer wrote nothing: the comparison would be vacuous"
    assert res[1]["mismatches"] == []
    if not torch.cuda.is_available():  # with a GPU present, CPU tensors take the reference path
        assert {r["kernel"] for r in res} == {"InterpretedFunction"}, "the Triton kernel must be what ran"


def test_two_processes_26_14_topk_over_the_boundary(tmp_path: Path) -> None:
    """Stage 1 starts at 26, a ratio-1 layer whose index source (24) is on stage 0: top-k rows cross."""
    res = run_case("26,14", tmp_path)
    assert all(r["mismatches"] == [] for r in res), [r["mismatches"][:3] for r in res]


def test_three_processes_13_14_13(tmp_path: Path) -> None:
    """vLLM's default PP3 split: both boundaries ship (ratio-2 layer 8, then layer 20, top-k of 8 and 24)."""
    res = run_case("13,14,13", tmp_path)
    assert all(r["mismatches"] == [] for r in res), [r["mismatches"][:3] for r in res]
    assert res[0]["nonzero_source_bytes"] > 0 and res[1]["nonzero_source_bytes"] > 0


def test_lost_payload_is_detected(tmp_path: Path) -> None:
    """The check can fail: a zeroed payload at the step after preemption leaves the replica stale."""
    res = run_case("14,14,12", tmp_path, fault="drop")
    assert any("step 6" in m for m in res[1]["mismatches"]), res[1]["mismatches"][:3]
