"""An independent fp32 forward of the tiny DeepSeek-V4.1 checkpoint (docs/ORACLE.md).

`V41Oracle.load(ckpt_dir)` reads config.json and the safetensors itself; it imports neither vLLM nor
anything of deepinfer_sm80 outside this package (tests/oracle/test_independence.py).
"""

from .model import V41Oracle
from .tolerance import GREEDY_MARGIN, NLL_MEAN_TOL, NLL_TOKEN_TOL

__all__ = ["GREEDY_MARGIN", "NLL_MEAN_TOL", "NLL_TOKEN_TOL", "V41Oracle"]
