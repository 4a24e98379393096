"""DeepInfer-SM80: Triton kernels that give vLLM 0.32.0's DeepSeek-V4.1 path an Ampere (SM80/SM86) route.

`deepinfer_sm80.bindings` is the table of what patch 00 (base level) and patch 01 (DeepInfer level)
bind in place of upstream's functions; `deepinfer_sm80.testing` is the verification rig (docs/LAYOUT.md).
"""

__version__ = "0.2.0"
