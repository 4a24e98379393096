"""JIT warm-up at the DeepInfer level (integration/warmup.py): upstream's registry takes the overlay's entry,
the combiner's keys cover Triton's specialization classes, and every `register_warmup` upstream makes while
building a V4.1 model with the SM8x layer is accounted for (a new one in the pinned tree fails here)."""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm.model_executor.warmup.jit_warmup")

from deepinfer_sm80 import bindings
from deepinfer_sm80.integration import warmup as wu

FP8_TOKENS = re.compile(r"float8|fp8|e4m3|e5m2")


def test_int_classes_are_tritons():
    assert [wu.specialization(v) for v in wu.INT_CLASS_VALUES] == ["constexpr", "D", ""]
    assert wu.int_classes([3, 5, 32, 48, 1]) == (3, 32, 1)


def test_combine_keys_cover_every_class():
    keys = wu.combine_keys(1, 512, 128, 512)
    assert len(keys) == len(set(keys)) == 6 * 9  # (tokens, requests <= tokens) x M x N
    for field in ("tokens", "m", "n"):
        assert {wu.specialization(getattr(k, field)) for k in keys} == {"constexpr", "D", ""}
    swa_only = wu.combine_keys(0, 0, 128, 512)
    assert {k.n for k in swa_only} == {0} and len(swa_only) == 6 * 3


def test_combine_warm_launch_runs():
    """A key's launch writes the rows the op's reference gives for the same inputs (interpreter on CPU)."""
    from deepinfer_sm80.ops import topk_swa_combine as tsc

    seen = []
    real = tsc.launch

    def spy(indices, lens, *args, **kw):
        real(indices, lens, *args, **kw)
        seen.append((indices.clone(), lens.clone(), args))

    mp = pytest.MonkeyPatch()
    mp.setattr(tsc, "launch", spy)
    try:
        wu.launch_combine(wu.CombineKey(1, 32, 128, 32, tokens=17, requests=16, m=17, n=16))
    finally:
        mp.undo()
    (indices, lens, (topk, qsl, seq, gather, window, ratio, top_k, m, n)) = seen[0]
    want = tsc.combine_topk_swa_indices_ref(topk, qsl, seq, gather, window, ratio, top_k, m, n)
    assert torch.equal(indices, want[0]) and torch.equal(lens, want[1])


def test_upstream_registry_takes_and_dedupes_the_entry(monkeypatch):
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry

    compiled = []
    monkeypatch.setattr(wu, "launch_combine", compiled.append)
    registry = JitWarmupRegistry(SimpleNamespace())
    with registry.activate():
        for _ in range(3):  # three layers of one ratio class: one registration
            JitWarmupRegistry.register(wu.OVERLAY_WARMUP, combine=(2, 512, 128, 512))
        JitWarmupRegistry.register(wu.OVERLAY_WARMUP, combine=(0, 0, 128, 512))
    assert len(registry) == 2
    registry.warmup()
    assert len(compiled) == 6 * 9 + 6 * 3 and len(set(compiled)) == len(compiled)


def _layer(ratio: int) -> SimpleNamespace:
    return SimpleNamespace(
        compress_ratio=ratio, window_size=128, max_num_batched_tokens=64,
        topk_indices_buffer=torch.empty(64, 512, dtype=torch.int32),
    )  # fmt: skip


@pytest.mark.parametrize("level", ["base", "optimized"])
def test_register_layer_only_at_the_optimized_level(monkeypatch, level):
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry

    if level == "optimized":
        monkeypatch.setitem(sys.modules, bindings.LEVEL_MARKER, SimpleNamespace(LEVEL="optimized"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # mHC warm-up needs a GPU (nvcc)
    config = SimpleNamespace(kernel_config=SimpleNamespace(enable_jit_warmup=True))
    registry = JitWarmupRegistry(config)
    with registry.activate():
        wu.register_layer(_layer(1), config)
        wu.register_layer(_layer(0), config)
    assert len(registry) == (2 if level == "optimized" else 0)
    off = SimpleNamespace(kernel_config=SimpleNamespace(enable_jit_warmup=False))
    registry = JitWarmupRegistry(off)
    with registry.activate():
        wu.register_layer(_layer(1), off)
    assert len(registry) == 0


def _tree() -> Path:
    import vllm

    return Path(vllm.__file__).resolve().parent


def _kernel_source(tree: Path, name: str) -> tuple[str, str]:
    """(module, source of the kernel's class or decorated function) for a module-level kernel name."""
    import importlib

    for path in sorted(tree.rglob("*.py")):
        text = path.read_text(errors="replace")
        module = ".".join(("vllm", *path.relative_to(tree).with_suffix("").parts))
        if re.search(rf"^{name}\s*(:[^=]*)?=", text, re.M):  # an instance of a kernel class
            return module, inspect.getsource(type(getattr(importlib.import_module(module), name)))
        found = re.search(rf"^def {name}\(.*?(?=^(?:def |class |@|_[A-Z_]+ =)|\Z)", text, re.M | re.S)
        if found:  # a decorated kernel function: its own text (the decorator returns a wrapper object)
            importlib.import_module(module)
            return module, found.group(0)
    raise AssertionError(f"{name}: no definition in the tree")


def test_every_upstream_registration_is_accounted_for():
    tree = _tree()
    listed = {(r.site, r.kernel) for r in wu.UPSTREAM_REGISTRATIONS}
    found = set()
    for rel in wu.REGISTRATION_FILES:
        text = (tree / rel).read_text()
        assert ").register_warmup(" not in text, f"{rel}: a chained registration the scan cannot name"
        found |= {(rel, m) for m in re.findall(r"(\w+)\.register_warmup\(", text)}
    assert found == listed, f"unlisted: {sorted(found - listed)}; stale: {sorted(listed - found)}"


@pytest.mark.parametrize(
    "reg", [r for r in wu.UPSTREAM_REGISTRATIONS if r.status == "sm80-safe"], ids=lambda r: r.kernel
)
def test_sm80_safe_registrations_have_no_fp8(reg):
    """The kernels whose warm-up runs unchanged on SM8x name no fp8 type (the sm_89+ conversions)."""
    try:
        module, source = _kernel_source(_tree(), reg.kernel)
    except ImportError as exc:
        pytest.skip(f"{reg.kernel}: its module does not import here ({exc})")
    assert len(source) > 200, f"{reg.kernel}: found too little source in {module}"
    assert not FP8_TOKENS.search(source), f"{reg.kernel} ({module}) names an fp8 type"


def test_wrapped_registrations_have_rows():
    wrapped = {r.kernel for r in wu.UPSTREAM_REGISTRATIONS if r.status == "wrapped"}
    rows = {b.symbol.split(".")[0] for b in bindings.BINDINGS if b.symbol.endswith(".register_warmup")}
    assert wrapped <= rows
