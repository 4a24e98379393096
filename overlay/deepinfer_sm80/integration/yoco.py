"""Shared-KV ("YOCO") prefill metadata of the SM8x attention layer, built once per key per step.

V4.1's layers reuse the compressed KV and the top-k of a few source layers (kv sources 2/8/14/20, index
sources 2/8/14/20/24/28/32/36; SWA-only layers 0, 1, 40-42). vLLM 0.32.0 memoizes only the decode top-k
ragged lists in the source (amd/rocm.py `_decode_topk_ragged`); every prefill layer rebuilds the same
`combine_topk_swa_indices` rows for its chunk. At the DeepInfer level (`feature_enabled("yoco_metadata")`):

- rows: the combined indices + lens of a chunk are built by the first layer of a key and read by the
  others. Key = (index source, compress ratio, chunk); ratio 0: (chunk). They live in a persistent buffer
  from the workspace manager's keyed resources (one per combined width, i.e. per ratio class, per
  ubatch/lane), never in its scratch, which MoE and the indexer take between layers. The buffer is
  reset exactly where upstream would rebuild: the index source layer running (as upstream's decode
  memo), or different step metadata (another SWA metadata object or batch shape, e.g. a new step, the
  decoder-replay batch, a drafter forward).
- compressed gather: the first layer's compressed-region gather into the scratch workspace is reused by
  the next layer of the same kv source only when that layer's own `get_simultaneous` is the only one
  since (the `workspace_generation` row counts them), the step has one chunk, the views are identical
  and no CUDA graph replays in the step (graph replays write scratch without calling Python). With an
  MoE between every pair of V4.1 layers this never holds on CUDA; docs/PATCH_01.md says why.

`open_prefill` returns a `PrefillShare` for one `_forward_prefill` call; with the feature off it is the
pass-through share, so the base level runs upstream's sequence of calls unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from deepinfer_sm80 import bindings

FEATURE = "yoco_metadata"
ROWS_KEY = "deepinfer_sm80.yoco.rows"
GATHER_KEY = "deepinfer_sm80.yoco.gather"
LOG = logging.getLogger("deepinfer_sm80")

Chunk = tuple[int, int, int, int]  # (start, end, chunk_N, chunk_M) of the SWA metadata's chunk plan

# Scratch hand-outs by every WorkspaceManager (all lanes and ubatches): bumped by the wrapped
# get_simultaneous of the `workspace_generation` binding row.
_generation = 0
STATS = {"rows_built": 0, "rows_reused": 0, "gather_reused": 0}  # process totals, for logs and tests


# ----------------------------------------------------------------------------- the workspace row
def count_get_simultaneous(upstream: Callable[..., list[torch.Tensor]]) -> Callable[..., list[torch.Tensor]]:
    """Factory of the `workspace_generation` row: `WorkspaceManager.get_simultaneous`, counted."""

    def get_simultaneous(self: Any, *shapes_and_dtypes: tuple[tuple[int, ...], torch.dtype]) -> Any:
        global _generation
        _generation += 1
        return upstream(self, *shapes_and_dtypes)

    get_simultaneous.__doc__ = upstream.__doc__
    get_simultaneous.deepinfer_wraps = upstream  # type: ignore[attr-defined]
    get_simultaneous.deepinfer_counts = True  # type: ignore[attr-defined]
    return get_simultaneous


def generation() -> int:
    return _generation


def workspace_counted(manager: Any) -> bool:
    """True when `manager.get_simultaneous` goes through the counting wrapper (the row is bound)."""
    method = getattr(type(manager), "get_simultaneous", None)
    return bool(getattr(method, "deepinfer_counts", False))


def eager_step() -> bool:
    """True when no CUDA graph runs in this forward (a replayed graph writes scratch silently)."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return False
    return get_forward_context().cudagraph_runtime_mode == CUDAGraphMode.NONE


# ----------------------------------------------------------------------------- persistent state
@dataclass
class SharedRows:
    """Combined rows of one key for the whole step: chunk c writes prefill tokens [q0, q1)."""

    indices: torch.Tensor  # [max_tokens, width] int32
    lens: torch.Tensor  # [max_tokens] int32
    swa: Any = None  # the SWA metadata object the rows were built from (held, so its id stays unique)
    stamp: Hashable = None
    built: set[Chunk] = field(default_factory=set)

    def reset(self, swa: Any, stamp: Hashable) -> None:
        self.swa, self.stamp, self.built = swa, stamp, set()


@dataclass
class GatherRecord:
    key: Hashable
    refs: tuple[Any, ...]  # metadata objects the gather read (held, compared by identity)
    gen: int


@dataclass
class GatherState:
    record: GatherRecord | None = None


_warned: set[str] = set()


def _resource(manager: Any, key: Hashable, factory: Callable[[], Any]) -> Any:
    """A keyed resource of the manager's current ubatch/lane; None if the manager cannot give one."""
    try:
        return manager.get_persistent_resource(key, factory)
    except (AssertionError, AttributeError) as exc:  # locked before the dummy run reserved it
        if str(key) not in _warned:
            _warned.add(str(key))
            LOG.warning("DeepInfer-SM80 yoco_metadata off for %s: %s", key, exc)
        return None


def _rows(manager: Any, max_tokens: int, width: int, device: torch.device) -> SharedRows | None:
    def factory() -> SharedRows:
        return SharedRows(
            torch.empty((max_tokens, width), dtype=torch.int32, device=device),
            torch.empty((max_tokens,), dtype=torch.int32, device=device),
        )

    return _resource(manager, (ROWS_KEY, max_tokens, width, str(device)), factory)


