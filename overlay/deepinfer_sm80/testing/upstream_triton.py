"""Upstream vLLM 0.32.0 Triton kernels on the SM8x path that `make sm80-report` compiles beside ours.

The Engram layers' own kernels (issue 22 item 6), which no row replaces, so they run as upstream wrote
them: the n-gram hash (`_hash_ids_kernel`, and the V1 runner's `_write_hash_cache_kernel`), the fused
post-WKV gate (`_fused_engram_post_wkv_kernel`), the DP row select (`_engram_select_rows_kernel`), the
MXFP8 staging unpack (`_engram_unpack_fp8_kernel`: reached only with FlashInfer MXFP8 WKV input, i.e.
not on SM8x; compiled as a control), and the V2 runner's lookback gather (`_gather_lookback_kernel`,
nvidia/model_state.py). Signatures follow the launch sites (engram.py:549, :562, :1313, :1485, :1711;
model_state.py:287): dtypes of the tensors passed there, an int argument equal to 1 (a contiguous
stride) as the constexpr the JIT specializes it to, and `None` (the V2 runner has no slot cache) as a
constexpr None. Shapes: V4.1's hidden 5120 x hc 4 for the gate (BLOCK_SIZE 8192, 8 warps, as the
launch picks); the hash kernel at two (max n-gram, heads) settings, the tiny checkpoint's (4, 4) and
(3, 8), since BLOCK_H = next_power_of_2(heads) and MAX_NGRAM are its only shape constexprs.

Imported only by the report (it imports vLLM's model modules).
"""

from __future__ import annotations

import importlib
from typing import Any

from deepinfer_sm80.registry import CompileSpec

ENGRAM = "vllm.models.deepseek_v41.common.engram"
MODEL_STATE = "vllm.models.deepseek_v41.nvidia.model_state"


def _fn(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name)


def _hash_specs() -> list[CompileSpec]:
    fn = _fn(ENGRAM, "_hash_ids_kernel")
    pointers = {
        "input_ids": "*i32",
        "token_map": "*i32",
        "dead_mask": "*i1",
        "positions": "*i64",
        "block_table": "*i32",
        "query_start_loc": "*i32",
        "multipliers": "*i64",
        "primes": "*i64",
        "offsets": "*i64",
        "lookback_token_ids": "*i32",
        "lookback_dead_mask": "*i1",
        "output": "*i32",
    }
    ints = (
        "num_tokens",
        "num_slots",
        "pad_id",
        "table_stride",
        "num_query_rows",
        "num_table_rows",
        "max_blocks",
        "cache_block_size",
        "num_heads",
        "dead_id",
        "lookback_depth",
        "lookback_row_stride",
        "lookback_mask_row_stride",
    )
    ones = (
        "input_stride",
        "mask_stride",
        "position_stride",
        "table_col_stride",
        "query_stride",
        "lookback_col_stride",
        "lookback_mask_col_stride",
    )
    out = []
    for max_ngram, heads in ((4, 4), (3, 8)):
        sig = {**pointers, **dict.fromkeys(ints, "i32"), **dict.fromkeys(ones, "constexpr")}
        sig.update(cache="constexpr", MAX_NGRAM="constexpr", BLOCK_T="constexpr", BLOCK_H="constexpr")
        consts = {
            **dict.fromkeys(ones, 1),
            "cache": None,
            "MAX_NGRAM": max_ngram,
            "BLOCK_T": 32,
            "BLOCK_H": heads,
        }
        out.append(
            CompileSpec(
                f"upstream.engram_hash_ids.n{max_ngram}h{heads}",
                fn,
                _ordered(fn, sig),
                consts,
                num_warps=4,
                divisible_by_16=tuple(pointers),
            )
        )
    return out


def _ordered(fn: Any, sig: dict[str, str]) -> dict[str, str]:
    missing = set(fn.arg_names) ^ set(sig)
    if missing:
        raise ValueError(f"{fn.__name__}: signature does not match the kernel's arguments: {sorted(missing)}")
    return {name: sig[name] for name in fn.arg_names}


