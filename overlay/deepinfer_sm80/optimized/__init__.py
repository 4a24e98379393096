"""DeepInfer versions of upstream vLLM 0.32.0 `cache_utils.py` functions (patch 01), same signatures."""

from deepinfer_sm80.ops.kv_gather import dequantize_and_gather_k_cache
from deepinfer_sm80.ops.kv_quant_insert import quantize_and_insert_k_cache
from deepinfer_sm80.ops.topk_swa_combine import combine_topk_swa_indices

__all__ = ["combine_topk_swa_indices", "dequantize_and_gather_k_cache", "quantize_and_insert_k_cache"]
