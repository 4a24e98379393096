"""Startup hook of the GPU end-to-end run (issue 38): on PYTHONPATH only in the env `gpu.gpu_env()` returns.

Python imports `sitecustomize` at start-up in every process (the engine core, any worker, the API
server), so the CUDA stand-ins are in place before vLLM is imported. It does nothing unless
DEEPINFER_E2E_CUDA=1; a deployment never has this directory on its path.
"""

import os

if os.environ.get("DEEPINFER_E2E_CUDA") == "1":
    from deepinfer_sm80.testing.e2e import standins

    standins.install_cuda()
