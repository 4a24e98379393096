"""The replication payload: extra IntermediateTensors entries a stage sends and the next one applies.

Torch only (no vLLM import): the engine wrappers (engine.py) and the gloo tests drive the same code.
Every payload entry is one fixed-shape row per scheduled token, so the receiver can preallocate it
like upstream's `hidden_states` (padded tokens carry slot −1 and are skipped):

| key | row | source on the sending stage |
|---|---|---|
| `pp_ckv_<L>` | uint8 [584] | layer L's compressed-KV record written this step (gathered at L's slots) |
| `pp_ikv_<L>` | uint8 [132] | layer L's indexer-K record written this step |
| `pp_topk_<L>` | int32 [index_topk] | `topk_indices_buffer` row after layer L's indexer ran |
| `pp_cand_<L>` | int32 [candidate_blocks] | `candidate_block_buffer` row after layer L ran |
| `pp_ids_0` | int32 [1] | the step's token ids, given to the first stage only (an Engram layer hashes them) |

A relayed entry (produced before the sending stage) is forwarded as received: same bytes.
The receiver scatters `ckv`/`ikv` rows into its replica caches at its own slots for that cache (slot −1
skipped) before its first layer runs, and copies `topk`/`cand` rows into its buffers; the engine wrapper
hands `pp_ids_0` to upstream's forward as its input_ids (engine.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from deepinfer_sm80.integration.pp.plan import Item, Plan
from deepinfer_sm80.ops.pp_records import CKV_FORMAT, IKV_FORMAT, gather_records, scatter_records

FORMATS = {"ckv": CKV_FORMAT, "ikv": IKV_FORMAT}


@dataclass
class StageState:
    """What a stage exposes to the payload for one step.

    cache(item): the cache tensor holding `item` on this stage (the producer's own cache on its stage,
    the replica elsewhere); slots(item): this step's slot mapping of that cache [T] (−1 = no write);
    topk / cand: upstream's shared int32 buffers [max_tokens, W] (None where the model has none);
    ids: the step's token ids [T] on the first stage (None elsewhere: received, never produced there).
    """

    cache: Callable[[Item], torch.Tensor]
    slots: Callable[[Item], torch.Tensor]
    topk: torch.Tensor | None = None
    cand: torch.Tensor | None = None
    ids: torch.Tensor | None = None


def row_layout(plan: Plan, item: Item) -> tuple[int, torch.dtype]:
    """(row width, dtype) of `item`'s payload rows."""
    if item.persistent:
        return sum(FORMATS[item.kind]), torch.uint8
    return plan.topology.per_token_wire_bytes(item.kind) // 4, torch.int32  # topk, cand, ids: int32 rows


def empty_payload(
    plan: Plan, rank: int, num_tokens: int, device: torch.device | str
) -> dict[str, torch.Tensor]:
    """Zero buffers for what stage `rank` receives (its share of make_empty_intermediate_tensors)."""
    out = {}
    for item in plan.stages[rank].receives:
        width, dtype = row_layout(plan, item)
        out[item.key] = torch.zeros(num_tokens, width, dtype=dtype, device=device)
    return out


def _buffer(state: StageState, kind: str) -> torch.Tensor:
    buf = state.topk if kind == "topk" else state.cand
    if buf is None:
        raise ValueError(f"this stage has no {kind} buffer but the plan ships one")
    return buf


def pack(
    plan: Plan,
    rank: int,
    num_tokens: int,
    state: StageState,
    incoming: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """The entries stage `rank` adds to the IntermediateTensors it sends (after its layers ran)."""
    stage = plan.stages[rank]
    out: dict[str, torch.Tensor] = {}
    for item in stage.sends:
        if item in stage.receives:  # relay: produced before this stage, forwarded byte for byte
            if incoming is None or item.key not in incoming:
                raise KeyError(f"stage {rank} must relay {item.key} but did not receive it")
            out[item.key] = incoming[item.key][:num_tokens]
        elif item.kind == "ids":
            if state.ids is None:
                raise ValueError(f"stage {rank} must send the step's token ids but was given none")
            out[item.key] = state.ids[:num_tokens].to(torch.int32).reshape(num_tokens, 1)
        elif item.persistent:
            slots = state.slots(item)[:num_tokens]
            out[item.key] = gather_records(state.cache(item), slots, FORMATS[item.kind])
        else:
            out[item.key] = _buffer(state, item.kind)[:num_tokens].clone()
    return out


def apply(
    plan: Plan, rank: int, num_tokens: int, state: StageState, incoming: Mapping[str, torch.Tensor]
) -> None:
    """Write what stage `rank` needs from `incoming` into its replicas and buffers (before its layers)."""
    for item in plan.stages[rank].needs:
        if item.key not in incoming:
            raise KeyError(f"stage {rank} needs {item.key}; the IntermediateTensors lack it")
        rows = incoming[item.key][:num_tokens]
        if item.kind == "ids":  # the engine wrapper passes them as input_ids (received_ids)
            continue
        if item.persistent:
            scatter_records(state.cache(item), state.slots(item)[:num_tokens], rows, FORMATS[item.kind])
        else:
            _buffer(state, item.kind)[:num_tokens].copy_(rows)


def received_ids(
    plan: Plan, rank: int, num_tokens: int, incoming: Mapping[str, torch.Tensor]
) -> torch.Tensor | None:
    """The step's token ids [T] int32 that stage `rank` received (a view: graph capture reads the buffer),
    or None where the stage needs none."""
    for item in plan.stages[rank].needs:
        if item.kind == "ids":
            if item.key not in incoming:
                raise KeyError(f"stage {rank} needs {item.key}; the IntermediateTensors lack it")
            return incoming[item.key][:num_tokens, 0]
    return None
