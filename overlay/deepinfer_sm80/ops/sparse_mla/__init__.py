"""Sparse MLA over fp8_ds_mla caches for SM80/SM86 (vLLM 0.32.0's rocm_sparse_attn_decode / _prefill)."""

from deepinfer_sm80.ops.sparse_mla.decode import base_sparse_attn_decode, sparse_attn_decode
from deepinfer_sm80.ops.sparse_mla.prefill import base_sparse_attn_prefill, sparse_attn_prefill

__all__ = ["base_sparse_attn_decode", "base_sparse_attn_prefill", "sparse_attn_decode", "sparse_attn_prefill"]
