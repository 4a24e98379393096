"""Issue 38 (the engine on a GPU), what a CPU can check: the CUDA stand-ins stay off the production path and
compute what the CPU stand-ins / the project's references compute, the device script's dry run, the bundle
builder's wheel list, the GPU plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "overlay" / "deepinfer_sm80"
PY = sys.executable


def _gen(name: str) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(name.encode()))


def test_gpu_hook_is_inert_without_the_switch() -> None:
    hook = PKG / "testing" / "e2e" / "gpu_hook"
    env = {k: v for k, v in os.environ.items() if k not in ("DEEPINFER_E2E_CUDA", "DEEPINFER_E2E_CPU")}
    env["PYTHONPATH"] = os.pathsep.join([str(hook), str(ROOT / "overlay"), env.get("PYTHONPATH", "")])
    code = "import sys; print([m for m in sys.modules if 'e2e' in m or m.startswith('vllm')])"
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_production_import_path_never_loads_the_cuda_standins() -> None:
    """The hook and every binding target import without the stand-in module (no switch set)."""
    code = (
        "import sys, importlib\n"
        "from deepinfer_sm80 import bindings, hook\n"
        "mods = {t.split(':')[0] for b in bindings.BINDINGS for t in (b.base, b.optimized) if t}\n"
        "for m in sorted(mods):\n"
        "    importlib.import_module(m)\n"
        "print([m for m in sys.modules if m.startswith('deepinfer_sm80.testing.e2e')])\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DEEPINFER_E2E_CUDA", "DEEPINFER_E2E_CPU")}
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_only_the_gpu_hook_and_runner_import_the_cuda_standins() -> None:
    users = sorted(
        p.relative_to(PKG).as_posix()
        for p in PKG.rglob("*.py")
        if "install_cuda" in p.read_text() or "CUDA_STANDINS" in p.read_text()
    )
    assert users == ["testing/e2e/gpu.py", "testing/e2e/gpu_hook/sitecustomize.py", "testing/e2e/standins.py"]


def test_every_cuda_standin_names_the_upstream_op_and_the_sm80_code() -> None:
    from deepinfer_sm80.testing.e2e import standins

    for name, (replaces, on_sm80) in standins.CUDA_STANDINS.items():
        assert replaces and on_sm80, name
    for fn in (
        standins.cuda_fused_qnorm_rope_kv_rope_quant_insert,
        standins.cuda_fused_kv_rope_insert,
        standins.cuda_cp_gather_indexer_k_quant_cache,
        standins.cuda_top_k_per_row_prefill,
        standins.cuda_top_k_per_row_decode,
        standins.cuda_capability_query,
    ):
        doc = fn.__doc__ or ""
        assert "Replaces:" in doc and "on sm_80" in doc.lower(), fn.__name__


def test_cuda_and_cpu_standins_exclude_each_other() -> None:
    code = "from deepinfer_sm80.testing.e2e import standins; standins.install_cuda()"
    env = os.environ | {"DEEPINFER_E2E_CPU": "1", "PYTHONPATH": str(ROOT / "overlay")}
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0 and "exclude each other" in proc.stderr


def test_topk_standins_match_the_cpu_loops() -> None:
    from deepinfer_sm80.testing.e2e import standins

    g = _gen("topk")
    rows, width, k = 6, 40, 8
    logits = torch.randn(rows, width, generator=g)
    ks = torch.tensor([0, 3, 10, 0, 5, 20], dtype=torch.int32)
    ke = torch.tensor([40, 9, 30, 4, 5, 40], dtype=torch.int32)
    a = torch.full((rows, k), 7, dtype=torch.int32)
    b = a.clone()
    standins.top_k_per_row_prefill(logits, ks, ke, a, rows, width, 1, k)
    standins.cuda_top_k_per_row_prefill(logits, ks, ke, b, rows, width, 1, k)
    assert torch.equal(a, b)
    seq_lens = torch.tensor([12, 40, 3], dtype=torch.int32)
    a2, b2 = torch.zeros(rows, k, dtype=torch.int32), torch.zeros(rows, k, dtype=torch.int32)
    standins.top_k_per_row_decode(logits, 2, seq_lens, a2, rows, width, 1, k)
    standins.cuda_top_k_per_row_decode(logits, 2, seq_lens, b2, rows, width, 1, k)
    assert torch.equal(a2, b2)


def test_indexer_gather_standin_matches_the_cpu_loop() -> None:
    from deepinfer_sm80.formats.indexer_k import make_k_cache
    from deepinfer_sm80.testing.e2e import standins

    g = _gen("gather")
    cache = make_k_cache(6, 64)
    cache.copy_(torch.randint(0, 256, cache.shape, dtype=torch.uint8, generator=g))
    block_table = torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32)
    cu = torch.tensor([0, 70, 150], dtype=torch.int32)
    outs = []
    for fn in (standins.cp_gather_indexer_k_quant_cache, standins.cuda_cp_gather_indexer_k_quant_cache):
        k = torch.full((160, 128), 0x5A, dtype=torch.uint8).view(torch.float8_e4m3fn)
        s = torch.full((160, 1), 3.0)
        fn(cache, k, s, block_table, cu)
        outs.append((k.view(torch.uint8).clone(), s.clone()))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_dense_moe_matches_the_cpu_moe() -> None:
    from deepinfer_sm80.testing.e2e import standins

    g = _gen("moe")
    e, m, k, n, top_k = 4, 5, 64, 32, 2
    w13 = torch.randint(0, 256, (e, 2 * n, k // 2), dtype=torch.uint8, generator=g)
    w2 = torch.randint(0, 256, (e, k, n // 2), dtype=torch.uint8, generator=g)
    s13 = torch.randint(118, 130, (e, 2 * n, k // 32), dtype=torch.uint8, generator=g)
    s2 = torch.randint(118, 130, (e, k, n // 32), dtype=torch.uint8, generator=g)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    ids = torch.tensor([[0, 3], [1, 1], [2, -1], [3, 0], [1, 2]], dtype=torch.int32)
    w = torch.rand(m, top_k, generator=g)
    a, b = torch.empty(m, k, dtype=torch.bfloat16), torch.empty(m, k, dtype=torch.bfloat16)
    standins.mxfp4_moe(a, x, w13, w2, s13, s2, w, ids, swiglu_limit=7.0)
    standins.mxfp4_moe_dense(b, x, w13, w2, s13, s2, w, ids, swiglu_limit=7.0)
    assert torch.equal(a, b)


def test_record_encoder_matches_the_insert_reference() -> None:
    from deepinfer_sm80.formats.fp8_ds_mla import make_k_cache, token_views
    from deepinfer_sm80.ops.kv_quant_insert import quantize_and_insert_ref
    from deepinfer_sm80.testing.e2e import standins

    g = _gen("records")
    t, bs = 9, 64
    kv = (torch.randn(t, 512, generator=g) * torch.logspace(-3, 2, t)[:, None]).to(torch.bfloat16)
    cache = make_k_cache(2, bs)
    slots = torch.arange(t, dtype=torch.int64) * 7
    quantize_and_insert_ref(kv, cache, slots, bs)
    data, scales = standins._ds_mla_records(kv)
    dv, sv = token_views(cache, bs)
    assert torch.equal(dv[slots // bs, slots % bs], data)
    assert torch.equal(sv[slots // bs, slots % bs], scales)


def test_gpu_plan_and_targets_shape() -> None:
    from deepinfer_sm80.testing.e2e import gpu

    engines = {e.name: e for e in gpu.plan(True)}
    assert {"main", "dspark", "eager", "graphs_nocompile"} <= set(engines)
    main = engines["main"].engine
    assert main["async_scheduling"] and "enforce_eager" not in main and main["moe_backend"] == "marlin"
    assert engines["eager"].engine["enforce_eager"] and engines["dspark"].spec_of == "main"
    assert any(c.expect_cached for c in engines["main"].cases)
    assert max(len(c.prompts) for c in engines["main"].cases) >= 4  # concurrent requests


def test_bundle_wheels_are_pinned_and_unique() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_engine_bundle

    names = [w.split("==")[0].lower().replace("_", "-") for w in gpu_engine_bundle.ENGINE_WHEELS]
    assert all("==" in w for w in gpu_engine_bundle.ENGINE_WHEELS)
    assert len(names) == len(set(names))
    assert not {"torch", "triton", "vllm", "transformers"} & set(names)


@pytest.mark.skipif(not (ROOT / ".cache" / "gpu-engine" / "READY").exists(), reason="no GPU engine bundle")
def test_device_script_dry_run(tmp_path: Path) -> None:
    """scripts/gpu_engine.sh's CPU-checkable steps (versions, bundle unpack, checkpoint sha, provenance)."""
    model = ROOT / ".cache" / "tiny-v41"
    if not (model / "config.json").exists():
        pytest.skip("make tiny-model first")
    env = os.environ | {
        "GPU_ENGINE_DRY": "1",
        "GPU_ENGINE_MODEL": str(model),
        "GPU_ENGINE_WORK": str(tmp_path / "e2e"),
        "PYTHON": PY,
        "DEEPINFER_GIT_SHA": "test",
    }
    proc = subprocess.run(
        ["bash", "scripts/gpu_engine.sh", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    setup = json.loads((tmp_path / "out" / "setup.json").read_text())
    assert setup["checkpoint_sha256"] and setup["versions"]["python"]
    assert (tmp_path / "e2e" / "sites" / "optimized" / "site" / "vllm" / "deepinfer_sm80_level.py").exists()


@pytest.mark.skipif(not (ROOT / ".cache" / "gpu-engine" / "READY").exists(), reason="no GPU engine bundle")
def test_bundle_carries_platform_detection_and_the_drafter() -> None:
    """vLLM finds the CUDA platform through `vllm.third_party.pynvml` (its absence left the device with no
    platform, 2026-12-07), and the carried Markov head belongs to the checkpoint the check compares with."""
    import tarfile

    from deepinfer_sm80.testing.e2e import gpu

    bundle = ROOT / ".cache" / "gpu-engine"
    with tarfile.open(bundle / "vllm-base.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"vllm/third_party/__init__.py", "vllm/third_party/pynvml.py"} <= names
    assert not any(n.endswith(".so") for n in names)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["drafter"]["shard_sha256"] == gpu.CPU_SHARD_SHA256
    assert (bundle / "drafter.safetensors").exists()


def test_a_failed_engine_names_the_error_vllm_logged_before_its_generic_one() -> None:
    from deepinfer_sm80.testing.e2e.gpu import with_root_cause

    logged = [
        "(MainProcess pid=1) ERROR 12-07 [registry.py:1120] Traceback (most recent call last):",
        "(MainProcess pid=1) ERROR 12-07 [registry.py:1120] AttributeError: no attribute 'supports_x'",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
    ]
    error = logged[-1]
    assert (
        with_root_cause(logged, error) == f"root cause: AttributeError: no attribute 'supports_x' | {error}"
    )
    # nothing logged before the traceback, or the same error: unchanged
    assert with_root_cause(logged[2:], error) == error
    assert with_root_cause(
        ["ValueError: a", "Traceback (most recent call last):", "ValueError: a"], "ValueError: a"
    ) == ("ValueError: a")


def test_a_short_device_sha_is_recorded_as_the_full_commit() -> None:
    import subprocess

    from deepinfer_sm80.testing.e2e.gpu import full_sha

    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    if len(head) == 40:  # a checkout with history
        assert full_sha(head[:7]) == head and full_sha(head) == head
    assert full_sha("not-a-sha") == "not-a-sha" and full_sha("") == ""
