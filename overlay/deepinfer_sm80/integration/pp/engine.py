"""vLLM 0.32.0 wrappers that put the replication plan into the engine (binding rows `pp_*`).

Three rows on `vllm.models.deepseek_v41.nvidia.model`, every capability (`below=EVERY_CAPABILITY`:
pipeline replication is not about the architecture):

* `make_layers` (wrap): before upstream builds this stage's layers, compute the plan from the
  checkpoint config and VLLM_PP_LAYER_PARTITION (a malformed or, with DEEPINFER_SM80_PP_REPLICATION=0,
  a group-splitting partition is refused with the legal alternatives) and register a replica for
  every remote cache this stage reads: layer L's compressed-KV cache under L's own attention prefix
  (`...layers.L.attn`) and its indexer-K cache under `...layers.L.attn.indexer.k_cache` (upstream's
  own `DeepseekV4IndexerCache`). Upstream's consumers then find their source (no NotImplementedError,
  attention.py L454/L597), vLLM collects the replicas' KV-cache specs with the stage's own layers
  (the merged spec has the same name and spec as on the producing stage, so both land in the same
  KV-cache group and share its block table), and the stage's KV capacity at start-up counts them.
* `DeepseekV4Model.forward` (wrap): a receiving stage writes the payload (payload.apply) before its
  first layer; a sending stage appends payload.pack's entries to the IntermediateTensors it returns.
* `DeepseekV4Model.make_empty_intermediate_tensors` (wrap): the receiver's preallocated buffers gain
  the payload keys (model runner V2 copies received tensors key by key into them).

Gated to the partitions where something crosses (issues 22, 37): with PP = 1, a model without KV-sharing
groups, or a partition whose stages read nothing from an earlier stage (20,20: no replica, and both
Engram layers 1 and 14 on the first stage), each wrapper calls upstream's function with the
arguments it got and returns its result, and nothing is planned, logged or registered. Engram counts:
a later stage holding an Engram layer (13,14,13; 14,14,12) receives the step's token ids (`pp_ids_0`),
which model runner V2 gives the first stage only, and hands them to upstream's forward as input_ids.
Upstream's SM90+ path drops those Engram layers the same way (row `pp_engram_entry` has the other half),
so these rows act there too. A malformed partition is refused here first; upstream refuses it too
(distributed/utils.py get_pp_indices).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

from deepinfer_sm80.integration.pp import aux, payload
from deepinfer_sm80.integration.pp.plan import ENV_PARTITION, Item, Plan, plan_from_env
from deepinfer_sm80.integration.pp.topology import IKV_RECORD_BYTES, Topology

LOG = logging.getLogger("deepinfer_sm80.pp")
_RUNTIMES: dict[str, StageRuntime] = {}  # layers prefix ("model.layers") -> this process's stage
_KEEP: list[nn.Module] = []  # replicas live in the forward context only; keep them referenced


def cache_prefix(layers_prefix: str, item: Item) -> str:
    """The forward-context name of the cache holding `item` (the producer's own names, on every stage)."""
    if item.kind == "ckv":
        return f"{layers_prefix}.{item.producer}.attn"
    if item.kind == "ikv":
        return f"{layers_prefix}.{item.producer}.attn.indexer.k_cache"
    raise ValueError(f"{item.key} is not a cache")


class StageRuntime:
    """This process's pipeline stage: its plan row and how to reach its caches and buffers."""

    def __init__(self, plan: Plan, rank: int, layers_prefix: str) -> None:
        self.plan, self.rank, self.prefix = plan, rank, layers_prefix
        self.stage = plan.stages[rank]

    @property
    def active(self) -> bool:
        return bool(self.stage.receives or self.stage.sends)

    def state(
        self, model: Any, context: dict[str, Any], metadata: dict[str, Any], ids: torch.Tensor | None = None
    ) -> payload.StageState:
        return payload.StageState(
            cache=lambda item: context[cache_prefix(self.prefix, item)].kv_cache,
            slots=lambda item: metadata[cache_prefix(self.prefix, item)].slot_mapping,
            topk=getattr(model, "topk_indices_buffer", None),
            cand=getattr(model, "candidate_block_buffer", None),
            ids=ids,
        )


# ----------------------------------------------------------------------------- replicas
def _attention_layer_base() -> type:
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    return AttentionLayerBase


def _make_ckv_replica_cls() -> type:
    base = _attention_layer_base()

    class CompressedKVReplica(nn.Module, base):  # type: ignore[misc, valid-type]
        """Stands in for a remote kv source: owns a byte-identical copy of its compressed-KV cache.

        Its KV-cache spec is upstream's own (DeepseekV4Attention.get_kv_cache_spec) evaluated on the
        source's attributes, taken from a local consumer of the same class once the layers exist."""

        def __init__(self, prefix: str, compress_ratio: int, context: dict[str, Any]) -> None:
            super().__init__()
            if prefix in context:
                raise ValueError(f"Duplicate layer name: {prefix}")
            self.prefix = prefix
            self.compress_ratio = compress_ratio
            self.is_kv_source = True
            self.kv_cache = torch.tensor([])
            self.consumer: Any = None
            context[prefix] = self

        def bind_consumer(self, consumer: Any) -> None:
            self.consumer = consumer
            for attr in ("kv_cache_dtype", "kv_cache_torch_dtype", "head_dim", "kv_page_alignment"):
                setattr(self, attr, getattr(consumer, attr))
            self.compressed_bytes_per_token = consumer.compressed_bytes_per_token
            if getattr(consumer, "num_heads", None) is not None:
                self.num_heads = consumer.num_heads

        def get_kv_cache_spec(self, vllm_config: Any) -> Any:
            if self.consumer is None:
                raise RuntimeError(f"replica {self.prefix}: no local consumer to take the cache format from")
            return type(self.consumer).get_kv_cache_spec(self, vllm_config)

        def get_attn_backend(self) -> Any:
            return self.consumer.get_attn_backend()

        def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
            self.kv_cache = kv_cache.squeeze(1)  # [B, 1, N, C] -> [B, N, C], as upstream's layers do

        def forward(self) -> None:
            raise RuntimeError(f"{self.prefix} is a pipeline replica; it is written by the payload only")

    return CompressedKVReplica


_CKV_REPLICA: type | None = None


def make_replicas(plan: Plan, rank: int, layers_prefix: str, vllm_config: Any) -> list[nn.Module]:
    """Register this stage's replicas in the forward context (before its layers are built)."""
    global _CKV_REPLICA
    from vllm.models.deepseek_v41.attention import (
        DeepseekV4IndexerCache,
        _indexer_k_cache_head_dim,
        dsa_indexer_uses_fp4,
    )

    context = vllm_config.compilation_config.static_forward_context
    topo = plan.topology
    out: list[nn.Module] = []
    for item in plan.stages[rank].replicas:
        prefix = cache_prefix(layers_prefix, item)
        ratio = topo.ratios[item.producer]
        if item.kind == "ckv":
            _CKV_REPLICA = _CKV_REPLICA or _make_ckv_replica_cls()
            out.append(_CKV_REPLICA(prefix, ratio, context))
        else:
            width = _indexer_k_cache_head_dim(topo.index_head_dim, dsa_indexer_uses_fp4(vllm_config))
            if width != IKV_RECORD_BYTES:
                raise NotImplementedError(
                    f"pipeline replication ships {IKV_RECORD_BYTES}-byte FP8 indexer-K records; this "
                    f"configuration stores {width}-byte records"
                )
            out.append(
                DeepseekV4IndexerCache(
                    head_dim=width,
                    dtype=torch.uint8,
                    prefix=prefix,
                    cache_config=vllm_config.cache_config,
                    compress_ratio=ratio,
                )
            )
    _KEEP.extend(out)
    return out


def bind_consumers(replicas: list[nn.Module], layers: nn.ModuleList) -> None:
    """Give each compressed-KV replica a local consumer (the source's format = the consumer's)."""
    for rep in replicas:
        if not hasattr(rep, "bind_consumer"):
            continue
        for layer in layers:
            attn = getattr(layer, "attn", None)
            if attn is not None and getattr(attn, "compressed_cache_prefix", None) == rep.prefix:
                rep.bind_consumer(attn)
                break
        else:
            raise RuntimeError(f"pipeline replica {rep.prefix} has no consumer on this stage")


# ----------------------------------------------------------------------------- binding targets
def _pp_group() -> tuple[int, int]:
    from vllm.distributed.parallel_state import get_pp_group

    g = get_pp_group()
    return g.rank_in_group, g.world_size


def wrap_make_layers(upstream: Callable[..., Any]) -> Callable[..., Any]:
    """Binding `pp_make_layers`: plan + replicas around upstream's make_layers."""

    def make_layers(num_hidden_layers: int, layer_fn: Callable[..., Any], prefix: str) -> Any:
        from vllm.config import get_current_vllm_config

        vllm_config = get_current_vllm_config()
        hf = vllm_config.model_config.hf_config
        rank, size = _pp_group()
        if size == 1 or not getattr(hf, "kv_source_layer_ids", None):
            return upstream(num_hidden_layers, layer_fn, prefix)
        plan = plan_from_env(Topology.from_config(hf), size)
        if not plan.crosses:  # no stage reads an earlier one's state or ids: upstream's code path as is
            return upstream(num_hidden_layers, layer_fn, prefix)
        stage = plan.stages[rank]
        LOG.info("DeepInfer-SM80 pipeline plan (%s=%s):\n%s", ENV_PARTITION, os.environ.get(ENV_PARTITION),
                 plan.describe())  # fmt: skip
        replicas = make_replicas(plan, rank, prefix, vllm_config)
        start, end, layers = upstream(num_hidden_layers, layer_fn, prefix)
        if (start, end) != (stage.start, stage.end):
            want = f"{stage.start}-{stage.end - 1}"
            raise RuntimeError(f"pipeline stage {rank}: vLLM built layers {start}-{end - 1}, the plan {want}")
        bind_consumers(replicas, layers)
        _RUNTIMES[prefix] = StageRuntime(plan, rank, prefix)
        return start, end, layers

    return make_layers


def _layers_prefix(model: Any) -> str | None:
    if model.start_layer >= model.end_layer:
        return None
    attn = getattr(model.layers[model.start_layer], "attn", None)
    m = re.fullmatch(r"(.*)\.\d+\.attn", getattr(attn, "prefix", "") or "")
    return m.group(1) if m else None


def runtime_for(model: Any) -> StageRuntime | None:
    if "_deepinfer_pp" not in model.__dict__:
        rt = _RUNTIMES.get(_layers_prefix(model) or "")
        if rt is not None and rt.active and getattr(model, "use_sequence_parallel", False):
            raise NotImplementedError("pipeline replication does not support sequence parallelism")
        model.__dict__["_deepinfer_pp"] = rt if rt is not None and rt.active else None
    return model.__dict__["_deepinfer_pp"]


def _step_metadata() -> dict[str, Any] | None:
    """This step's per-layer attention metadata, or None in profile runs (caches not bound yet)."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return None
    md = get_forward_context().attn_metadata
    if isinstance(md, list):
        raise NotImplementedError("pipeline replication does not support micro-batching (DBO/ubatching)")
    return md if isinstance(md, dict) else None


def wrap_forward(upstream: Callable[..., Any]) -> Callable[..., Any]:
    """Binding `pp_forward`: apply the received payload first, append the outgoing one last; with DSpark on
    PP, also ship this stage's aux states and put the received ones first on the last stage (aux.py)."""

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = runtime_for(self) if _RUNTIMES else None  # no replicating stage in this process: upstream's
        relay = aux.active(self)
        if rt is None and not relay:
            return upstream(self, *args, **kwargs)
        if rt is None:
            call = partial(upstream, self, *args, **kwargs)
        else:
            call = partial(_forward_replicating, upstream, rt, self, *args, **kwargs)
        if not relay:
            return call()
        return aux.run(self, call, kwargs.get("intermediate_tensors", args[2] if len(args) > 2 else None))

    return forward


def _forward_replicating(upstream: Callable[..., Any], rt: StageRuntime, self: Any, input_ids: Any,
                         positions: torch.Tensor, intermediate_tensors: Any, inputs_embeds: Any = None,
                         lookback_token_ids: Any = None) -> Any:  # fmt: skip
    n = positions.shape[0]
    md = _step_metadata()
    context = self.layers[self.start_layer].attn._static_forward_context
    incoming = intermediate_tensors.tensors if intermediate_tensors is not None else None
    if input_ids is None and incoming is not None:
        # model runner V2 gives a later stage no input_ids (v1/worker/gpu/model_runner.py L1968-1971), and
        # V4.1 hashes Engram n-grams only when they are given (model.py L938-941): the first stage ships them
        input_ids = payload.received_ids(rt.plan, rt.rank, n, incoming)
    if md is not None and rt.stage.needs:
        payload.apply(rt.plan, rt.rank, n, rt.state(self, context, md), incoming or {})
    args = (input_ids, positions, intermediate_tensors, inputs_embeds, lookback_token_ids)
    out = upstream(self, *args)
    if rt.stage.sends and hasattr(out, "tensors"):
        if md is None:  # profile run: right shapes, no cache to read
            extra = payload.empty_payload(rt.plan, rt.rank + 1, n, positions.device)
        else:
            extra = payload.pack(rt.plan, rt.rank, n, rt.state(self, context, md, input_ids), incoming)
        out.tensors.update(extra)
    return out


def wrap_make_empty_intermediate_tensors(upstream: Callable[..., Any]) -> Callable[..., Any]:
    """Binding `pp_intermediate`: the receiving stage's buffers gain the payload keys."""

    def make_empty_intermediate_tensors(self: Any, batch_size: int, dtype: torch.dtype, device: Any) -> Any:
        out = upstream(self, batch_size, dtype, device)
        rt = runtime_for(self) if _RUNTIMES else None
        if rt is not None and rt.stage.receives:
            out.tensors.update(payload.empty_payload(rt.plan, rt.rank, batch_size, device))
        return out

    return make_empty_intermediate_tensors