def upstream_specs() -> list[CompileSpec]:
    """The kernels listed in the module docstring, one spec per launch configuration."""
    specs = _hash_specs()
    fn = _fn(ENGRAM, "_write_hash_cache_kernel")
    sig = {
        "input_ids": "*i32",
        "token_map": "*i32",
        "dead_mask": "*i1",
        "slot_mapping": "*i64",
        "cache": "*i32",
        "num_tokens": "i32",
        "input_stride": "constexpr",
        "mask_stride": "constexpr",
        "slot_stride": "constexpr",
        "BLOCK_SIZE": "constexpr",
        "dead_id": "i32",
    }
    specs.append(
        CompileSpec(
            "upstream.engram_write_hash_cache",
            fn,
            _ordered(fn, sig),
            {"input_stride": 1, "mask_stride": 1, "slot_stride": 1, "BLOCK_SIZE": 256},
            num_warps=4,
            divisible_by_16=("input_ids", "token_map", "dead_mask", "slot_mapping", "cache"),
        )
    )
    fn = _fn(ENGRAM, "_fused_engram_post_wkv_kernel")
    ptrs = {
        "hidden_states": "*bf16",
        "kv": "*bf16",
        "q_weight": "*bf16",
        "k_weight": "*bf16",
        "output": "*bf16",
    }
    strides = (
        "hidden_stride_t",
        "hidden_stride_h",
        "kv_stride_t",
        "q_stride_h",
        "k_stride_h",
        "output_stride_t",
        "output_stride_h",
    )
    unit = ("hidden_stride_d", "kv_stride_d", "q_stride_d", "k_stride_d", "output_stride_d", "mask_stride")
    for has_mask in (False, True):
        sig = {
            **ptrs,
            "token_mask": "*i1" if has_mask else "*bf16",
            "num_kv_tokens": "i32",
            **dict.fromkeys(strides, "i32"),
            **dict.fromkeys(unit, "constexpr"),
            "eps": "fp32",
            "clamp_value": "fp32",
            "DIM": "constexpr",
            "HC_MULT": "constexpr",
            "BLOCK_SIZE": "constexpr",
            "HAS_MASK": "constexpr",
        }
        consts = {
            **dict.fromkeys(unit, 1),
            "DIM": 5120,
            "HC_MULT": 4,
            "BLOCK_SIZE": 8192,
            "HAS_MASK": has_mask,
        }
        if not has_mask:
            consts["mask_stride"] = 0  # the launch passes 0 without a mask: also a specialized constant
        specs.append(
            CompileSpec(
                f"upstream.engram_post_wkv.{'mask' if has_mask else 'nomask'}",
                fn,
                _ordered(fn, sig),
                consts,
                num_warps=8,
                divisible_by_16=(*ptrs, "token_mask"),
            )
        )
    fn = _fn(ENGRAM, "_engram_select_rows_kernel")
    sig = {
        "gathered": "*bf16",
        "output": "*bf16",
        "num_tokens": "i32",
        "token_start": "i32",
        "num_elements": "i32",
        "LOCAL_WIDTH": "constexpr",
        "WIDTH": "constexpr",
        "BLOCK_SIZE": "constexpr",
    }
    specs.append(
        CompileSpec(
            "upstream.engram_select_rows",
            fn,
            _ordered(fn, sig),
            {"LOCAL_WIDTH": 8 * 1024, "WIDTH": 16 * 1024, "BLOCK_SIZE": 1024},
            num_warps=4,
            divisible_by_16=("gathered", "output"),
        )
    )
    fn = _fn(ENGRAM, "_engram_unpack_fp8_kernel")
    sig = {
        "packed": "*u8",
        "values": "*u8",
        "scales": "*u8",
        "num_tokens": "i32",
        "values_stride": "i32",
        "scales_stride": "i32",
        "HEADS": "constexpr",
        "LOCAL_HEADS": "constexpr",
        "LAYERS": "constexpr",
        "RANK": "constexpr",
        "DIM": "constexpr",
        "BLOCK": "constexpr",
        "PEER": "constexpr",
    }
    specs.append(
        CompileSpec(
            "upstream.engram_unpack_fp8",
            fn,
            _ordered(fn, sig),
            {"HEADS": 16, "LOCAL_HEADS": 2, "LAYERS": 2, "RANK": 0, "DIM": 1024, "BLOCK": 16, "PEER": False},
            num_warps=4,
            divisible_by_16=("packed", "values", "scales"),
        )
    )
    fn = _fn(MODEL_STATE, "_gather_lookback_kernel")
    sig = {
        "lookback_ptr": "*i32",
        "idx_mapping_ptr": "*i32",
        "num_computed_tokens_ptr": "*i32",
        "all_token_ids_ptr": "*i32",
        "all_token_ids_stride": "i32",
        "num_reqs": "i32",
        "DEPTH": "constexpr",
        "BLOCK_DEPTH": "constexpr",
    }
    specs.append(
        CompileSpec(
            "upstream.engram_gather_lookback",
            fn,
            _ordered(fn, sig),
            {"DEPTH": 3, "BLOCK_DEPTH": 4},
            num_warps=4,
            divisible_by_16=(
                "lookback_ptr",
                "idx_mapping_ptr",
                "num_computed_tokens_ptr",
                "all_token_ids_ptr",
            ),
        )
    )
    return specs + ada_writer_specs()