def _gather_state(manager: Any) -> GatherState | None:
    return _resource(manager, (GATHER_KEY,), GatherState)


def rows_bytes(max_tokens: int, width: int) -> int:
    """Device bytes of one SharedRows buffer (per ubatch/lane)."""
    return max_tokens * (width + 1) * 4


def reserve(layer: Any, width: int, manager: Any) -> None:
    """Dummy (profile) run: take the persistent buffers now, so memory profiling counts them and the
    manager's lock (after warm-up) finds them."""
    if not bindings.feature_enabled(FEATURE) or layer.topk_indices_buffer is None:
        return  # (no top-k buffer: the layer's prefill asserts one, so it never shares rows either)
    device = layer.topk_indices_buffer.device
    _rows(manager, layer.max_num_batched_tokens, width, device)
    if layer.compress_ratio > 0:
        _gather_state(manager)


# ----------------------------------------------------------------------------- per prefill call
def _fingerprint(swa: Any) -> tuple[Any, ...]:
    """Host-side batch shape of the metadata: catches a metadata object refilled in place."""
    qsl, seq = swa.query_start_loc_cpu, swa.prefill_seq_lens_cpu
    return (
        swa.num_decodes, swa.num_prefills, swa.num_decode_tokens, swa.num_prefill_tokens,
        None if qsl is None else tuple(qsl.tolist()),
        None if seq is None else tuple(seq.tolist()),
    )  # fmt: skip


class PrefillShare:
    """The pass-through share: upstream's calls, one per layer (base level, or the feature disabled)."""

    def compressed_gathered(self, kv: torch.Tensor, chunk: Chunk) -> bool:
        """True if `kv`'s compressed region already holds this chunk's gather (skip the gather)."""
        return False

    def combine(
        self, fn: Callable[..., Any], chunk: Chunk, q0: int, q1: int, *args: Any, out: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`fn(*args, out=out)`, or the rows an earlier layer of the same key built for this chunk."""
        return fn(*args, out=out)


PASS_THROUGH = PrefillShare()


class SharedPrefill(PrefillShare):
    def __init__(
        self,
        rows: SharedRows | None,
        gather: GatherState | None,
        gather_key: Hashable,
        refs: tuple[Any, ...],
        is_kv_source: bool = False,
    ) -> None:
        self.rows, self.gather, self.gather_key, self.refs = rows, gather, gather_key, refs
        self.is_kv_source = is_kv_source  # its compressor has just written the cache: always gathers
        self.pending: tuple[Chunk, GatherRecord] | None = None

    def compressed_gathered(self, kv: torch.Tensor, chunk: Chunk) -> bool:
        if self.gather is None:
            return False
        key = (self.gather_key, chunk, kv.data_ptr(), tuple(kv.shape), tuple(kv.stride()), kv.dtype)
        now = _generation
        rec = self.gather.record
        same = (
            rec is not None
            and rec.key == key
            and all(a is b for a, b in zip(rec.refs, self.refs, strict=True))
        )
        if same and rec is not None and now == rec.gen + 1 and not self.is_kv_source:  # only our hand-out
            rec.gen = now
            STATS["gather_reused"] += 1
            return True
        self.pending = (chunk, GatherRecord(key, self.refs, now))
        return False

    def combine(
        self, fn: Callable[..., Any], chunk: Chunk, q0: int, q1: int, *args: Any, out: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pending is not None and self.pending[0] == chunk and self.gather is not None:
            self.gather.record = self.pending[1]  # the gather was issued: publish it
            self.pending = None
        rows = self.rows
        if rows is None or q1 > rows.lens.shape[0]:
            return fn(*args, out=out)
        indices, lens = rows.indices[q0:q1], rows.lens[q0:q1]
        if chunk in rows.built:
            STATS["rows_reused"] += 1
            return indices, lens
        fn(*args, out=(indices, lens))
        rows.built.add(chunk)
        STATS["rows_built"] += 1
        return indices, lens


def open_prefill(
    layer: Any,
    swa: Any,
    cmeta: Any,
    compressed: torch.Tensor | None,
    plan: list[Chunk],
    top_k: int,
    width: int,
    manager: Any,
) -> PrefillShare:
    """The share for one `_forward_prefill` call of `layer` (a DeepseekV4Attention)."""
    if not bindings.feature_enabled(FEATURE):
        return PASS_THROUGH
    ratio = layer.compress_ratio
    topk_buffer = layer.topk_indices_buffer
    rows = _rows(manager, layer.max_num_batched_tokens, width, topk_buffer.device)
    if rows is not None:
        owner = layer.index_source_layer_id if ratio > 0 else None
        stamp = (owner, ratio, top_k, layer.window_size, width, topk_buffer.data_ptr(), _fingerprint(swa))
        is_source = ratio > 0 and getattr(layer, "is_index_source", False)
        if is_source or rows.swa is not swa or rows.stamp != stamp:
            rows.reset(swa, stamp)  # fresh top-k (the source ran) or other step metadata: rebuild
    gather = None
    gather_key: Hashable = None
    if compressed is not None and len(plan) == 1 and workspace_counted(manager) and eager_step():
        gather = _gather_state(manager)
        gather_key = (
            layer.compressed_cache_prefix, ratio, compressed.data_ptr(), tuple(compressed.shape),
        )  # fmt: skip
    return SharedPrefill(rows, gather, gather_key, (swa, cmeta), bool(getattr(layer, "is_kv_source", False)))
