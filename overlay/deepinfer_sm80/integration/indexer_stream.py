"""The DeepInfer level of the lightning indexer: upstream's flow with the streamed top-k (docs/INDEXER.md).

Binding row `indexer_stream` wraps `SparseAttnIndexer.forward_cuda`. Upstream's `sparse_attn_indexer`
is registered as the custom op `vllm::sparse_attn_indexer` while its module executes, so the hook at
the end of that module cannot reach the registered function; `forward_cuda` is the one place that
builds the op's arguments from the layer, and every dispatch path of the layer (CustomOp's bound
`_forward_method`, `forward_native`, `forward_xpu`) looks it up on the class after the hook has run.

The wrapper hands the same arguments to `sparse_attn_indexer_stream`, which keeps upstream's flow
(profile run, dense-MHA early return, the -1 clear of the buffer, the prefill K gather into upstream's
workspace, the prefill chunks and the decode rows) and replaces each logits -> candidates -> top-k
sequence with one call of `indexer_topk_prefill` / `indexer_topk_decode`. The result in
`topk_indices_buffer` (and, for the candidate source, in `candidate_blocks`) is what upstream's flow
writes: request-local columns, -1 padded; sets equal, order best first, ties to the lowest column.

Where the streamed path does not apply, upstream's own op runs unchanged (`fallback_reason`): traced by
torch.compile, MXFP4 cache, unfused K insert, context parallel, profile runs, padded decode, decode
without tokens. attention.py's short-context shortcut runs
before the layer is called and is not touched.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

import torch

from deepinfer_sm80.ops.indexer import stream

LOG = logging.getLogger("deepinfer_sm80")
UPSTREAM_MODULE = "vllm.model_executor.layers.sparse_attn_indexer"
# Read at call time; tests shrink them so one call streams several key chunks and row blocks.
WORKSPACE_BYTES = stream.WORKSPACE_BYTES
PREFILL_CHUNK_MAX = stream.CHUNK_MAX
_NOTED: set[str] = set()


def _note(reason: str) -> None:
    if reason not in _NOTED:
        _NOTED.add(reason)
        LOG.info("DeepInfer-SM80 indexer_stream: upstream's sparse_attn_indexer runs here: %s", reason)


def _upstream_op() -> Callable[..., torch.Tensor]:
    """Upstream's op function (looked up at call time: the hook runs while its module executes)."""
    return importlib.import_module(UPSTREAM_MODULE).sparse_attn_indexer


# ----------------------------------------------------------------------------- when upstream runs
def static_reason(layer: Any, q_quant: Any) -> str | None:
    """Why this layer's call stays upstream's, from the layer alone (None: the streamed path applies)."""
    if torch.compiler.is_compiling():
        return "traced by torch.compile (vllm::sparse_attn_indexer must stay a splitting op in the graph)"
    if isinstance(q_quant, tuple) or layer.use_fp4_cache:
        return "MXFP4 indexer cache (the streamed kernels read the FP8 132-byte record)"
    if not layer.skip_k_cache_insert:
        return "the layer inserts K itself (V4.1 writes K before the call)"
    if layer.use_pcp or layer.dcp_world_size > 1:
        return "context parallel (the DCP merge and the PCP gather work on upstream's logits)"
    return None


def fallback_reason(metadata: Any) -> str | None:
    """Why this step stays upstream's, from host-side metadata only (no device sync)."""
    if metadata.num_decodes > 0:
        decode = metadata.decode
        tokens = metadata.num_decode_tokens
        if tokens == 0:
            return "decode metadata without decode tokens"
        if decode.requires_padding or tokens % decode.decode_lens.shape[0]:
            return "padded decode (non-uniform native next_n rows go through pack/unpack)"
        if decode.global_seq_lens is not None:
            return "DCP decode lengths"
    return None


def _dense_mha_takes_this_batch(forward_context: Any, attn_metadata: dict, layer_name: Any) -> bool:
    """Upstream returns the buffer untouched when the main MLA runs this batch as dense MHA."""
    from vllm.config import CUDAGraphMode
    from vllm.utils.torch_utils import _resolve_layer_name

    if forward_context.cudagraph_runtime_mode == CUDAGraphMode.FULL:
        return False
    name = _resolve_layer_name(layer_name)
    if not name:
        return False
    mla = attn_metadata.get(name)
    return bool(
        getattr(getattr(mla, "prefill", None), "use_dense_mha", False)
        and getattr(mla, "num_decode_tokens", -1) == 0
        and not torch.cuda.is_current_stream_capturing()
    )


