"""A pipeline stage's KV-cache tensors name only its own layers (binding row `pp_kv_groups`).

vLLM 0.32.0 builds one set of KV-cache groups for the whole model and projects it onto each PP stage
(`v1/core/kv_cache_utils.py` L2486-2528, `_project_kv_cache_groups_to_worker`). A group none of whose
layers is on the stage keeps the *global* `UniformTypeKVCacheSpecs`, whose per-layer map names the
other stages' layers. `get_kv_cache_config_from_groups` (L1646-1650) makes the stage's tensors from
that map, so the stage gets `KVCacheTensor`s for layers it does not hold, and the worker's
`allocate_kv_cache` (`v1/worker/utils.py` L601) looks each tensor's first layer up in the groups'
`layer_names` and raises a bare `StopIteration`. Every DeepSeek-V4.1 partition hits it: V4.1 has
several uniform groups (SWA, the ratio-2 and ratio-1 compressed caches, the indexer caches) and any cut
leaves some stage without a layer of one of them.

The fix: the tensors of a uniform group are made from the layers the projection kept
(`group.layer_names`), nothing else; an empty group yields no tensor, as upstream already does for a
group of one plain spec. The groups themselves (their number, order and specs) are returned as given:
the scheduler's block tables and the pool arithmetic (bytes per block, blocks per request) are the
same on every stage, as upstream intends. Where every uniform group already names exactly its layers
(PP = 1, or a stage holding a layer of each group), upstream's function runs with the arguments it got.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


def own_layers_only(group: Any) -> Any:
    """`group` with a uniform spec restricted to its own layer names (the group itself if it already is).

    A group left with no layer takes its first layer's plain spec: upstream's config builder makes no
    tensor for a plain-spec group without layers, and reads nothing else of it."""
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

    spec = group.kv_cache_spec
    if not isinstance(spec, UniformTypeKVCacheSpecs) or list(spec.kv_cache_specs) == list(group.layer_names):
        return group
    missing = [name for name in group.layer_names if name not in spec.kv_cache_specs]
    if missing:
        raise ValueError(f"KV-cache group names layers its spec does not hold: {missing}")
    if not group.layer_names:
        return dataclasses.replace(group, kv_cache_spec=spec.first_spec)
    own = {name: spec.kv_cache_specs[name] for name in group.layer_names}
    return dataclasses.replace(
        group, kv_cache_spec=UniformTypeKVCacheSpecs(block_size=spec.block_size, kv_cache_specs=own)
    )


def wrap_get_kv_cache_config_from_groups(upstream: Callable[..., Any]) -> Callable[..., Any]:
    """Binding `pp_kv_groups`: upstream's config builder on the stage's own layers; the groups returned
    as given."""

    def get_kv_cache_config_from_groups(
        vllm_config: Any, kv_cache_groups: list[Any], available_memory: int
    ) -> Any:
        own = [own_layers_only(g) for g in kv_cache_groups]
        if all(a is b for a, b in zip(own, kv_cache_groups, strict=True)):
            return upstream(vllm_config, kv_cache_groups, available_memory)
        config = upstream(vllm_config, own, available_memory)
        return dataclasses.replace(config, kv_cache_groups=list(kv_cache_groups))

    return get_kv_cache_config_from_groups
