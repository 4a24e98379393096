"""Capability gates as binding-row factories (`wrap=True`): each takes upstream's probe, returns ours.

The rows decide where a gate applies (`below`); the factories only say what the probe answers there.
"""

from __future__ import annotations

from collections.abc import Callable


def cutedsl_off(upstream_has_cutedsl: Callable[[], bool]) -> Callable[[], bool]:
    """`has_cutedsl()` answers False: the module takes its Triton path instead of CuTeDSL kernels whose
    inline PTX conversions need sm_89 (indexer Q, `cvt.e4m3x2.f32`) or sm_90 (gather, bf16.f16 cvt)."""

    def has_cutedsl() -> bool:
        return False

    has_cutedsl.deepinfer_wraps = upstream_has_cutedsl  # type: ignore[attr-defined]
    return has_cutedsl


def deep_gemm_off(upstream_has_deep_gemm: Callable[[], bool]) -> Callable[[], bool]:
    """`has_deep_gemm()` answers False in the indexer metadata builder: the vendored DeepGEMM imports
    (so upstream's probe is True) but has no SM8x kernels, and its paged-logits schedule metadata is
    only read by DeepGEMM's own logits, which SM8x replaces."""

    def has_deep_gemm() -> bool:
        return False

    has_deep_gemm.deepinfer_wraps = upstream_has_deep_gemm  # type: ignore[attr-defined]
    return has_deep_gemm


def deep_gemm_not_needed(upstream_has_deep_gemm: Callable[[], bool]) -> Callable[[], bool]:
    """`has_deep_gemm()` answers True where the indexer only checks it to refuse to start: on SM8x the
    logits it would need are the overlay's, so a host whose DeepGEMM cannot import still serves."""

    def has_deep_gemm() -> bool:
        return True

    has_deep_gemm.deepinfer_wraps = upstream_has_deep_gemm  # type: ignore[attr-defined]
    return has_deep_gemm
