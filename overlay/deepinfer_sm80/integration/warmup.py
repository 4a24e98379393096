"""JIT warm-up at the DeepInfer level, through upstream vLLM 0.32.0's own warm-up registry.

vLLM collects `register_warmup` calls made while the model is built (`JitWarmupRegistry`, active around
model loading) and compiles them in `kernel_warmup` before the server takes requests; a failure there
aborts startup. `OverlayWarmup` is a registry entry in the same duck type as upstream's `VllmJitKernel`
(hashable, `get_warmup_keys(**registration)`, `compile_many(keys)`), registered by the SM8x attention
layer's constructor at the optimized level only (the base level keeps upstream's warm-up as is):

- mHC boundaries: `ops.mhc.boundary.warmup` compiles every config its selector can return for 1..max
  tokens (the op's own enumeration, docs/MHC.md), with the model's eps values as upstream passes them.
- combiner: one launch per Triton specialization class of its varying integer arguments (value 1 is a
  constant, a multiple of 16 is 'D', else plain: `int_classes`), per compress-ratio class of the model.
  Pointer-alignment classes are not enumerated (16-byte aligned slices, the common case; a prefill
  chunk starting at a token not a multiple of 4 compiles its lens variant at first use).

What is not warmed here and why (docs/PATCH_01.md): the decode kernels are compiled by CUDA-graph
capture at every capture size; the mixed prefill+decode batch upstream's
`deepseek_v4_sparse_mla_attention_warmup` runs (our SWA backend keeps the DEEPSEEK_SPARSE_SWA name it
looks for) compiles the 16-token prefill path; larger-prefill specializations of the gather, insert and
sparse prefill kernels compile at their first use.

`UPSTREAM_REGISTRATIONS` lists every `register_warmup` call that upstream makes while building a V4.1
model whose attention is the SM8x layer (and the model runner's block table and sampler), with why it
cannot abort startup on SM80/SM86; the tests scan those files of the pinned tree, so a call missing from
the list fails.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from deepinfer_sm80 import bindings
from deepinfer_sm80.device import sm_count

LOG = logging.getLogger("deepinfer_sm80")
INT_CLASS_VALUES = (1, 16, 17)  # Triton's int specialization: ==1 constant, %16 == 0 'D', else none


def int_classes(values: Iterable[int] | None = None) -> tuple[int, ...]:
    """One representative per Triton specialization class present in `values` (all three if None)."""
    if values is None:
        return INT_CLASS_VALUES
    seen: dict[str, int] = {}
    for v in values:
        seen.setdefault(specialization(v), v)
    return tuple(seen.values())


def specialization(value: int) -> str:
    """Triton's own specialization of an int argument ('constexpr', 'D' or '')."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    kind, key = native_specialize_impl(BaseBackend, value, False, True, True)
    return "constexpr" if kind == "constexpr" else str(key)


@dataclass(frozen=True)
class CombineKey:
    compress_ratio: int
    top_k: int
    window: int
    topk_stride: int
    tokens: int
    requests: int
    m: int
    n: int


@dataclass(frozen=True)
class MhcKey:
    max_tokens: int
    hidden: int
    sm_count: int
    eps: tuple[float, float, float, float, int, float]


class OverlayWarmup:
    """The overlay's registry entry; one instance, so 43 layers' identical registrations dedupe."""

    def get_warmup_keys(
        self,
        *,
        combine: tuple[int, int, int, int] | None = None,
        mhc: tuple[int, int, int, tuple[float, float, float, float, int, float]] | None = None,
    ) -> list[Any]:
        keys: list[Any] = []
        if combine is not None:
            keys += combine_keys(*combine)
        if mhc is not None:
            keys.append(MhcKey(*mhc))
        return keys

    def compile_many(self, compile_keys: Iterable[Any]) -> None:
        for key in compile_keys:
            self.compile(key)

    def compile(self, key: Any) -> None:
        if isinstance(key, CombineKey):
            launch_combine(key)
        elif isinstance(key, MhcKey):
            from deepinfer_sm80.ops.mhc import boundary

            n = boundary.warmup(key.max_tokens, key.hidden, key.sm_count, key.eps)
            LOG.info("DeepInfer-SM80 warm-up: %d mHC kernels for up to %d tokens", n, key.max_tokens)
        else:
            raise TypeError(f"OverlayWarmup: unknown key {key!r}")


