"""SM80 ports of upstream vLLM 0.32.0 `cache_utils.py` functions that cannot run on sm_80/86 (patch 00).

Same names and signatures as upstream. `combine_topk_swa_indices` is absent on purpose: upstream's own
Triton kernel compiles and runs on sm_80/86 unchanged, so it is the SM80 baseline and patch 00 leaves it.
"""

# quantize/gather: upstream's kernels use tl.float8e4nv (rejected below sm_89) -> ports with software FP8
from deepinfer_sm80.ops.kv_gather import base_dequantize_and_gather_k_cache as dequantize_and_gather_k_cache
from deepinfer_sm80.ops.kv_quant_insert import base_quantize_and_insert_k_cache as quantize_and_insert_k_cache

__all__ = ["dequantize_and_gather_k_cache", "quantize_and_insert_k_cache"]
