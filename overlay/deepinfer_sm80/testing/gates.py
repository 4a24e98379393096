"""Hardware gates as pytest decorators, and the interpreter switch."""

from __future__ import annotations

import os

import pytest
import torch


def has_cuda() -> bool:
    return torch.cuda.is_available()


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def test_device() -> str:
    """Where kernel tests run: the GPU if there is one, else CPU tensors under the interpreter."""
    return "cuda" if has_cuda() and not interpreting() else "cpu"


test_device.__test__ = False  # type: ignore[attr-defined]  # not a pytest test

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def requires_sm(major: int, minor: int = 0) -> pytest.MarkDecorator:
    """Skip unless a CUDA GPU of compute capability >= major.minor is present."""
    ok = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (major, minor)
    return pytest.mark.skipif(not ok, reason=f"needs a GPU of capability >= {major}.{minor}")


# for the integration rigs (streamed indexer, YOCO) whose vLLM workspace manager lives on the CPU
cpu_workspace_only = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="the rig sets vLLM's workspace manager up on the CPU (CI has no accelerator); on a GPU its "
    "tensors reach the Triton kernels on the wrong device (H200, results/gpu/layout-check-aa380db)",
)
