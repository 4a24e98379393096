"""The one binding table: each upstream vLLM 0.32.0 symbol we replace, with its base and DeepInfer versions.

Patch 00 ends every upstream module that has rows with `rebind(globals(), __name__)`; the gate, the level
and the opt-outs live in the table and its hook (`hook.py`), never in the patch (docs/LAYOUT.md). Patch 01
only adds the level marker. This module is the rows and their vocabulary and imports nothing of the
package: the hook stands above it and reads `BINDINGS` here at call time; `bindings.py`, the name patch
00 imports, stands above both.
"""

from __future__ import annotations

from dataclasses import dataclass

# First capability with hardware e4m3 conversions (sm_89): below it, upstream's fp8 Triton/CuTeDSL writers
# fail, so the rows that replace them stop here (Ada keeps upstream's hardware-fp8 writers).
HW_FP8_CAPABILITY = 89
# First capability with FlashMLA (sm_90a SASS only) and DeepGEMM kernels, and with the CuTeDSL gather's
# bf16.f16 conversion: the rows about those (the SM8x layer, its sparse MLA, the indexer logits and
# DeepGEMM gates, the CuTeDSL gather) and the optimizations that run in or beside that layer apply below
# it, so on 8.0, 8.6 and 8.9 (Ada) alike.
NO_FLASHMLA_CAPABILITY = 90
# Rows that are not about the architecture (pipeline replication) apply on every capability.
EVERY_CAPABILITY = 1000
LEVEL_MARKER = "vllm.deepinfer_sm80_level"  # created by patch 01 only
ENV_DISABLE = "DEEPINFER_SM80_DISABLE"  # comma-separated row names sent back to base
ENV_FORCE_CAPABILITY = "DEEPINFER_SM80_FORCE_CAPABILITY"  # e.g. 80: route an H200 through the SM8x rows
LEVELS = ("base", "optimized")
# Optimizations that are not a replaced symbol (issue 16), on at the optimized level; DEEPINFER_SM80_DISABLE
# accepts these names too. yoco_metadata: shared-KV prefill rows built once per key (integration/yoco.py).
FEATURES = ("yoco_metadata",)


@dataclass(frozen=True)
class Binding:
    """One replaced upstream symbol. Targets are "package.module:attr" strings, imported only when bound.

    `base=None` keeps upstream's own object at the base level; `optimized=None` means "same as base".
    `wrap=True`: the target is a factory `f(upstream_object) -> replacement` (gates, wrappers).
    The row applies on CUDA devices of capability < `below` (8.0/8.6 by default; 9.0 adds Ada).
    `adds=True`: upstream's class lacks the attribute; the row adds it (absent where the row does not apply).
    """

    name: str
    module: str
    symbol: str  # a module global, or "Class.attr"
    base: str | None
    optimized: str | None
    why: str
    below: int = HW_FP8_CAPABILITY
    wrap: bool = False
    adds: bool = False

    def __post_init__(self) -> None:
        if self.base is None and self.optimized is None:
            raise ValueError(f"binding {self.name}: neither a base nor an optimized target")
        for target in (self.base, self.optimized):
            if target is not None and target.count(":") != 1:
                raise ValueError(f"binding {self.name}: target {target!r} is not 'package.module:attr'")
        if self.adds and (self.wrap or self.base is None or "." not in self.symbol):
            raise ValueError(f"binding {self.name}: an added attribute needs a base target on 'Class.attr'")

    def target(self, level: str) -> str | None:
        """The implementation this row binds at `level`; None = upstream's own."""
        if level not in LEVELS:
            raise ValueError(f"unknown level {level!r}; expected one of {LEVELS}")
        if level == "optimized" and self.optimized is not None:
            return self.optimized
        return self.base


