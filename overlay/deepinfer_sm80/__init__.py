"""DeepInfer-SM80: Triton kernels that give vLLM 0.32.0's DeepSeek-V4.1 path an Ampere (SM80/SM86) route.

`deepinfer_sm80.base` holds SM80 ports used by patch 00, `deepinfer_sm80.optimized` the DeepInfer
versions used by patch 01; `deepinfer_sm80.testing` is the verification rig (docs/MODEL.md, README.md).
"""

__version__ = "0.1.0"
