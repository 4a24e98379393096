"""Pipeline-parallel layer partitions versus DeepSeek-V4.1's KV-sharing groups (docs/MODEL.md).

A boundary b (first layer of the next stage) is inside group [s, e] when s < b <= e. Upstream
vLLM 0.32.0 raises NotImplementedError there; patch 00 (both images, both DeepInfer levels) serves
such a cut by replicating the shared state on the later stage (docs/PIPELINE.md). So a partition
is refused here only for what no build serves (wrong entry count or sum, an empty stage); a cut
inside a group is checked against what the servers carry (their patch set) in preflight.
"""

from __future__ import annotations

from itertools import combinations

V41_KV_SHARING_GROUPS: tuple[tuple[int, int], ...] = ((2, 7), (8, 13), (14, 19), (20, 39))


def boundaries(partition: list[int]) -> list[int]:
    out, acc = [], 0
    for size in partition[:-1]:
        acc += size
        out.append(acc)
    return out


def illegal_boundaries(
    partition: list[int], groups: tuple[tuple[int, int], ...]
) -> list[tuple[int, int, int]]:
    """(boundary, group start, group end) for every boundary that splits a sharing group."""
    return [(b, s, e) for b in boundaries(partition) for s, e in groups if s < b <= e]


def legal_partitions(num_layers: int, pp: int, groups: tuple[tuple[int, int], ...]) -> list[list[int]]:
    """All legal partitions, most balanced first (smallest largest stage, then smallest spread)."""
    allowed = [b for b in range(1, num_layers) if not any(s < b <= e for s, e in groups)]
    found = []
    for cut in combinations(allowed, pp - 1):
        edges = [0, *cut, num_layers]
        found.append([edges[i + 1] - edges[i] for i in range(pp)])
    mean = num_layers / pp
    return sorted(found, key=lambda p: (max(p), sum((x - mean) ** 2 for x in p)))


def split_text(partition: list[int], groups: tuple[tuple[int, int], ...]) -> str:
    return "; ".join(
        f"boundary at layer {b} splits KV-sharing group {s}–{e}"
        for b, s, e in illegal_boundaries(partition, groups)
    )


def partition_error(
    partition: list[int],
    pp: int,
    num_layers: int,
    groups: tuple[tuple[int, int], ...],
    replication: bool = True,
) -> str | None:
    """Why no server would start with `partition` (None if one would). `replication`: the server
    carries patch 00, which serves a cut inside a KV-sharing group; without it such a cut is refused
    with the replication-free alternatives (upstream's NotImplementedError)."""
    if len(partition) != pp:
        return f"VLLM_PP_LAYER_PARTITION has {len(partition)} entries but pp={pp}"
    if any(size < 1 for size in partition):
        return f"VLLM_PP_LAYER_PARTITION={','.join(map(str, partition))}: every stage needs >= 1 layer"
    if sum(partition) != num_layers:
        return f"VLLM_PP_LAYER_PARTITION sums to {sum(partition)}, the model has {num_layers} layers"
    if replication or not illegal_boundaries(partition, groups):
        return None
    alts = " or ".join(",".join(map(str, p)) for p in legal_partitions(num_layers, pp, groups)[:2])
    return (
        f"VLLM_PP_LAYER_PARTITION={','.join(map(str, partition))}: {split_text(partition, groups)}; "
        f"upstream vLLM 0.32.0 raises NotImplementedError there and only patch 00's replication serves it. "
        f"Replication-free alternatives: {alts} (e.g. --set topology.pp_partition=[{alts.split(' or ')[0]}])"
    )
