"""Kernel tests run on the GPU when there is one, else on CPU tensors under TRITON_INTERPRET=1."""

import os

import torch

if not torch.cuda.is_available():
    # must be set before any @triton.jit function is defined, i.e. before our modules import
    os.environ.setdefault("TRITON_INTERPRET", "1")
