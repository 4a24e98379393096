"""Compiles deliberately bad kernels for the rig's own tests; run as a script, outside the interpreter.

Prints one JSON object: {"spilling": report, "big_smem": report, "hw_fp8_error": str}.
"""

import json

import triton
import triton.language as tl

from deepinfer_sm80.registry import CompileSpec
from deepinfer_sm80.testing.crosscompile import compile_for

_SIG = {"x_ptr": "*fp32", "y_ptr": "*fp32", "BLOCK": "constexpr"}


@triton.jit
def _transpose_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    # a [256, 256] fp32 tile transposed by 128 threads: 512 values per thread do not fit in registers
    r = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + r[:, None] * BLOCK + r[None, :])
    tl.store(y_ptr + r[:, None] * BLOCK + r[None, :], tl.trans(x) + 1.0)


@triton.jit
def _big_dot_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    # both [BLOCK, BLOCK] fp16 operands of tl.dot are staged in shared memory: 2 x 128 KB at 256
    r = tl.arange(0, BLOCK)
    a = tl.load(x_ptr + r[:, None] * BLOCK + r[None, :]).to(tl.float16)
    b = tl.load(x_ptr + BLOCK * BLOCK + r[:, None] * BLOCK + r[None, :]).to(tl.float16)
    tl.store(y_ptr + r[:, None] * BLOCK + r[None, :], tl.dot(a, b))


@triton.jit
def _hw_fp8_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    tl.store(y_ptr + r, tl.load(x_ptr + r).to(tl.float8e4nv).to(tl.float32))


if __name__ == "__main__":
    result: dict[str, object] = {}
    spilling = compile_for(CompileSpec("spilling", _transpose_kernel, _SIG, {"BLOCK": 256}), 86)
    result["spilling"] = spilling.as_dict()
    big = compile_for(CompileSpec("big_smem", _big_dot_kernel, _SIG, {"BLOCK": 256}, num_warps=8), 86)
    result["big_smem"] = big.as_dict()
    try:
        compile_for(CompileSpec("hw_fp8", _hw_fp8_kernel, _SIG, {"BLOCK": 128}), 80)
        result["hw_fp8_error"] = ""
    except Exception as exc:
        result["hw_fp8_error"] = str(exc)
    print(json.dumps(result))
