"""Factory of the `_select_dsv4_attn_cls` binding row (nvidia/model.py); no vLLM import at module level.

The row is applied while `nvidia/model.py` is still executing, so this module must not import the
attention layer (which imports the deepseek_v41 package, hence model.py) until a layer is chosen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

BACKEND_NAME = "DEEPINFER_SM8X_SPARSE_DSV41"


def select_attn_cls(upstream_select: Callable[[Any], type]) -> Callable[[Any], type]:
    """Factory of the `_select_dsv4_attn_cls` row: the SM8x layer for every V4.1 attention (DSpark too).

    The row applies only where FlashMLA, FlashInfer and mega attention have no kernels, so an explicit
    `--attention-backend` naming one of them is an error there rather than a crash at the first call.
    """

    def _select_dsv4_attn_cls(vllm_config: Any) -> type:
        backend = vllm_config.attention_config.backend
        if backend is not None:
            raise ValueError(
                f"--attention-backend {backend.name}: DeepSeek-V4.1 on SM8x runs only {BACKEND_NAME} "
                "(FlashMLA / FlashInfer sparse MLA have no SM80/SM86 kernels); leave the backend unset"
            )
        from deepinfer_sm80.integration.attention import DeepinferSM8xAttention

        return DeepinferSM8xAttention

    _select_dsv4_attn_cls.deepinfer_wraps = upstream_select  # type: ignore[attr-defined]
    return _select_dsv4_attn_cls
