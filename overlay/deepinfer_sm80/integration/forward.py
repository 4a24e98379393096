"""Call-time forwarders to kernels other helpers own, so a binding row can name them before they land.

A row's target is imported when its module is hooked; a forwarder resolves the real kernel at its
first call instead, so vLLM imports (and routing tests run) while a kernel package is still being
written, and the first call of a missing kernel fails with a one-line error naming it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


class MissingKernel(RuntimeError):
    """A binding row names a kernel that is not in this build of deepinfer_sm80."""


def forwarder(target: str) -> Callable[..., Any]:
    """A function that calls `target` ("package.module:attr"), resolved once at the first call."""
    module_name, attr = target.split(":")
    resolved: list[Callable[..., Any]] = []

    def call(*args: Any, **kwargs: Any) -> Any:
        if not resolved:
            try:
                resolved.append(getattr(importlib.import_module(module_name), attr))
            except (ImportError, AttributeError) as exc:
                raise MissingKernel(f"DeepInfer-SM80: {target} is not available ({exc})") from exc
        return resolved[0](*args, **kwargs)

    call.__name__ = call.__qualname__ = attr
    call.__doc__ = f"Forwards to {target} (resolved at the first call)."
    call.deepinfer_target = target  # type: ignore[attr-defined]  # read by the routing tests
    return call


_SPARSE_MLA = "deepinfer_sm80.ops.sparse_mla"
_INDEXER = "deepinfer_sm80.ops.indexer"

# sparse MLA, upstream's rocm_sparse_attn_decode / rocm_sparse_attn_prefill signatures
base_sparse_attn_decode = forwarder(f"{_SPARSE_MLA}:base_sparse_attn_decode")
sparse_attn_decode = forwarder(f"{_SPARSE_MLA}:sparse_attn_decode")
base_sparse_attn_prefill = forwarder(f"{_SPARSE_MLA}:base_sparse_attn_prefill")
sparse_attn_prefill = forwarder(f"{_SPARSE_MLA}:sparse_attn_prefill")

# indexer, upstream's signatures (DeepGEMM's logits; the V4 Q quantizer; the V4.1 K writer)
fused_indexer_q_rope_quant = forwarder(f"{_INDEXER}.q_quant:fused_indexer_q_rope_quant")
indexer_k_norm_rope_store = forwarder(f"{_INDEXER}.k_store:indexer_k_norm_rope_store")
fp8_fp4_mqa_logits = forwarder(f"{_INDEXER}.logits:fp8_fp4_mqa_logits")
fp8_fp4_paged_mqa_logits = forwarder(f"{_INDEXER}.logits:fp8_fp4_paged_mqa_logits")
