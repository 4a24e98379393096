"""The SM8x attention layer of DeepSeek-V4.1 (vLLM 0.32.0): Triton sparse MLA instead of FlashMLA.

`DeepinferSM8xAttention` is a `DeepseekV4Attention` (upstream's layer: projections, KV inserts,
compressor, indexer, caches and their specs are all upstream's) that supplies the four pieces a
platform subclass owns: the backend, the head padding (none), `forward_mqa` and `_o_proj`. Written for
this project after the structure of upstream's ROCm layer (amd/rocm.py), without importing it (its
module imports `vllm.platforms.rocm`) and without its gfx9 branches:

- decode: `rocm_sparse_attn_decode` over the layer's SWA cache and the kv source's compressed cache,
  with the dense global top-k slots of `compute_global_topk_indices_and_lens` (FlashMLA's own
  metadata); its epilogue applies the inverse RoPE to every decode row it returns;
- prefill: upstream's gather + `combine_topk_swa_indices` into the same workspace FlashMLA uses, then
  `rocm_sparse_attn_prefill`; prefill rows get the inverse RoPE from upstream's Triton rows kernel;
- o_proj: `wo_a` is dequantized to bf16 when the weights load (instead of Marlin's int32 repack, which
  no bf16 path can read) and applied as a grouped bf16 bmm, then upstream's `wo_b`.

The sparse-MLA entry points are looked up through upstream's module, whose binding rows replace them
with the overlay's kernels on SM8x. `select_attn_cls` is the factory of the `_select_dsv4_attn_cls`
row (integration/attention_select.py: nvidia/model.py), which the DSpark draft layers reuse too.
"""

from __future__ import annotations

import logging
import types
from typing import Any, cast

import torch
from vllm.forward_context import get_forward_context
from vllm.models.deepseek_v41.attention import DeepseekV4Attention
from vllm.models.deepseek_v41.common.ops import (
    combine_topk_swa_indices,
    compute_global_topk_indices_and_lens,
    dequantize_and_gather_k_cache,
)
from vllm.models.deepseek_v41.sparse_mla import (
    DeepseekV4FlashMLAMetadata,
    DeepseekV4SparseMLABackend,
    DeepseekV4SparseMLAMetadataBuilder,
    DeepseekV41SparseSWAMetadataBuilder,
)
from vllm.platforms.interface import DeviceCapability
from vllm.utils.math_utils import round_up
from vllm.v1.attention.backend import MultipleOf
from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWABackend, DeepseekSparseSWAMetadata
from vllm.v1.attention.ops import rocm_aiter_mla_sparse as sparse_ops
from vllm.v1.worker.workspace import current_workspace_manager

from deepinfer_sm80.integration import warmup, yoco
from deepinfer_sm80.integration.sm8x_backend import BACKEND_NAME
from deepinfer_sm80.ops.o_proj import dequant_block_fp8, wo_a_bmm

LOG = logging.getLogger("deepinfer_sm80")


class DeepinferSM8xSparseMLABackend(DeepseekV4SparseMLABackend):
    """Compressed-KV backend of the SM8x layer: upstream's V4.1 metadata builder, 128-token blocks."""

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[int | MultipleOf]:
        return [64, 128]

    @staticmethod
    def get_builder_cls() -> type[DeepseekV4SparseMLAMetadataBuilder]:
        return DeepseekV4SparseMLAMetadataBuilder

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        return capability.major == 8


class DeepinferSM8xSWAMetadataBuilder(DeepseekV41SparseSWAMetadataBuilder):
    """Upstream's V4.1 SWA metadata, without FlashMLA's tile-scheduler plans (nothing here reads them)."""

    def build_tile_scheduler(self, num_decode_tokens: int) -> dict[str, Any]:
        return super().build_tile_scheduler(0)  # the all-None plan upstream returns for no decodes


class DeepinferSM8xSWABackend(DeepseekSparseSWABackend):
    @staticmethod
    def get_builder_cls() -> type[DeepinferSM8xSWAMetadataBuilder]:
        return DeepinferSM8xSWAMetadataBuilder


