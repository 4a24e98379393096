"""Startup hook of the CPU end-to-end run: on PYTHONPATH only in the env `server_env()` returns.

Python imports `sitecustomize` at start-up in every process (the API server, the engine core, any
worker), so the stand-ins are in place before vLLM is imported. It does nothing unless
DEEPINFER_E2E_CPU=1; a CUDA deployment never has this directory on its path.
"""

import os

if os.environ.get("DEEPINFER_E2E_CPU") == "1":
    from deepinfer_sm80.testing.e2e import standins

    standins.install()
