"""combine_topk_swa_indices: kernel vs op-chain reference vs docs/OPERATORS.md loop vs upstream's own kernel.

Upstream's kernel is read from the installed vLLM 0.32.0 at test time (never copied into the tree):
on a GPU the real function runs, on CPU its `@triton.jit` body runs under the interpreter.
Chunks, the argument builder, the spec loop and upstream's kernel: testing/cases/topk_swa_combine.py.
"""

import inspect
import json
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_sm80.ops import topk_swa_combine as tsc
from deepinfer_sm80.testing.cases.topk_swa_combine import (
    CHUNKS,
    EMPTY_CHUNK,
    REUSE_LONG,
    REUSE_SHORT,
    SHAPES,
    STRIDED_CHUNK,
    UPSTREAM_CHUNKS,
    Chunk,
    chunk_args,
    interpreted_upstream,
    poisoned_out,
    spec_loop,
    upstream_kernel_module,
)
from deepinfer_sm80.testing.compare import assert_bitwise_equal
from deepinfer_sm80.testing.gates import test_device

DEV = test_device()


def make_args(chunk: Chunk, ratio: int, seed: int = 0) -> dict:
    return chunk_args(chunk, ratio, DEV, seed)


def check(name: str, got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> None:
    assert_bitwise_equal(f"{name} lens", got[1].cpu(), want[1].cpu())
    assert_bitwise_equal(f"{name} indices", got[0].cpu(), want[0].cpu())


# ----------------------------------------------------------------------------- upstream
def upstream_kernel(dest):
    path = upstream_kernel_module(dest)
    if path is None:
        pytest.skip("vLLM 0.32.0 source is not installed here")
    return path


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """Upstream's combine_topk_swa_indices: the real one on a GPU, its kernel interpreted on CPU."""
    if DEV == "cuda":
        try:
            import vllm.models.deepseek_v41.common.ops.cache_utils as cu
        except ImportError:
            pytest.skip("vLLM is not importable here")
        return cu.combine_topk_swa_indices
    return interpreted_upstream(upstream_kernel(tmp_path_factory.mktemp("upstream")))


def test_signature_matches_upstream():
    cu = pytest.importorskip("vllm.models.deepseek_v41.common.ops.cache_utils")
    want = inspect.signature(cu.combine_topk_swa_indices, eval_str=True)
    assert inspect.signature(tsc.combine_topk_swa_indices, eval_str=True) == want
    assert inspect.signature(tsc.combine_topk_swa_indices_ref, eval_str=True) == want


def test_sm80_baseline_is_upstream_own_kernel(tmp_path):
    # The decision recorded in the module docstring: upstream's kernel compiles for sm_80/86 as is,
    # so its binding row keeps upstream's own kernel at the base level.
    from deepinfer_sm80.bindings import BINDINGS

    (row,) = [b for b in BINDINGS if b.symbol == "combine_topk_swa_indices"]
    assert row.base is None and row.target("base") is None
    path = upstream_kernel(tmp_path)
    script = f"""
import json, sys
sys.path.insert(0, {str(path.parent)!r})
from upstream_combine_kernel import kernel
from deepinfer_sm80.registry import CompileSpec
from deepinfer_sm80.testing.crosscompile import compile_for
sig = {{p: "*i32" if p.endswith("_ptr") else "i32" for p in kernel.arg_names}}
sig.update(TOP_K="constexpr", COMPRESS_RATIO="constexpr", WINDOW_SIZE="constexpr", PADDED_TOP_K="constexpr")
out = []
for ratio, topk in ((0, 0), (1, 512), (2, 512)):
    c = dict(TOP_K=topk, COMPRESS_RATIO=ratio, WINDOW_SIZE=128, PADDED_TOP_K=512)
    for arch in (80, 86):
        out.append(compile_for(CompileSpec(f"upstream.r{{ratio}}", kernel, sig, c), arch).as_dict())
print(json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(reports) == 6
    assert all(not r["problems"] and r["spill_bytes"] == 0 and not r["uses_hw_fp8"] for r in reports), reports


# ----------------------------------------------------------------------------- exact tests
def test_widths():
    assert tsc.combined_width(SHAPES.topk, SHAPES.window) == 640
    assert tsc.combined_width(0, SHAPES.window) == 128


@pytest.mark.parametrize("chunk", CHUNKS, ids=lambda c: c.name)
def test_reference_matches_spec_loop(chunk):
    for ratio in SHAPES.ratios:
        a = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in make_args(chunk, ratio).items()}
        check(f"{chunk.name} r{ratio} ref vs loop", tsc.combine_topk_swa_indices_ref(**a), spec_loop(a))


@pytest.mark.parametrize("chunk", CHUNKS, ids=lambda c: c.name)
def test_kernel_matches_reference(chunk):
    for ratio in SHAPES.ratios:
        a = make_args(chunk, ratio, seed=ratio)
        ref = tsc.combine_topk_swa_indices_ref(**a)
        if ratio == 2:  # the fresh-output path once; poisoned out= shows every column is written
            check(f"{chunk.name} r{ratio} fresh", tsc.combine_topk_swa_indices(**a), ref)
        out = poisoned_out(a, DEV)
        got = tsc.combine_topk_swa_indices(**a, out=out)
        assert got[0] is out[0] and got[1] is out[1]
        check(f"{chunk.name} r{ratio} poisoned out=", got, ref)


@pytest.mark.parametrize("chunk", UPSTREAM_CHUNKS, ids=lambda c: c.name)
def test_kernel_matches_upstream(chunk, upstream):
    ratio = SHAPES.ratios[len(chunk.name) % 3] if DEV == "cpu" else None  # interpreter: one ratio each
    for r in [ratio] if ratio is not None else SHAPES.ratios:
        a = make_args(chunk, r, seed=7)
        check(f"{chunk.name} r{r} vs upstream", tsc.combine_topk_swa_indices(**a), upstream(**a))


def test_out_reuse_overwrites_stale_rows(upstream):
    long = make_args(REUSE_LONG, 2, seed=1)
    short = make_args(REUSE_SHORT, 2, seed=2)
    out = tsc.combine_topk_swa_indices(**long)
    tsc.combine_topk_swa_indices(**short, out=out)
    check("reuse vs reference", out, tsc.combine_topk_swa_indices_ref(**short))
    # upstream's contract with out=: equal inside [0, lens) (its stale columns stay)
    up = upstream(**short)
    assert_bitwise_equal("reuse lens vs upstream", out[1].cpu(), up[1].cpu())
    inside = torch.arange(out[0].shape[1]) < out[1].cpu()[:, None]
    assert torch.equal(out[0].cpu()[inside], up[0].cpu()[inside])


def test_int64_metadata_and_strided_topk_rows():
    a = make_args(STRIDED_CHUNK, 1, seed=3)
    ref = tsc.combine_topk_swa_indices_ref(**a)
    wide = torch.full((a["topk_indices"].shape[0], 1024), -9, dtype=torch.int32, device=DEV)
    wide[:, :512] = a["topk_indices"]
    meta64 = {k: a[k].long() for k in ("query_start_loc", "seq_lens", "gather_lens")}
    b = a | {"topk_indices": wide[:, :512]} | meta64
    check("int64 metadata, row stride 1024", tsc.combine_topk_swa_indices(**b), ref)


def test_empty_chunk():
    a = make_args(EMPTY_CHUNK, 1)
    idx, lens = tsc.combine_topk_swa_indices(**a)
    assert idx.shape == (0, 640) and lens.shape == (0,)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"topk_indices": torch.zeros(4, 512, dtype=torch.int64)}, "topk_indices"),
        ({"topk_indices": torch.zeros(4, 100, dtype=torch.int32)}, "fewer than topk"),
        ({"compress_ratio": 4}, "compress_ratio"),
        ({"seq_lens": torch.zeros(3, dtype=torch.int32)}, "query_start_loc must be"),
        ({"gather_lens": torch.zeros(1, dtype=torch.float32)}, "gather_lens"),
        ({"out": (torch.zeros(4, 512, dtype=torch.int32), torch.zeros(4, dtype=torch.int32))}, r"out\[0\]"),
        ({"out": (torch.zeros(4, 640, dtype=torch.int32), torch.zeros(5, dtype=torch.int32))}, r"out\[1\]"),
    ],
)
def test_launcher_rejects(change, match):
    a = {
        "topk_indices": torch.zeros(4, 512, dtype=torch.int32),
        "query_start_loc": torch.tensor([0, 4], dtype=torch.int32),
        "seq_lens": torch.tensor([9], dtype=torch.int32),
        "gather_lens": torch.tensor([9], dtype=torch.int32),
        "window_size": 128, "compress_ratio": 1, "topk": 512, "M": 700, "N": 9,
    }  # fmt: skip
    with pytest.raises(ValueError, match=match):
        tsc.combine_topk_swa_indices(**(a | change))


# ----------------------------------------------------------------------------- fuzzing
@st.composite
def chunks(draw):
    n = draw(st.integers(1, 5))
    qlens = tuple(draw(st.lists(st.integers(0, 90), min_size=n, max_size=n)))
    prefix = tuple(draw(st.lists(st.integers(0, 1400), min_size=n, max_size=n)))
    mode = draw(st.sampled_from(["swa", "full", "replay"]))
    seq = [p + q for p, q in zip(prefix, qlens, strict=True)]
    if mode == "full":
        gather = tuple(seq)
    elif mode == "replay":
        gather = tuple(draw(st.integers(0, s)) for s in seq)
    else:
        gather = None
    return Chunk(
        "fuzz", qlens, prefix, gather=gather, qsl_base=draw(st.integers(0, 1 << 20)),
        all_invalid=draw(st.booleans()) and draw(st.booleans()),
    )  # fmt: skip


@settings(max_examples=15, deadline=None)
@given(chunks(), st.sampled_from(SHAPES.ratios), st.integers(0, 1 << 30))
def test_fuzz_kernel_reference_and_spec_loop(chunk, ratio, seed):
    a = make_args(chunk, ratio, seed)
    ref = tsc.combine_topk_swa_indices_ref(**a)
    check("fuzz kernel (poisoned out=)", tsc.combine_topk_swa_indices(**a, out=poisoned_out(a, DEV)), ref)
    cpu = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in a.items()}
    check("fuzz ref vs loop", tuple(x.cpu() for x in ref), spec_loop(cpu))
