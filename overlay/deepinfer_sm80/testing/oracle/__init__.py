"""An independent fp32 forward of the tiny DeepSeek-V4.1 checkpoint (docs/ORACLE.md).

`V41Oracle.load(ckpt_dir)` reads config.json and the safetensors itself; it imports neither vLLM nor
anything of deepinfer_sm80 outside this package (tests/oracle/test_independence.py).
"""

from .model import V41Oracle
from .tolerance import (
    GREEDY_MARGIN,
    GREEDY_MARGIN_SELECTING,
    NLL_MEAN_TOL,
    NLL_MEAN_TOL_SELECTING,
    NLL_TOKEN_TOL,
    tolerances,
)

__all__ = [
    "GREEDY_MARGIN",
    "GREEDY_MARGIN_SELECTING",
    "NLL_MEAN_TOL",
    "NLL_MEAN_TOL_SELECTING",
    "NLL_TOKEN_TOL",
    "V41Oracle",
    "tolerances",
]
