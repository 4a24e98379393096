"""The GPU run's import path, checked here before a device call is spent on it.

The lent GPU runs the wheel's Python tree with no compiled extension, behind the CUDA stand-ins
(installed by the GPU hook); vLLM resolves the CUDA platform there, so module-level code takes its
CUDA branches (capability queries, flash-attn imports) that a CPU run never reaches. This probe
imports, in a fresh interpreter with the GPU run's PYTHONPATH and switches, the modules the engine
loads for V4.1 and DSpark with vLLM's CUDA platform answering capability 8.0 (the SM8x path the run
imitates), then inspects the V4.1 architecture the way vLLM's model registry does. One line per
failure; exit 1 when any module fails.

    python -m deepinfer_sm80.testing.e2e.gpu_probe SITE   # SITE: a bundle site (…/site with vllm/)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# what the offline engine, its worker, V4.1 and DSpark import on CUDA (model runner V1 and V2 both)
MODULES = (
    "vllm.entrypoints.llm",
    "vllm.v1.engine.core",
    "vllm.v1.executor.multiproc_executor",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.worker.gpu.model_runner",
    "vllm.v1.spec_decode.eagle",
    "vllm.model_executor.model_loader",
    "vllm.model_executor.kernels.linear",
    "vllm.model_executor.layers.fused_moe.experts.marlin_moe",
    "vllm.v1.attention.backends.mla.indexer",
    "vllm.v1.attention.backends.mla.flashmla_sparse",
    "vllm.models.deepseek_v41",
    "vllm.models.deepseek_v41.nvidia.model",
    "vllm.models.deepseek_v41.nvidia.dspark",
)
ARCHITECTURE = "DeepseekV41ForCausalLM"

# run inside the probe's interpreter: the CUDA platform with a fixed capability (no driver here)
_CHILD = """
import sys, traceback
import vllm.platforms as platforms
from vllm.platforms.cuda import CudaPlatform
from vllm.platforms.interface import DeviceCapability


class ProbePlatform(CudaPlatform):
    @classmethod
    def get_device_capability(cls, device_id=0):
        return DeviceCapability(8, 0)


platforms._current_platform = ProbePlatform()
failed = 0
for name in sys.argv[2:]:
    try:
        __import__(name)
    except Exception as exc:
        failed += 1
        where = traceback.extract_tb(exc.__traceback__)[-1]
        print(f"gpu-probe: import {name}: {type(exc).__name__}: {exc} ({where.filename}:{where.lineno})")
from vllm.model_executor.models.registry import ModelRegistry, _ModelInfo

try:
    cls = ModelRegistry._try_load_model_cls(sys.argv[1])
    if cls is None:
        raise RuntimeError("the registry could not load it")
    _ModelInfo.from_model_cls(cls)
except Exception as exc:
    failed += 1
    print(f"gpu-probe: inspect {sys.argv[1]}: {type(exc).__name__}: {exc}")
sys.exit(1 if failed else 0)
"""


def probe_env(site: Path) -> dict[str, str]:
    """The GPU run's environment for this site (gpu.site_env), without the carried wheels: this
    machine's own packages stand in for them."""
    from deepinfer_sm80.testing.e2e.gpu import site_env

    keep = {k: os.environ[k] for k in ("PATH", "HOME", "TMPDIR") if k in os.environ}
    return keep | site_env(site, None)


def probe(site: Path, timeout_s: float = 900.0) -> tuple[bool, str]:
    """(passed, output) of one probe interpreter over MODULES and ARCHITECTURE."""
    if not (site / "vllm" / "__init__.py").exists():
        return False, f"gpu-probe: {site}: no vllm/ tree"
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, ARCHITECTURE, *MODULES],
        env=probe_env(site),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=site,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("gpu-probe:")]
    if proc.returncode != 0 and not lines:
        lines = [f"gpu-probe: the probe interpreter exited {proc.returncode}: {proc.stderr.strip()[-400:]}"]
    return proc.returncode == 0, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m deepinfer_sm80.testing.e2e.gpu_probe SITE", file=sys.stderr)
        return 2
    ok, out = probe(Path(args[0]))
    print(out or f"gpu-probe: {len(MODULES)} modules and {ARCHITECTURE} import on the GPU path")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