def keep_bf16_wo_a(wo_a: torch.nn.Module) -> None:
    """Make `wo_a`'s quant method dequantize its FP8 weight to bf16 at load time instead of repacking it.

    Only this module's call is intercepted (a quant-method object shared with other layers keeps its
    behaviour for them). The block scales stay on the module; the FP8 weight is replaced, not kept.
    """
    method = getattr(wo_a, "quant_method", None)
    if method is None:
        return
    upstream = method.process_weights_after_loading

    def process_weights_after_loading(self: Any, layer: torch.nn.Module) -> None:
        if layer is not wo_a:
            upstream(layer)
            return
        weight = layer.weight
        if weight.element_size() != 1:  # unquantized checkpoint: already a bf16 (or fp32) weight
            upstream(layer)
            return
        scale = getattr(layer, "weight_scale_inv", None)
        if scale is None:
            scale = layer.weight_scale
        bf16 = dequant_block_fp8(weight.data, scale.data)
        layer.weight = torch.nn.Parameter(bf16, requires_grad=False)
        layer.deepinfer_bf16_wo_a = True

    method.process_weights_after_loading = types.MethodType(process_weights_after_loading, method)


def without_bounded_replay(vllm_config: Any) -> bool:
    """Turn SWA bounded replay off (returns whether it was on), as upstream does on ROCm.

    With replay, prefill rows below `replay_start` have no window KV; FlashMLA's and FlashInfer's prefill
    kernels clamp the window to it, the Triton sparse-MLA prefill does not (upstream's ROCm layer turns
    replay off for the same reason, attention.py:548). Every V4.1 layer reads the flag in __init__, and
    the model enables replay only if the layers' SWA caches say so (nvidia/model.py:809).
    """
    cache_config = vllm_config.cache_config
    if not cache_config.swa_bounded_replay:
        return False
    cache_config.swa_bounded_replay = False
    LOG.warning(
        "DeepInfer-SM80: SWA bounded replay is off on SM8x (the Triton sparse-MLA prefill does not clamp "
        "the window to replay_start); the sliding-window cache takes part in prefix caching instead"
    )
    return True


