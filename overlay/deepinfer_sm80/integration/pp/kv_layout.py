"""One KV-cache layout for pipeline stages with different attention backends (binding row `pp_kv_layout`).

vLLM 0.32.0's engine core resolves one layout for the whole model from the lists its workers report
(`v1/attention/backends/utils.py` `resolve_kv_cache_layout`, called from `v1/engine/core.py` L296) and
asserts that every worker reports the same list (utils.py L285). Within one worker, backends that declare
different lists are intersected (`get_supported_kv_cache_layouts`, L209-244). Pipeline stages run
different layers: a V4.1 stage that holds no indexer-K cache (owned or replica) has no
`DeepseekV4IndexerBackend`, which alone narrows the list to BLHNC, BLNHC (`mla/indexer.py` L347-351), so
its list is longer and start-up fails with "Workers disagree on supported KV cache layouts" (cuts 2,38,
3,5,32 and 5x8 of V4.1-Flash; a stage without a compressed layer). Every stage still allocates in the one
layout resolved, so the layout must be one every stage supports: this row intersects the workers' lists as
upstream intersects one worker's backends (most first choices wins, ties in the enum's order) and hands
upstream the agreed list; identical lists (every TP-only or single-stage engine) go to upstream as they
came. An empty intersection is one line naming each worker's list.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any


class LayoutDisagreement(ValueError):
    """No KV-cache layout is supported by every worker."""


def agree(supported: Sequence[Sequence[str]], order: Sequence[str]) -> list[str]:
    """The layouts every worker supports, the one most workers put first leading, ties in `order`.

    supported: each worker's names, most preferred first; order: every layout name in the enum's order."""
    if not supported or not all(supported):
        raise ValueError("every worker must report at least one KV-cache layout")
    common = set(supported[0]).intersection(*map(set, supported[1:]))
    if not common:
        lists = "; ".join(f"worker {i}: {', '.join(s)}" for i, s in enumerate(supported))
        raise LayoutDisagreement(f"no KV-cache layout is supported by every pipeline stage ({lists})")
    firsts = Counter(s[0] for s in supported)
    rank = {name: i for i, name in enumerate(order)}
    return sorted(common, key=lambda name: (-firsts[name], rank.get(name, len(rank))))


def wrap_resolve_kv_cache_layout(upstream: Callable[..., Any]) -> Callable[..., Any]:
    """Binding `pp_kv_layout`: the workers' lists agreed before upstream resolves the layout."""

    def resolve_kv_cache_layout(vllm_config: Any, supported_layouts: list[list[str]], *args: Any,
                                **kwargs: Any) -> Any:  # fmt: skip
        lists = [list(s) for s in supported_layouts]
        if len(lists) > 1 and all(lists) and any(s != lists[0] for s in lists[1:]):
            from vllm.v1.attention.backends.utils import KVCacheLayout

            merged = agree(lists, [layout.name for layout in KVCacheLayout])
            supported_layouts = [list(merged) for _ in lists]
        return upstream(vllm_config, supported_layouts, *args, **kwargs)

    return resolve_kv_cache_layout