# ----------------------------------------------------------------------------- the op, streamed
def sparse_attn_indexer_stream(
    hidden_states: torch.Tensor,
    k_cache_prefix: Any,
    kv_cache: torch.Tensor,
    q_quant: torch.Tensor,
    q_scale: torch.Tensor | None,
    k: torch.Tensor | None,
    weights: torch.Tensor,
    quant_block_size: int,
    scale_fmt: str | None,
    topk_tokens: int,
    head_dim: int,
    max_model_len: int,
    total_seq_lens: int,
    topk_indices_buffer: torch.Tensor,
    skip_k_cache_insert: bool,
    use_pcp: bool,
    pcp_shard_decode_requests: bool,
    dense_mha_metadata_layer_name: Any,
    use_fp4_cache: bool = False,
    dcp_rank: int = 0,
    dcp_world_size: int = 1,
    cp_kv_cache_interleave_size: int = 1,
    skip_topk_buffer_clear: bool = False,
    candidate_blocks: torch.Tensor | None = None,
    candidate_block_size: int = 0,
    candidate_write: bool = False,
    topk_backend: str = "auto",
) -> torch.Tensor:
    """Upstream's `sparse_attn_indexer` (same parameters, same writes), logits streamed into the top-k."""
    args = dict(locals())  # first: upstream's op gets exactly these when it runs instead
    from vllm.forward_context import get_forward_context
    from vllm.utils.torch_utils import _resolve_layer_name

    forward_context = get_forward_context()
    attn_metadata = forward_context.attn_metadata
    reason = "profile or dummy run (upstream reserves its workspace)"
    if isinstance(attn_metadata, dict):
        metadata = attn_metadata[_resolve_layer_name(k_cache_prefix)]
        reason = fallback_reason(metadata)
    if reason is not None:
        _note(reason)
        return _upstream_op()(**args)
    if _dense_mha_takes_this_batch(forward_context, attn_metadata, dense_mha_metadata_layer_name):
        return topk_indices_buffer
    if not skip_topk_buffer_clear:
        topk_indices_buffer[: hidden_states.shape[0]] = -1
    kw = {
        "candidate_block_size": candidate_block_size,
        "candidate_write": candidate_write,
        "workspace_bytes": WORKSPACE_BYTES,
    }
    if metadata.num_prefills > 0:
        _prefill(
            metadata,
            kv_cache,
            q_quant,
            weights,
            topk_indices_buffer,
            topk_tokens,
            head_dim,
            total_seq_lens,
            candidate_blocks,
            kw,
        )
    if metadata.num_decodes > 0:
        _decode(
            metadata,
            kv_cache,
            q_quant,
            weights,
            topk_indices_buffer,
            topk_tokens,
            head_dim,
            max_model_len,
            candidate_blocks,
            kw,
        )
    return topk_indices_buffer


def _prefill(
    metadata: Any,
    kv_cache: torch.Tensor,
    q_quant: torch.Tensor,
    weights: torch.Tensor,
    topk_indices_buffer: torch.Tensor,
    topk_tokens: int,
    head_dim: int,
    total_seq_lens: int,
    candidate_blocks: torch.Tensor | None,
    kw: dict[str, Any],
) -> None:
    """Each chunk: upstream's K gather into upstream's workspace, then one streamed top-k of its rows."""
    from vllm import _custom_ops as ops
    from vllm.platforms import current_platform
    from vllm.v1.worker.workspace import current_workspace_manager

    upstream = importlib.import_module(UPSTREAM_MODULE)
    values_spec, scales_spec = upstream._gather_workspace_shapes(
        total_seq_lens, head_dim, current_platform.fp8_dtype(), False
    )
    k_full, scale_full = current_workspace_manager().get_simultaneous(values_spec, scales_spec)
    # TP > 1: each rank scores its own row window and the ranks exchange the final indices, as upstream
    # (candidate rows stay replicated)
    row_shard = None
    if candidate_blocks is None:
        row_shard = upstream.PrefillRowShard.from_metadata(metadata.prefill, metadata.num_decode_tokens)
    for chunk in metadata.prefill.chunks:
        k8 = k_full[: chunk.max_local_total_seq_lens]  # [N, 128] e4m3
        k_scale = scale_full[: chunk.max_local_total_seq_lens]  # [N, 4] bytes of one fp32
        if not chunk.skip_kv_gather and chunk.local_total_seq_lens > 0:
            ops.cp_gather_indexer_k_quant_cache(
                kv_cache, k8, k_scale, chunk.block_table, chunk.local_cu_seq_lens
            )
        start, end, ks, ke = chunk.token_start, chunk.token_end, chunk.cu_seqlen_ks, chunk.cu_seqlen_ke
        if row_shard is not None:
            narrowed = row_shard.narrow(chunk)
            if narrowed is None:
                continue
            start, end, ks, ke = narrowed
        out = topk_indices_buffer[start:end, :topk_tokens]
        if chunk.local_total_seq_lens == 0 or out.shape[0] == 0:
            out.fill_(-1)
            continue
        stream.indexer_topk_prefill(
            q_quant[start:end],
            weights[start:end],
            k8,
            k_scale.view(torch.float32).squeeze(-1),
            ks,
            ke,
            out,
            candidate_blocks=candidate_blocks[start:end] if candidate_blocks is not None else None,
            chunk_max=PREFILL_CHUNK_MAX,
            **kw,
        )
    if row_shard is not None:
        row_shard.exchange_topk(topk_indices_buffer, topk_tokens)