OVERLAY_WARMUP = OverlayWarmup()


def combine_keys(compress_ratio: int, top_k: int, window: int, topk_stride: int) -> list[CombineKey]:
    """Every integer specialization class the prefill loop can hand the combiner (requests <= tokens;
    N = 0 at ratio 0)."""
    keys = []
    for t in int_classes():
        for r in (c for c in int_classes() if c <= t):
            for m in int_classes():
                for n in int_classes() if compress_ratio > 0 else (0,):
                    keys.append(CombineKey(compress_ratio, top_k, window, topk_stride, t, r, m, n))
    return keys


def launch_combine(key: CombineKey) -> None:
    """One launch of the optimized combiner with `key`'s classes (contents are valid, results unused)."""
    from deepinfer_sm80.ops import topk_swa_combine as tsc

    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    t, r = key.tokens, key.requests
    q = [t // r + (1 if i < t % r else 0) for i in range(r)]  # r requests covering t tokens
    qsl = torch.tensor([0, *torch.tensor(q).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    seq = torch.tensor(q, dtype=torch.int32, device=dev)
    topk = torch.full((t, key.topk_stride), -1, dtype=torch.int32, device=dev)
    width = tsc.combined_width(key.top_k, key.window)
    indices = torch.empty((t, width), dtype=torch.int32, device=dev)
    lens = torch.empty((t,), dtype=torch.int32, device=dev)
    tsc.launch(
        indices, lens, topk, qsl, seq, seq.clone(), key.window, key.compress_ratio, key.top_k, key.m, key.n
    )


def register_layer(layer: Any, vllm_config: Any) -> None:
    """Called by the SM8x layer's constructor (inside upstream's active registry, if any)."""
    if bindings.active_level() != "optimized" or not vllm_config.kernel_config.enable_jit_warmup:
        return
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry

    top_k = 0 if layer.compress_ratio == 0 else int(layer.topk_indices_buffer.shape[-1])
    stride = int(layer.topk_indices_buffer.stride(0)) if layer.topk_indices_buffer is not None else top_k
    JitWarmupRegistry.register(
        OVERLAY_WARMUP, combine=(int(layer.compress_ratio), top_k, int(layer.window_size), stride)
    )
    if torch.cuda.is_available() and _mhc_bound():
        config = vllm_config.model_config.hf_config
        eps = (
            float(config.rms_norm_eps), float(config.hc_eps), float(config.hc_eps), 2.0,
            int(config.hc_sinkhorn_iters), float(config.rms_norm_eps),
        )  # fmt: skip  # upstream's mapping (nvidia/model.py DeepseekV4DecoderLayer)
        sms = sm_count(torch.cuda.current_device())
        JitWarmupRegistry.register(
            OVERLAY_WARMUP, mhc=(int(layer.max_num_batched_tokens), int(config.hidden_size), sms, eps)
        )


def _mhc_bound() -> bool:
    """True where the mhc rows bind ours (optimized level, on SM8x, not disabled)."""
    disabled = bindings.disabled_names()
    rows = [b for b in bindings.BINDINGS if b.name in ("mhc_pre", "mhc_post") and b.name not in disabled]
    return bool(rows) and bindings.row_applies(rows[0], bindings.device_capability())


# ----------------------------------------------------------------------------- upstream's registrations
@dataclass(frozen=True)
class Registration:
    site: str  # upstream file (relative to vllm/) with the register_warmup call
    kernel: str  # the kernel object's name at the call site
    status: str  # "sm80-safe" | "wrapped" | "not-reached"
    why: str


UPSTREAM_REGISTRATIONS: tuple[Registration, ...] = (
    Registration("models/deepseek_v41/attention.py", "_COMPUTE_PREFILL_METADATA_KERNEL", "sm80-safe",
                 "int32 prefill-metadata Triton kernel, no fp8 type in it"),
    Registration("models/deepseek_v41/attention.py", "_COMPUTE_SWA_INDICES_AND_LENS_KERNEL", "sm80-safe",
                 "int32 SWA index Triton kernel"),
    Registration("models/deepseek_v41/attention.py", "_COMPRESSED_SLOT_MAPPING_KERNEL", "sm80-safe",
                 "int slot-mapping Triton kernel"),
    Registration("models/deepseek_v41/attention.py", "_PREPARE_UNIFORM_DECODE_KERNEL", "sm80-safe",
                 "int indexer-metadata Triton kernel"),
    Registration("models/deepseek_v41/attention.py", "_BUILD_PREFILL_CHUNK_METADATA_KERNEL", "sm80-safe",
                 "int indexer-metadata Triton kernel"),
    Registration("models/deepseek_v41/attention.py", "_COMPUTE_DSPARK_NONCAUSAL_SWA_INDICES_KERNEL",
                 "sm80-safe", "int32 DSpark SWA index Triton kernel"),
    Registration("models/deepseek_v41/attention.py", "_COMBINE_TOPK_SWA_INDICES_KERNEL", "not-reached",
                 "registered only for the FlashMLA/mega/ROCm backend names; ours is warmed by OverlayWarmup"),
    Registration("models/deepseek_v41/nvidia/model.py", "MHC_PRE_NORM_KERNEL", "sm80-safe",
                 "upstream's TileLang mHC kernel, which builds sm_80/86 code (the base level runs it)"),
    Registration("models/deepseek_v41/nvidia/ops/o_proj.py", "_FUSED_WO_A_KERNEL", "not-reached",
                 "registered by the FlashMLA/FlashInfer layers only, on capability family 100"),
    Registration("model_executor/layers/sparse_attn_indexer.py", "_PACK_SEQ_TRITON_KERNEL", "wrapped",
                 "the pack_seq_warmup row turns the e4m3 registration into the uint8 key that runs"),
    Registration("model_executor/layers/sparse_attn_indexer.py", "_UNPACK_SEQ_TRITON_KERNEL", "sm80-safe",
                 "unpacks fp32/bf16 logits, no fp8 type"),
    Registration("model_executor/layers/sparse_attn_indexer.py", "_PACK_DCP_TOPK_CANDIDATES_KERNEL",
                 "not-reached", "decode context parallel > 1 with CuTeDSL only (not an SM8x configuration)"),
    Registration("model_executor/layers/sparse_attn_indexer.py",
                 "_STABLE_TOPK_FROM_GATHERED_CANDIDATES_KERNEL", "not-reached",
                 "decode context parallel > 1 with CuTeDSL only"),
    # model-runner V1 only (V2, the 0.32.0 default, has its own block table and rejection sampler)
    Registration("v1/worker/block_table.py", "_COMPUTE_SLOT_MAPPING_KERNEL", "sm80-safe",
                 "int slot-mapping Triton kernel"),
    Registration("v1/sample/rejection_sampler.py", "_rejection_greedy_sample", "sm80-safe",
                 "spec-decode token ids and fp32 probabilities, no fp8 type"),
    Registration("v1/sample/rejection_sampler.py", "_rejection_random_sample", "sm80-safe",
                 "spec-decode fp32 probabilities"),
    Registration("v1/sample/rejection_sampler.py", "_expand", "sm80-safe", "int expand kernel"),
    Registration("v1/sample/rejection_sampler.py", "_sample_recovered_tokens", "sm80-safe",
                 "fp32/fp64 Gumbel sampling"),
)  # fmt: skip
# Upstream files a V4.1 model with the SM8x layer constructs from (the scan's scope).
REGISTRATION_FILES = (
    "models/deepseek_v41/attention.py",
    "models/deepseek_v41/compressor.py",
    "models/deepseek_v41/nvidia/model.py",
    "models/deepseek_v41/nvidia/ops/o_proj.py",
    "model_executor/layers/sparse_attn_indexer.py",
    "model_executor/layers/indexer_topk.py",
    "v1/attention/backends/mla/indexer.py",
    "v1/attention/backends/mla/sparse_swa.py",
    "v1/worker/gpu/spec_decode/dspark/speculator.py",
    "v1/worker/gpu/block_table.py",
    "v1/worker/gpu/spec_decode/rejection_sampler.py",
    "v1/worker/block_table.py",
    "v1/sample/rejection_sampler.py",
)