_CACHE = "deepinfer_sm80.ops"
BINDINGS: tuple[Binding, ...] = (
    Binding(
        name="kv_quant_insert",
        module="vllm.models.deepseek_v41.common.ops.cache_utils",
        symbol="quantize_and_insert_k_cache",
        base=f"{_CACHE}.kv_quant_insert:base_quantize_and_insert_k_cache",
        optimized=f"{_CACHE}.kv_quant_insert:quantize_and_insert_k_cache",
        why="upstream's writer uses tl.float8e4nv (sm_89+); software e4m3, same bytes. No V4.1 CUDA call "
        "site reaches it in 0.32.0 (the SWA insert is the C++ op fused_deepseek_v4_qnorm_rope_kv_rope_"
        "quant_insert; only the V4 XPU path calls this writer); kept because deepseek_v41.common.ops "
        "exports it, any caller on SM8x would hit the fp8e4nv CompilationError, and entry_point_ab times "
        "the insert through it",
    ),
    Binding(
        name="kv_gather",
        module="vllm.models.deepseek_v41.common.ops.cache_utils",
        symbol="dequantize_and_gather_k_cache",
        base=f"{_CACHE}.kv_gather:base_dequantize_and_gather_k_cache",
        optimized=f"{_CACHE}.kv_gather:dequantize_and_gather_k_cache",
        why="CuTeDSL (sm_90) and tl.float8e4nv paths; software e4m3, one-pass gather at the DeepInfer level",
    ),
    Binding(
        name="topk_swa_combine",
        module="vllm.models.deepseek_v41.common.ops.cache_utils",
        symbol="combine_topk_swa_indices",
        base=None,
        optimized=f"{_CACHE}.topk_swa_combine:combine_topk_swa_indices",
        below=NO_FLASHMLA_CAPABILITY,
        why="upstream's combiner runs on sm_80 as is (the baseline); ours is one warp per token",
    ),
    Binding(
        name="dspark_draft",
        module="vllm.v1.worker.gpu.spec_decode.dspark.speculator",
        symbol="DSparkSpeculator._sample_sequential",
        base=None,
        optimized="deepinfer_sm80.integration.dspark_draft:wrap_sample_sequential",
        wrap=True,
        below=NO_FLASHMLA_CAPABILITY,
        why="upstream's op-by-op Markov chain runs on sm_80 (the baseline); ours is one launch per draft "
        "position after upstream's bias GEMM, and falls back to upstream's method where it does not apply",
    ),
    Binding(
        name="dspark_topk_bias",
        module="vllm.models.deepseek_v41.nvidia.dspark",
        symbol="DSparkDeepseekV4ForCausalLM.apply_markov_bias_gathered",
        base="deepinfer_sm80.integration.dspark_topk:apply_markov_bias_gathered",
        optimized=None,
        adds=True,
        below=NO_FLASHMLA_CAPABILITY,
        why="with dspark_draft_topk set, the speculator's top-k chain (speculator.py:229) calls this "
        "method, which only the Qwen3 DSpark class defines: AttributeError at the first draft or graph "
        "capture. Added as the Qwen3 class has it: upstream's DSparkMarkovHead.apply_bias_gathered, scaled",
    ),
    # ---- issue 13: patch 00, the serving path on SM8x (docs/BLOCKERS.md has one line per blocker)
    Binding(
        name="attention",
        module="vllm.models.deepseek_v41.nvidia.model",
        symbol="_select_dsv4_attn_cls",
        base="deepinfer_sm80.integration.attention_select:select_attn_cls",
        optimized=None,
        wrap=True,
        below=NO_FLASHMLA_CAPABILITY,
        why="FlashMLA (sm_90a/sm_100 only) is every layer's attention, DSpark's too; the SM8x layer runs "
        "the Triton sparse MLA, no head padding. Looked up at call time by the decoder layer",
    ),
    Binding(
        name="sparse_mla_decode",
        module="vllm.v1.attention.ops.rocm_aiter_mla_sparse",
        symbol="rocm_sparse_attn_decode",
        base="deepinfer_sm80.ops.sparse_mla:base_sparse_attn_decode",
        optimized="deepinfer_sm80.ops.sparse_mla:sparse_attn_decode",
        below=NO_FLASHMLA_CAPABILITY,
        why="upstream's single-pass/split decode kernels cast to tl.float8e4nv; the SM8x layer calls it",
    ),
    Binding(
        name="sparse_mla_prefill",
        module="vllm.v1.attention.ops.rocm_aiter_mla_sparse",
        symbol="rocm_sparse_attn_prefill",
        base="deepinfer_sm80.ops.sparse_mla:base_sparse_attn_prefill",
        optimized="deepinfer_sm80.ops.sparse_mla:sparse_attn_prefill",
        below=NO_FLASHMLA_CAPABILITY,
        why="the SM8x layer's prefill calls this name; ported next to the decode (same record, same reduce)",
    ),
    Binding(
        name="compress_insert",
        module="vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache",
        symbol="_rope_quant_insert_kernel",
        base="deepinfer_sm80.ops.compress_insert:rope_quant_insert_kernel",
        optimized=None,
        why="the 584 B compressed-KV writer casts to tl.float8e4nv; rope_quant_insert picks the kernel from "
        "its table at call time, so the kernel object itself is replaced (same parameters)",
    ),
    Binding(
        name="indexer_k_store",
        module="vllm.models.deepseek_v41.common.ops.indexer_k_store",
        symbol="indexer_k_norm_rope_store",
        base="deepinfer_sm80.ops.indexer.k_store:indexer_k_norm_rope_store",
        optimized=None,
        why="the indexer-K writer casts to tl.float8e4nv; ops/indexer writes the same 132 B record",
    ),
    Binding(
        name="indexer_q",
        module="vllm.models.deepseek_v4.common.ops.fused_indexer_q",
        symbol="fused_indexer_q_rope_quant",
        base="deepinfer_sm80.ops.indexer.q_quant:fused_indexer_q_rope_quant",
        optimized=None,
        why="both upstream paths (CuTeDSL, Triton) emit e4m3 conversions; ops/indexer encodes in software",
    ),
    Binding(
        name="cutedsl_indexer_q",
        module="vllm.models.deepseek_v4.common.ops.fused_indexer_q",
        symbol="has_cutedsl",
        base="deepinfer_sm80.integration.gates:cutedsl_off",
        optimized=None,
        wrap=True,
        why="CuTeDSL indexer Q needs cvt.e4m3x2.f32 (sm_89+): gated on 8.9 even with indexer_q disabled",
    ),
    Binding(
        name="cutedsl_gather",
        module="vllm.models.deepseek_v41.common.ops.cache_utils",
        symbol="has_cutedsl",
        base="deepinfer_sm80.integration.gates:cutedsl_off",
        optimized=None,
        wrap=True,
        below=NO_FLASHMLA_CAPABILITY,
        why="CuTeDSL dequant-gather needs cvt.bf16.f16 (sm_90): below 9.0 the gather is Triton (ours < 8.9)",
    ),
    Binding(
        name="indexer_metadata",
        module="vllm.v1.attention.backends.mla.indexer",
        symbol="has_deep_gemm",
        base="deepinfer_sm80.integration.gates:deep_gemm_off",
        optimized=None,
        wrap=True,
        below=NO_FLASHMLA_CAPABILITY,
        why="the builder calls DeepGEMM's get_paged_mqa_logits_metadata (no SM8x code) every decode step; "
        "only DeepGEMM's logits read it",
    ),
    Binding(
        name="indexer_requires_deep_gemm",
        module="vllm.model_executor.layers.sparse_attn_indexer",
        symbol="has_deep_gemm",
        base="deepinfer_sm80.integration.gates:deep_gemm_not_needed",
        optimized=None,
        wrap=True,
        below=NO_FLASHMLA_CAPABILITY,
        why="SparseAttnIndexer refuses to start without DeepGEMM; on SM8x its logits are the overlay's",
    ),
    Binding(
        name="indexer_prefill_logits",
        module="vllm.model_executor.layers.sparse_attn_indexer",
        symbol="fp8_fp4_mqa_logits",
        base="deepinfer_sm80.ops.indexer.logits:fp8_fp4_mqa_logits",
        optimized=None,
        below=NO_FLASHMLA_CAPABILITY,
        why="DeepGEMM fp8 MQA logits (JIT, SM90+); looked up at call time in sparse_attn_indexer",
    ),
    Binding(
        name="indexer_decode_logits",
        module="vllm.model_executor.layers.sparse_attn_indexer",
        symbol="fp8_fp4_paged_mqa_logits",
        base="deepinfer_sm80.ops.indexer.logits:fp8_fp4_paged_mqa_logits",
        optimized=None,
        below=NO_FLASHMLA_CAPABILITY,
        why="DeepGEMM paged fp8 MQA logits (JIT, SM90+); looked up at call time in sparse_attn_indexer",
    ),
    Binding(
        name="indexer_stream",
        module="vllm.model_executor.layers.sparse_attn_indexer",
        symbol="SparseAttnIndexer.forward_cuda",
        base=None,
        optimized="deepinfer_sm80.integration.indexer_stream:wrap_forward_cuda",
        wrap=True,
        below=NO_FLASHMLA_CAPABILITY,
        why="streamed logits + running top-k (bounded workspace, candidate-only 24..36) in place of "
        "logits -> candidates -> top-k; sparse_attn_indexer is registered as vllm::sparse_attn_indexer "
        "while its module executes, so the hook cannot reach it: forward_cuda, which every dispatch of "
        "the layer looks up on the class, builds its arguments; upstream's op runs where ours does not apply",
    ),
    Binding(
        name="pack_seq",
        module="vllm.v1.attention.ops.common",
        symbol="pack_seq_triton",
        base="deepinfer_sm80.integration.pack_seq:pack_seq_via_uint8",
        optimized=None,
        wrap=True,
        why="the padded decode path packs the e4m3 Q through an fp8 pointer; packed as bytes, same pad byte",
    ),
    Binding(
        name="pack_seq_warmup",
        module="vllm.v1.attention.ops.common",
        symbol="_PACK_SEQ_TRITON_KERNEL.register_warmup",
        base="deepinfer_sm80.integration.pack_seq:pack_warmup_via_uint8",
        optimized=None,
        wrap=True,
        why="SparseAttnIndexer registers an fp8 JIT warm-up while it is built (warm-up re-raises: startup "
        "aborts); the kernel object is captured then, so its registration method is wrapped instead",
    ),
    Binding(
        name="engram_lookup",
        module="vllm.models.deepseek_v41.common.engram",
        symbol="_engram_lookup_kernel",
        base="deepinfer_sm80.ops.engram:engram_lookup_via_bytes",
        optimized=None,
        wrap=True,
        why="the Engram table is read through an fp8 pointer; the stand-in reads bytes, decodes in software",
    ),
    # ---- issue 16: patch 01's shared-KV metadata (integration/yoco.py, docs/PATCH_01.md)
    Binding(
        name="workspace_generation",
        module="vllm.v1.worker.workspace",
        symbol="WorkspaceManager.get_simultaneous",
        base=None,
        optimized="deepinfer_sm80.integration.yoco:count_get_simultaneous",
        wrap=True,
        below=NO_FLASHMLA_CAPABILITY,
        why="counts scratch hand-outs, so a shared-KV layer reuses the compressed gather of the layer "
        "before it only when nothing else (MoE, indexer) took the workspace since; same views returned",
    ),
    # mHC boundaries (docs/MHC.md): upstream's TileLang kernels build real sm_80/sm_86 code and stay at
    # both levels. Ours (ops/mhc, rows mhc_pre / mhc_post) are withheld from the DeepInfer level: the H200
    # run at 84bf975 failed 12 of their GPU tests (declared tolerances, T >= 128 and vs upstream at T <= 32)
    # and timed none of them; a row goes back in only with a GPU run that passes and measures them.
    # Pipeline parallelism across KV-sharing groups (docs/PIPELINE.md): not about the architecture, so
    # these rows apply on every CUDA capability (below=EVERY_CAPABILITY); both images need them.
    Binding(
        name="pp_make_layers",
        module="vllm.models.deepseek_v41.nvidia.model",
        symbol="make_layers",
        base="deepinfer_sm80.integration.pp.engine:wrap_make_layers",
        optimized=None,
        below=EVERY_CAPABILITY,
        wrap=True,
        why="a PP cut inside a KV-sharing group raises NotImplementedError (attention.py L454/L597); the "
        "stage gets replicas of the remote source caches, planned from the config and the partition",
    ),
    Binding(
        name="pp_forward",
        module="vllm.models.deepseek_v41.nvidia.model",
        symbol="DeepseekV4Model.forward",
        base="deepinfer_sm80.integration.pp.engine:wrap_forward",
        optimized=None,
        below=EVERY_CAPABILITY,
        wrap=True,
        why="ships the new source records, top-k and candidate rows with the IntermediateTensors; the "
        "next stage writes byte-identical replicas before its first layer. With DSpark on PP it also "
        "ships the stage's aux states and puts the received ones first on the last stage (upstream's "
        "V4.1 forward keeps them local, model.py L1046-1077)",
    ),
    Binding(
        name="pp_intermediate",
        module="vllm.models.deepseek_v41.nvidia.model",
        symbol="DeepseekV4Model.make_empty_intermediate_tensors",
        base="deepinfer_sm80.integration.pp.engine:wrap_make_empty_intermediate_tensors",
        optimized=None,
        below=EVERY_CAPABILITY,
        wrap=True,
        why="model runner V2 copies received tensors key by key into these buffers; they gain the "
        "payload keys",
    ),
    Binding(
        name="pp_kv_groups",
        module="vllm.v1.core.kv_cache_utils",
        symbol="get_kv_cache_config_from_groups",
        base="deepinfer_sm80.integration.pp.kv_groups:wrap_get_kv_cache_config_from_groups",
        optimized=None,
        below=EVERY_CAPABILITY,
        wrap=True,
        why="every PP > 1 layout of V4.1 fails KV-cache allocation: a uniform group projected empty onto a "
        "stage keeps the global spec, its tensors name the other stage's layers (L1646-1650) and "
        "allocate_kv_cache raises StopIteration (v1/worker/utils.py L601); tensors from the stage's own "
        "layers only",
    ),
    Binding(
        name="pp_engram_entry",
        module="vllm.models.deepseek_v41.nvidia.model",
        symbol="DeepseekV4DecoderLayer.forward",
        base="deepinfer_sm80.integration.pp.engram_entry:wrap_decoder_forward",
        optimized=None,
        below=EVERY_CAPABILITY,
        wrap=True,
        why="an Engram layer that opens a non-first stage (layer 14 at 14,14,12) gets residual=None and "
        "takes the branch with no Engram injection (model.py L494-530): silently wrong tokens. The received "
        "stream is the post the single stage injects into; injected there, then upstream's layer. Its ids "
        "come from pp_forward (pp_ids_0: model runner V2 gives later stages input_ids=None)",
    ),
    Binding(
        name="pp_kv_layout",
        module="vllm.v1.attention.backends.utils",
        symbol="resolve_kv_cache_layout",
        base="deepinfer_sm80.integration.pp.kv_layout:wrap_resolve_kv_cache_layout",
        optimized=None,
        below=EVERY_CAPABILITY,
        wrap=True,
        why="a stage with no indexer-K cache reports more KV-cache layouts than the others (the indexer "
        "backend narrows to BLHNC, BLNHC, mla/indexer.py L347-351) and start-up asserts 'Workers disagree "
        "on supported KV cache layouts' (utils.py L285): cuts 2,38 / 3,5,32 / 5x8. The workers' lists are "
        "intersected as upstream intersects one worker's backends; equal lists pass as they came",
    ),
    Binding(
        name="pp_spec_cadence",
        module="vllm.v1.core.sched.scheduler",
        symbol="Scheduler._update_after_schedule",
        base="deepinfer_sm80.integration.pp.cadence:wrap_update_after_schedule",
        optimized=None,
        below=EVERY_CAPABILITY,
        wrap=True,
        why="DSpark with PP under the synchronous scheduler (--no-async-scheduling, the legacy Ray executor; "
        "the pinned vLLM's default RayExecutorV2 and mp schedule asynchronously) "
        "schedules a request's next decode before the last stage relayed its sampled token and drafts; "
        "the first stage stops at model_runner.py L1403. The asynchronous scheduler's pp_size cadence, "
        "applied by "
        "the synchronous one (integration/pp/cadence.py)",
    ),
    Binding(
        name="dspark_pp_aux",
        module="vllm.models.deepseek_v41.nvidia.model",
        symbol="DeepseekV4Model.supports_aux_hidden_states_over_pp",
        base="deepinfer_sm80.integration.pp.aux:supports_aux_over_pp",
        optimized=None,
        below=EVERY_CAPABILITY,
        wrap=True,
        why="DSpark with PP > 1 is refused at model load (model_runner.py L410 -> eagle3_utils.py L44-50: "
        "the class inherits False); V4.1 relays its aux states by vLLM's convention once pp_forward ships "
        "and collects them (integration/pp/aux.py)",
    ),
    Binding(
        name="dspark_pp_embed",
        module="vllm.v1.worker.gpu.spec_decode.eagle.utils",
        symbol="maybe_share_target_embed",
        base="deepinfer_sm80.integration.pp.dspark_embed:wrap_maybe_share_target_embed",
        optimized=None,
        below=EVERY_CAPABILITY,
        wrap=True,
        why="DSpark with PP > 1 raises: the target embedding is not on the drafter's (last) stage; the "
        "drafter's own embedding is loaded from the checkpoint there (dspark/utils.py imports it at "
        "call time)",
    ),
)