def _decode(
    metadata: Any,
    kv_cache: torch.Tensor,
    q_quant: torch.Tensor,
    weights: torch.Tensor,
    topk_indices_buffer: torch.Tensor,
    topk_tokens: int,
    head_dim: int,
    max_model_len: int,
    candidate_blocks: torch.Tensor | None,
    kw: dict[str, Any],
) -> None:
    """The decode rows (uniform next_n; SM8x flattens DSpark's 1+5 to next_n = 1): no host sync, shapes
    from the batch and max_model_len only, so the call is captured in the decode CUDA graph."""
    upstream = importlib.import_module(UPSTREAM_MODULE)
    decode = metadata.decode
    tokens = metadata.num_decode_tokens
    batch = decode.decode_lens.shape[0]
    q = q_quant[:tokens].reshape(batch, tokens // batch, *q_quant.shape[1:])  # [B, next_n, H, 128]
    out = topk_indices_buffer[:tokens, :topk_tokens]
    stream.indexer_topk_decode(
        q,
        weights[:tokens],
        upstream.kv_cache_as_quant_view(kv_cache, head_dim, False),
        decode.seq_lens[:batch],
        decode.block_table,
        max_model_len,
        out,
        candidate_blocks=candidate_blocks[:tokens] if candidate_blocks is not None else None,
        indices=decode.indices,
        **kw,
    )


# ----------------------------------------------------------------------------- the row's factory
def wrap_forward_cuda(upstream_forward_cuda: Callable[..., Any]) -> Callable[..., Any]:
    """Row `indexer_stream`: `SparseAttnIndexer.forward_cuda` calling the streamed op where it applies."""
    from vllm.compilation.breakable_cudagraph import eager_break_during_capture
    from vllm.utils.torch_utils import _encode_layer_name

    op = eager_break_during_capture(sparse_attn_indexer_stream)  # as upstream's op function

    def forward_cuda(
        self: Any,
        hidden_states: torch.Tensor,
        q_quant: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        k: torch.Tensor | None,
        weights: torch.Tensor,
    ) -> torch.Tensor:
        reason = static_reason(self, q_quant)
        if reason is not None:
            _note(reason)
            return upstream_forward_cuda(self, hidden_states, q_quant, k, weights)
        return op(
            hidden_states,
            _encode_layer_name(self.k_cache.prefix),
            self.k_cache.kv_cache,
            q_quant,
            None,
            k,
            weights,
            self.quant_block_size,
            self.scale_fmt,
            self.topk_tokens,
            self.head_dim,
            self.max_model_len,
            self.max_total_seq_len,
            self.topk_indices_buffer,
            self.skip_k_cache_insert,
            self.use_pcp,
            self.pcp_shard_decode_requests,
            _encode_layer_name(self.dense_mha_metadata_layer_name),
            self.use_fp4_cache,
            self.dcp_rank,
            self.dcp_world_size,
            self.cp_kv_cache_interleave_size,
            False,
            candidate_blocks=self.candidate_blocks,
            candidate_block_size=self.candidate_block_size,
            candidate_write=self.candidate_write,
            topk_backend=self.topk_backend,
        )

    forward_cuda.__qualname__ = "SparseAttnIndexer.forward_cuda"
    forward_cuda.__doc__ = "DeepInfer level: upstream's flow, streamed top-k (integration.indexer_stream)."
    forward_cuda.deepinfer_wraps = upstream_forward_cuda  # type: ignore[attr-defined]
    return forward_cuda