class DeepinferSM8xAttention(DeepseekV4Attention):
    """DeepSeek-V4.1 attention on SM80/SM86 (see the module docstring)."""

    backend_cls = DeepinferSM8xSparseMLABackend
    swa_backend_cls = DeepinferSM8xSWABackend

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        without_bounded_replay(args[0] if args else kwargs["vllm_config"])
        super().__init__(*args, **kwargs)
        # no BMM linear kernel for wo_a: its weight becomes bf16 at load time (keep_bf16_wo_a)
        self.wo_a.is_bmm = False
        keep_bf16_wo_a(self.wo_a)
        warmup.register_layer(self, args[0] if args else kwargs["vllm_config"])  # optimized level (issue 16)

    @classmethod
    def get_padded_num_q_heads(cls, num_heads: int) -> int:
        return num_heads  # the Triton kernels tile heads by 16 and mask the rest: no padding to 64

    # ------------------------------------------------------------------ o_proj
    def _o_proj(self, attn_out: Any, positions: torch.Tensor) -> torch.Tensor:
        o = attn_out[:, : self.n_local_heads, :]  # rows already inverse-RoPE'd in forward_mqa
        if self.wo_a.weight.dtype != torch.bfloat16:
            raise RuntimeError(
                f"{self.prefix}.wo_a holds {self.wo_a.weight.dtype}; the SM8x o_proj needs the bf16 copy "
                "made at load time (keep_bf16_wo_a)"
            )
        z = wo_a_bmm(o, self.wo_a.weight, self.n_local_groups)  # [T, G, 1024]
        return self._wo_b_proj(z.flatten(1))

    # ------------------------------------------------------------------ attention
    def _reserve_workspace(self, q: torch.Tensor) -> None:
        """The dummy run (no metadata): reserve what _forward_prefill takes, as FlashMLA's layer does."""
        swa_only = self.compress_ratio == 0
        n = 0 if swa_only else (self.max_model_len + self.compress_ratio - 1) // self.compress_ratio
        m = n + self.window_size + self.max_num_batched_tokens
        top_k = 0 if swa_only else cast(torch.Tensor, self.topk_indices_buffer).shape[-1]
        combined = round_up(top_k + self.window_size, 128)
        current_workspace_manager().get_simultaneous(
            ((self.PREFILL_CHUNK_SIZE, m, q.shape[-1]), torch.bfloat16),
            ((self.max_num_batched_tokens, combined), torch.int32),
            ((self.max_num_batched_tokens,), torch.int32),
        )
        yoco.reserve(self, combined, current_workspace_manager())  # shared-KV rows (issue 16)

    def forward_mqa(
        self, q: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor, output: torch.Tensor
    ) -> None:
        if output.shape != q.shape or output.dtype != q.dtype:
            raise ValueError(
                f"output {tuple(output.shape)} {output.dtype} must match q {tuple(q.shape)} {q.dtype}"
            )
        attn_metadata = get_forward_context().attn_metadata
        if attn_metadata is None:
            self._reserve_workspace(q)
            output.zero_()
            return
        assert isinstance(attn_metadata, dict)
        cmeta = cast(
            "DeepseekV4FlashMLAMetadata | None",
            attn_metadata.get(self.compressed_cache_prefix)
            if self.compressed_cache_prefix is not None
            else None,
        )
        swa = cast(DeepseekSparseSWAMetadata, attn_metadata.get(self.swa_cache_layer.prefix))
        swa_only = self.compress_ratio == 0
        compressed = None if swa_only else self._compressed_kv_cache()
        nd = swa.num_decode_tokens
        if swa.num_prefills > 0:
            self._forward_prefill(q[nd:], compressed, output[nd:], cmeta, swa)
        rotated = 0
        if swa.num_decodes > 0:
            rotated = self._forward_decode(q[:nd], positions[:nd], compressed, output[:nd], cmeta, swa)
        # rows the decode epilogue did not rotate (all prefill rows) owe the inverse RoPE; do it here,
        # in the eager segment, as the ROCm layer does (the split is batch-dependent)
        sparse_ops.rocm_inverse_rope_rows_(
            output[rotated:, : self.n_local_heads, :],
            positions[rotated:],
            self.rotary_emb.cos_sin_cache,
            self.rope_head_dim,
        )

    def _forward_decode(
        self,
        q: torch.Tensor,
        positions: torch.Tensor,
        compressed: torch.Tensor | None,
        output: torch.Tensor,
        cmeta: DeepseekV4FlashMLAMetadata | None,
        swa: DeepseekSparseSWAMetadata,
    ) -> int:
        nd = swa.num_decode_tokens
        topk_indices = topk_lens = None
        if compressed is not None:
            assert (
                cmeta is not None and swa.is_valid_token is not None and self.topk_indices_buffer is not None
            )
            topk_indices, topk_lens = compute_global_topk_indices_and_lens(
                self.topk_indices_buffer[:nd],
                swa.token_to_req_indices,
                cmeta.block_table[: swa.num_decodes],
                cmeta.block_size // self.compress_ratio,
                swa.is_valid_token[:nd],
            )
        return sparse_ops.rocm_sparse_attn_decode(
            q=q,
            kv_cache=compressed,
            swa_k_cache=self.swa_cache_layer.kv_cache,
            swa_only=compressed is None,
            topk_indices=topk_indices,
            topk_lens=topk_lens,
            swa_indices=swa.decode_swa_indices,
            swa_lens=swa.decode_swa_lens,
            swa_ragged_indices=None,
            swa_ragged_indptr=None,
            topk_ragged_indices=None,
            topk_ragged_indptr=None,
            attn_sink=self.attn_sink,
            scale=self.scale,
            head_dim=self.head_dim,
            nope_head_dim=self.nope_head_dim,
            rope_head_dim=self.rope_head_dim,
            output=output,
            inv_rope_positions=positions,
            inv_rope_cos_sin_cache=self.rotary_emb.cos_sin_cache,
        )

    def _forward_prefill(
        self,
        q: torch.Tensor,
        compressed: torch.Tensor | None,
        output: torch.Tensor,
        cmeta: DeepseekV4FlashMLAMetadata | None,
        swa: DeepseekSparseSWAMetadata,
    ) -> None:
        swa_only = compressed is None
        nd, n_dec = swa.num_decode_tokens, swa.num_decodes
        seq_lens, gather_lens = swa.prefill_seq_lens, swa.prefill_gather_lens
        qsl_cpu, qsl = swa.query_start_loc_cpu, swa.query_start_loc
        assert seq_lens is not None and gather_lens is not None and qsl_cpu is not None and qsl is not None
        assert self.topk_indices_buffer is not None
        base = qsl_cpu[n_dec]
        topk_indices = self.topk_indices_buffer[nd:][: swa.num_prefill_tokens]
        top_k = 0 if swa_only else topk_indices.shape[-1]
        plan = swa.get_prefill_chunk_plan(
            compress_ratio=self.compress_ratio,
            prefill_chunk_size=self.PREFILL_CHUNK_SIZE,
            has_compressed=not swa_only,
        )
        combined_width = round_up(top_k + self.window_size, 128)
        share = yoco.open_prefill(  # shared-KV metadata, built once per key (issue 16; pass-through at base)
            self, swa, cmeta, compressed, plan, top_k, combined_width, current_workspace_manager()
        )
        for start, end, chunk_n, chunk_m in plan:
            size = end - start
            kv, idx_out, len_out = current_workspace_manager().get_simultaneous(
                ((size, chunk_m, q.shape[-1]), torch.bfloat16),
                ((self.max_num_batched_tokens, combined_width), torch.int32),
                ((self.max_num_batched_tokens,), torch.int32),
            )
            if not swa_only and not share.compressed_gathered(kv, (start, end, chunk_n, chunk_m)):
                assert cmeta is not None
                dequantize_and_gather_k_cache(
                    kv[:size],
                    compressed,
                    seq_lens=seq_lens[start:end] // self.compress_ratio,
                    gather_lens=None,
                    block_table=cmeta.block_table[n_dec:][start:end],
                    block_size=cmeta.block_size // self.compress_ratio,
                    offset=0,
                )
            dequantize_and_gather_k_cache(
                kv[:size],
                self.swa_cache_layer.kv_cache,
                seq_lens=seq_lens[start:end],
                gather_lens=gather_lens[start:end],
                block_table=swa.block_table[n_dec:][start:end],
                block_size=swa.block_size,
                offset=chunk_n,
            )
            q0, q1 = int(qsl_cpu[n_dec + start] - base), int(qsl_cpu[n_dec + end] - base)
            indices, lens = share.combine(
                combine_topk_swa_indices,
                (start, end, chunk_n, chunk_m),
                q0,
                q1,
                topk_indices[q0:q1],
                qsl[n_dec + start : n_dec + end + 1],
                seq_lens[start:end],
                gather_lens[start:end],
                self.window_size,
                self.compress_ratio,
                top_k,
                chunk_m,
                chunk_n,
                out=(idx_out[: q1 - q0], len_out[: q1 - q0]),
            )
            sparse_ops.rocm_sparse_attn_prefill(
                q=q[q0:q1],
                kv=kv.view(-1, 1, q.shape[-1]),
                indices=indices,
                topk_length=lens,
                scale=self.scale,
                head_dim=self.head_dim,
                nope_head_dim=self.nope_head_dim,
                rope_head_dim=self.rope_head_dim,
                attn_sink=self.attn_sink,
                output=output[q0:q1],
            )
