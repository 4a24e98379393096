"""Replication plan: which shared state each pipeline stage receives from which, and what it costs.

A V4.1 layer reads state other layers produced (topology.py `reads`): its kv source's compressed-KV
cache (`ckv`) and, for a non-owning indexer, the source's indexer-K cache (`ikv`), both persistent;
and for the current step, the top-k rows of its index source (`topk`) and the candidate blocks of
layer 20 (`cand`). Upstream refuses a pipeline cut that separates a reader from its producer
(attention.py L454/L597). The plan lists, per stage, what crosses into it; the payload (payload.py)
ships exactly that with the pipeline's IntermediateTensors and the receiver writes replicas.

    python -m deepinfer_sm80.integration.pp.plan --config MODEL_DIR --partition 14,14,12 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from deepinfer_sm80.integration.pp.topology import DEFAULT_BLOCK_TOKENS, Topology

ENV_PARTITION = "VLLM_PP_LAYER_PARTITION"
ENV_REPLICATION = "DEEPINFER_SM80_PP_REPLICATION"  # "0": refuse splits that need replication
KINDS = ("ckv", "ikv", "topk", "cand", "ids")
PERSISTENT = frozenset({"ckv", "ikv"})  # replicated into a cache; the rest are per-step rows
# Shared state of the KV-sharing groups (what DEEPINFER_SM80_PP_REPLICATION=0 refuses to ship); `ids`, the
# step's token ids an Engram layer hashes, is an input of the step, not a replica: it always crosses.
REPLICATED = frozenset({"ckv", "ikv", "topk", "cand"})


class PartitionError(ValueError):
    """A partition this plan cannot serve; the message names the legal alternatives."""


@dataclass(frozen=True, order=True)
class Item:
    """One piece of shared state: `kind` produced by layer `producer`."""

    producer: int
    kind: str

    @property
    def key(self) -> str:
        """Its IntermediateTensors key (upstream's keys are 'hidden_states' and 'pre_mix')."""
        return f"pp_{self.kind}_{self.producer}"

    @property
    def persistent(self) -> bool:
        return self.kind in PERSISTENT


@dataclass(frozen=True)
class Stage:
    rank: int
    start: int
    end: int  # exclusive
    needs: tuple[Item, ...]  # read by this stage's layers, produced on an earlier stage
    receives: tuple[Item, ...]  # cross the boundary into this stage (its needs + what it relays)
    sends: tuple[Item, ...]  # cross the boundary out of this stage

    @property
    def replicas(self) -> tuple[Item, ...]:
        """Caches this stage holds a byte-identical copy of (KV capacity counts them)."""
        return tuple(i for i in self.needs if i.persistent)

    @property
    def layers(self) -> range:
        return range(self.start, self.end)


@dataclass(frozen=True)
class Plan:
    topology: Topology
    partition: tuple[int, ...]
    stages: tuple[Stage, ...]
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    notes: tuple[str, ...] = field(default=())

    @property
    def needs_replication(self) -> bool:
        """A stage reads KV-sharing state produced on an earlier stage (caches or top-k/candidate rows)."""
        return any(i.kind in REPLICATED for s in self.stages for i in s.needs)

    @property
    def crosses(self) -> bool:
        """Anything beyond upstream's hidden states crosses a boundary (replication or Engram's ids)."""
        return any(s.needs for s in self.stages)

    def payload_bytes_per_token(self, rank: int) -> int:
        """Extra bytes per scheduled token that stage `rank` sends to `rank + 1` (beyond upstream's)."""
        return sum(self.topology.per_token_wire_bytes(i.kind) for i in self.stages[rank].sends)

    def replica_kv_bytes_per_token(self, rank: int) -> float:
        """KV memory per context token that stage `rank` spends on replicas (pages included), per rank."""
        t = self.topology
        return sum(
            t.cache_bytes_per_token(i.kind, i.producer, self.block_tokens) for i in self.stages[rank].replicas
        )

    def own_kv_bytes_per_token(self, rank: int) -> float:
        """KV memory per context token of the compressed and indexer caches the stage owns."""
        t = self.topology
        total = 0.0
        for layer in self.stages[rank].layers:
            if t.is_kv_source(layer):
                total += t.cache_bytes_per_token("ckv", layer, self.block_tokens)
                total += t.cache_bytes_per_token("ikv", layer, self.block_tokens)
        return total

    def to_dict(self) -> dict[str, Any]:
        t = self.topology
        stages = []
        for s in self.stages:
            stages.append(
                {
                    "rank": s.rank,
                    "layers": [s.start, s.end - 1],
                    "needs": [i.key for i in s.needs],
                    "replicas": [i.key for i in s.replicas],
                    "receives": [i.key for i in s.receives],
                    "sends": [i.key for i in s.sends],
                    "payload_bytes_per_token_out": self.payload_bytes_per_token(s.rank)
                    if s.rank < len(self.stages) - 1
                    else 0,
                    "hidden_bytes_per_token_out": t.hidden_wire_bytes()
                    if s.rank < len(self.stages) - 1
                    else 0,
                    "own_kv_bytes_per_token": self.own_kv_bytes_per_token(s.rank),
                    "replica_kv_bytes_per_token": self.replica_kv_bytes_per_token(s.rank),
                }
            )
        return {
            "partition": list(self.partition),
            "needs_replication": self.needs_replication,
            "crosses": self.crosses,
            "block_tokens": self.block_tokens,
            "stages": stages,
            "notes": list(self.notes),
        }

    def describe(self) -> str:
        lines = [f"partition {','.join(map(str, self.partition))}"]
        for st in self.to_dict()["stages"]:
            lo, hi = st["layers"]
            line = f"  stage {st['rank']}: layers {lo}-{hi}"
            if st["replicas"]:
                extra = st["replica_kv_bytes_per_token"]
                line += f"; replicas {', '.join(st['replicas'])} (+{extra:g} B/ctx token)"
            if st["sends"]:
                line += f"; sends {', '.join(st['sends'])} (+{st['payload_bytes_per_token_out']} B/token)"
            lines.append(line)
        if not self.crosses:
            lines.append("  no shared state crosses a stage boundary")
        return "\n".join(lines)


# -------------------------------------------------------------------------------- partitions
def default_partition(num_layers: int, pp: int) -> tuple[int, ...]:
    """vLLM's split without VLLM_PP_LAYER_PARTITION (distributed/utils.py get_pp_indices): equal shares,
    the remainder going to the stages before the last, from the second-to-last backwards."""
    share, rest = divmod(num_layers, pp)
    parts = [share] * pp
    for i in range(2, rest + 2):
        parts[-i] += 1
    return tuple(parts)


def parse_partition(
    text: str | None, num_layers: int, pp: int, topology: Topology | None = None
) -> tuple[int, ...]:
    """The partition vLLM will use: `text` (VLLM_PP_LAYER_PARTITION syntax) or its default."""
    if text is None or not text.strip():
        return default_partition(num_layers, pp)
    try:
        parts = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise PartitionError(
            f"{ENV_PARTITION}={text!r} is not a comma-separated list of layer counts"
        ) from None
    problem = None
    if len(parts) != pp:
        problem = f"{ENV_PARTITION}={text} has {len(parts)} entries for pipeline size {pp}"
    elif sum(parts) != num_layers:
        problem = f"{ENV_PARTITION}={text} sums to {sum(parts)}, the model has {num_layers} layers"
    elif min(parts) < 1:
        problem = f"{ENV_PARTITION}={text} has an empty stage"
    if problem:
        raise PartitionError(problem + "; " + alternatives_text(topology, num_layers, pp))
    return parts


def legal_cuts(topology: Topology) -> list[int]:
    """Stage start layers that separate no reader from its producer (no replication needed; Engram's ids
    are a step input, not shared state, and cross any cut)."""
    t = topology
    cuts = []
    for c in range(1, t.num_layers):
        if all(producer >= c for layer in range(c, t.num_layers) for _, producer in t.reads(layer)):
            cuts.append(c)
    return cuts


def replication_free_partitions(topology: Topology, pp: int) -> list[tuple[int, ...]]:
    """Every partition that needs no replication, most balanced first (smallest largest stage)."""
    n = topology.num_layers
    found = []
    for cut in combinations(legal_cuts(topology), pp - 1):
        edges = (0, *cut, n)
        found.append(tuple(edges[i + 1] - edges[i] for i in range(pp)))
    return sorted(found, key=lambda p: (max(p), max(p) - min(p), p))


def alternatives_text(topology: Topology | None, num_layers: int, pp: int) -> str:
    """The legal choices for a refused partition, as one clause of an error line."""
    default = ",".join(map(str, default_partition(num_layers, pp)))
    if topology is None:
        return f"legal: any {pp} positive counts summing to {num_layers}, e.g. {default}"
    free = [",".join(map(str, p)) for p in replication_free_partitions(topology, pp)[:4]]
    cuts = ", ".join(map(str, legal_cuts(topology)))
    text = f"legal: any {pp} positive counts summing to {num_layers} with replication on (e.g. {default})"
    if free:
        text += f"; without replication: {' or '.join(free)} (stages may start at layers {cuts})"
    return text


# -------------------------------------------------------------------------------- the plan
def build_plan(
    topology: Topology,
    partition: tuple[int, ...],
    *,
    replication: bool = True,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
) -> Plan:
    """The plan for `partition`; PartitionError if it is malformed, or needs replication when it is off."""
    t = topology
    pp = len(partition)
    parse_partition(",".join(map(str, partition)), t.num_layers, pp, t)  # shape checks, one message format
    edges = [0]
    for p in partition:
        edges.append(edges[-1] + p)
    stage_of = {layer: r for r in range(pp) for layer in range(edges[r], edges[r + 1])}

    needs: list[set[Item]] = [set() for _ in range(pp)]
    for layer in range(t.num_layers):
        for kind, producer in t.reads(layer) + t.step_inputs(layer):
            if stage_of[producer] != stage_of[layer]:
                needs[stage_of[layer]].add(Item(producer, kind))

    stages = []
    for r in range(pp):
        start, end = edges[r], edges[r + 1]
        # an item crosses the boundary into r if r or a later stage needs it and it was produced before r
        receives = {i for later in needs[r:] for i in later if i.producer < start}
        sends = {i for later in needs[r + 1 :] for i in later if i.producer < end}
        stages.append(
            Stage(r, start, end, tuple(sorted(needs[r])), tuple(sorted(receives)), tuple(sorted(sends)))
        )
    plan = Plan(t, tuple(partition), tuple(stages), block_tokens)
    if plan.needs_replication and not replication:
        raise PartitionError(
            f"{ENV_PARTITION}={','.join(map(str, partition))} splits a KV-sharing group "
            f"({', '.join(i.key for s in stages for i in s.needs if i.kind in REPLICATED)} cross stages) and "
            f"{ENV_REPLICATION}=0; " + alternatives_text(t, t.num_layers, pp)
        )
    return plan


def plan_from_env(topology: Topology, pp: int, environ: dict[str, str] | None = None) -> Plan:
    env = os.environ if environ is None else environ
    partition = parse_partition(env.get(ENV_PARTITION), topology.num_layers, pp, topology)
    replication = env.get(ENV_REPLICATION, "1").strip() not in ("0", "false", "off")
    return build_plan(topology, partition, replication=replication)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="model directory or config.json")
    ap.add_argument("--partition", help=f"layer counts per stage (default: ${ENV_PARTITION} or vLLM's split)")
    ap.add_argument("--pp", type=int, help="pipeline size (default: entries of --partition)")
    ap.add_argument("--no-replication", action="store_true", help="refuse splits that need replication")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        topo = Topology.from_file(args.config)
        text = args.partition or os.environ.get(ENV_PARTITION)
        pp = args.pp or (len(text.split(",")) if text else None)
        if pp is None:
            raise PartitionError("give --partition or --pp")
        plan = build_plan(
            topo, parse_partition(text, topo.num_layers, pp, topo), replication=not args.no_replication
        )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(plan.to_dict(), indent=1) if args.json else plan.describe())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