CACHE_UTILS = "vllm.models.deepseek_v41.common.ops.cache_utils"
COMPRESS = "vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache"
INDEXER_K = "vllm.models.deepseek_v41.common.ops.indexer_k_store"


def ada_writer_specs() -> list[CompileSpec]:
    """Upstream's hardware-fp8 Triton kernels that the table keeps on Ada (8.9), compiled for sm_89 only
    (below it Triton refuses fp8e4nv, which is why the rows replace them there). Launch sites:
    cache_utils.py:748 (the KV gather; ratio-2 pages of 64 states, 37,440 B), fused_compress_quant_cache
    .py:263 (the 584 B compressed-KV writer), indexer_k_store.py:95 (132 B indexer-K records, 64 per
    8,640 B page)."""
    out = []
    fn = _fn(CACHE_UTILS, "_dequantize_and_gather_k_kernel")
    consts: dict[str, Any] = {
        "max_blocks_per_seq": 1024,
        "fp8_dim": 448,
        "bf16_dim": 64,
        "scale_dim": 8,
        "quant_block": 64,
        "cache_block_size": 64,
        "token_data_size": 576,
        "block_stride": 37440,
        "output_dim": 512,
        "fp8_max": 448.0,
        "n_quant_blocks": 7,
        "use_fnuz": False,
    }
    sig = {
        "out_ptr": "*bf16",
        "out_stride0": "i32",
        "out_stride1": "i32",
        "k_cache_ptr": "*u8",
        "seq_lens_ptr": "*i32",
        "block_table_ptr": "*i32",
        "offset": "i32",
        "gather_lens_ptr": "*i32",
        **dict.fromkeys(consts, "constexpr"),
    }
    out.append(
        CompileSpec(
            "upstream.ada.kv_gather",
            fn,
            _ordered(fn, sig),
            consts,
            num_warps=4,
            divisible_by_16=("out_ptr", "k_cache_ptr"),
            archs=(89,),
        )
    )
    fn = _fn(COMPRESS, "_rope_quant_insert_kernel")
    consts = {
        "COS_STRIDE": 64,
        "CACHE_STRIDE": 37440,
        "CACHE_BLOCK": 64,
        "COMPRESS_RATIO": 2,
        "SANITIZE_CACHE_NANS": False,
    }
    sig = {
        "latent": "*bf16",
        "positions": "*i64",
        "cos_sin": "*fp32",
        "cache": "*u8",
        "cache_slots": "*i64",
        **dict.fromkeys(consts, "constexpr"),
    }
    out.append(
        CompileSpec(
            "upstream.ada.compress_insert",
            fn,
            _ordered(fn, sig),
            consts,
            num_warps=4,
            divisible_by_16=("latent", "cache"),
            archs=(89,),
        )
    )
    fn = _fn(INDEXER_K, "_indexer_k_norm_rope_quant_store_kernel")
    consts = {
        "HEAD_SIZE": 128,
        "ROPE_HEAD_DIM": 64,
        "COMPRESS_RATIO": 1,
        "TOKEN_STRIDE": 128,
        "SCALE_DIM": 4,
        "KV_BLOCK_STRIDE": 8640,
        "FP8_MAX": 448.0,
        "USE_FP4": False,
        "SHUFFLE": False,
        "BLOCK_TILE_SIZE": 16,
        "HEAD_TILE_SIZE": 16,
    }
    sig = {
        "k_pre_ptr": "*bf16",
        "k_pre_stride": "i32",
        "positions_ptr": "*i64",
        "rms_norm_weight_ptr": "*bf16",
        "rms_norm_eps": "fp32",
        "cos_sin_cache_ptr": "*fp32",
        "cos_sin_stride": "i32",
        "k_cache_ptr": "*u8",
        "kv_slot_mapping_ptr": "*i64",
        "kv_cache_block_size": "i32",
        **dict.fromkeys(consts, "constexpr"),
    }
    out.append(
        CompileSpec(
            "upstream.ada.indexer_k_store",
            fn,
            _ordered(fn, sig),
            consts,
            num_warps=1,
            divisible_by_16=("k_pre_ptr", "k_cache_ptr"),
            archs=(89,),
        )
    )
    return out
