"""Factory of the `_select_dsv4_attn_cls` binding row (nvidia/model.py); no vLLM import at module level.

The row is applied while `nvidia/model.py` is still executing, so this module must not import the
attention layer (which imports the deepseek_v41 package, hence model.py) until a layer is chosen.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from deepinfer_sm80.integration.sm8x_backend import BACKEND_NAME

LOG = logging.getLogger("deepinfer_sm80")
# persistent_topk's host code takes its 128 KiB long-row paths only where a block can opt into more
# than 147,455 B of shared memory, and only for rows past 98,303 tokens (SASS/host code of the
# wheel's _C; 0x23fff and 0x17fff)
TOPK_LONG_ROW_SMEM = 147_455
TOPK_LONG_ROW_TOKENS = 98_303
_NOTED: list[bool] = []


def startup_notes(capability: int | None, level: str) -> list[str]:
    """What the SM8x path does differently from upstream's FlashMLA path, unmeasured (issue 22 item 8)."""
    from deepinfer_sm80.device import REPORT_BUDGETS

    notes = []
    if level == "base":
        notes.append(
            "base level: upstream's combine_topk_swa_indices Triton kernel is not JIT-warmed for backend "
            f"{BACKEND_NAME} (upstream registers its warm-up only for the FlashMLA and ROCm backend names, "
            "models/deepseek_v41/attention.py:648); its specializations compile at the first prefill chunks"
        )
    budget = REPORT_BUDGETS.get(capability or 0)
    if budget is not None and budget.smem_per_block <= TOPK_LONG_ROW_SMEM:
        notes.append(
            f"sm_{capability}: {budget.smem_per_block} B of shared memory per block is below what persistent "
            f"decode top-k's long-row paths need (> {TOPK_LONG_ROW_SMEM} B); decode rows longer than "
            f"{TOPK_LONG_ROW_TOKENS} tokens do not take them (vLLM's host code falls back for those rows; "
            "not measured here)"
        )
    return notes


def _note_once() -> None:
    if _NOTED:
        return
    _NOTED.append(True)
    from deepinfer_sm80 import bindings

    for note in startup_notes(bindings.device_capability(), bindings.active_level()):
        LOG.warning("DeepInfer-SM80: %s", note)


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

        _note_once()  # once per process, at the first layer built
        return DeepinferSM8xAttention

    _select_dsv4_attn_cls.deepinfer_wraps = upstream_select  # type: ignore[attr-defined]
    return _select_dsv4_attn_cls
