"""DeepInfer versions of upstream vLLM 0.32.0 `cache_utils.py` functions (patch 01), same signatures."""

from deepinfer_sm80.ops.topk_swa_combine import combine_topk_swa_indices

__all__ = ["combine_topk_swa_indices"]
