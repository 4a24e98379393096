"""combine_topk_swa_indices: kernel vs op-chain reference vs docs/OPERATORS.md loop vs upstream's own kernel.

Upstream's kernel is read from the installed vLLM 0.32.0 at test time (never copied into the tree):
on a GPU the real function runs, on CPU its `@triton.jit` body runs under the interpreter.
"""

import ast
import importlib.util
import inspect
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import triton
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_sm80.ops import topk_swa_combine as tsc
from deepinfer_sm80.testing.compare import assert_bitwise_equal
from deepinfer_sm80.testing.gates import test_device


@dataclass(frozen=True)
class V41:
    """The combiner's model constants (docs/MODEL.md): indexer top-k, sliding window, compress ratios."""

    topk: int = 512
    window: int = 128
    ratios: tuple[int, ...] = (0, 1, 2)


SHAPES = V41()
DEV = test_device()
POISON = 0x5A5A5A5A
UPSTREAM_FILE = ("models", "deepseek_v41", "common", "ops", "cache_utils.py")


@dataclass(frozen=True)
class Chunk:
    """One prefill chunk: request b has prefix[b] cached tokens and qlens[b] new ones."""

    name: str
    qlens: tuple[int, ...]
    prefix: tuple[int, ...]
    gather: tuple[int, ...] | None = None  # None: SWA gather, min(seq, qlen + window - 1)
    qsl_base: int = 0
    extra_rows: int = 0  # topk_indices rows past the last request
    all_invalid: bool = False


CHUNKS = [
    Chunk("pos0", (1,), (0,)),
    Chunk("window-fill", (140,), (0,)),  # pos+1 < 128 and >= 128
    Chunk("prefix-gt-127", (50,), (300,)),
    Chunk("replay", (64,), (1000,), gather=(84,)),  # g0 = 980 > pos - 127
    Chunk("saturate-r2", (40,), (1000,)),  # topk_len reaches 512 at pos 1023 (ratio 2)
    Chunk("saturate-r1", (40,), (490,)),  # ... at pos 511 (ratio 1)
    Chunk("all-topk-invalid", (30, 9), (700, 2000), all_invalid=True),
    Chunk("single-token", (1,), (5000,)),
    Chunk("odd-T123", (50, 1, 72), (10, 700, 3000)),
    Chunk("seq-lt-window", (30,), (20,)),
    Chunk("qsl0-nonzero", (17, 33), (100, 2000), qsl_base=123_456),
    Chunk("empty-requests", (0, 20, 0, 0, 15, 0), (5, 0, 9, 1000, 130, 7)),
    Chunk("gt-256-per-request", (260,), (900,)),
    Chunk("many-requests", tuple(i % 4 for i in range(70)), tuple(37 * i for i in range(70))),
    Chunk("warmup-negative-pos", (6,), (-4,), gather=(2,)),  # seq_len 2 < qlen 6
    Chunk("rows-past-last-request", (10, 10), (64, 3), extra_rows=5),
]
UPSTREAM_CHUNKS = [c for c in CHUNKS if c.extra_rows == 0 and c.name not in ("many-requests",)]


def make_args(chunk: Chunk, ratio: int, seed: int = 0) -> dict:
    """Kernel arguments on DEV; top-k values mix valid entries, -1, >= N and other negatives."""
    gen = torch.Generator().manual_seed(seed)
    seq = [p + q for p, q in zip(chunk.prefix, chunk.qlens, strict=True)]
    swa_gather = (max(min(s, q + SHAPES.window - 1), 0) for s, q in zip(seq, chunk.qlens, strict=True))
    gather = chunk.gather or tuple(swa_gather)
    topk = SHAPES.topk if ratio else 0
    N = max(max(seq) // ratio, 1) if ratio else 0
    T = sum(chunk.qlens) + chunk.extra_rows
    tk = torch.randint(0, max(N, 1), (T, SHAPES.topk), generator=gen, dtype=torch.int32)
    noise = torch.rand(T, SHAPES.topk, generator=gen)
    tk = torch.where(noise < 0.1, -1, tk)
    tk = torch.where((noise >= 0.1) & (noise < 0.13), N + (noise * 1000).int(), tk)  # >= N
    tk = torch.where((noise >= 0.13) & (noise < 0.15), -7 - (noise * 1000).int(), tk)
    tk = torch.where(noise >= 0.995, N - 1, tk)
    if chunk.all_invalid:
        tk.fill_(-1)
    qsl = [chunk.qsl_base]
    for q in chunk.qlens:
        qsl.append(qsl[-1] + q)

    def i32(v):
        return torch.tensor(v, dtype=torch.int32, device=DEV)

    return dict(
        topk_indices=tk.to(DEV),
        query_start_loc=i32(qsl),
        seq_lens=i32(seq),
        gather_lens=i32(list(gather)),
        window_size=SHAPES.window,
        compress_ratio=ratio,
        topk=topk,
        M=N + SHAPES.window + T + 11,
        N=N,
    )


def spec_loop(a: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """docs/OPERATORS.md transcribed token by token in Python ints; rows outside every request: -1, lens 0."""
    tk = a["topk_indices"].tolist()
    qsl, seq, gl = (a[k].tolist() for k in ("query_start_loc", "seq_lens", "gather_lens"))
    ratio, topk, window, M, N = (a[k] for k in ("compress_ratio", "topk", "window_size", "M", "N"))
    T, W = len(tk), tsc.combined_width(topk, window)
    rows, lens = [[-1] * W for _ in range(T)], [0] * T
    for b in range(len(seq)):
        qs, qe = qsl[b] - qsl[0], qsl[b + 1] - qsl[0]
        g0 = seq[b] - gl[b]
        for t in range(qs, qe):
            pos = seq[b] - (qe - qs) + (t - qs)
            topk_len = max(min((pos + 1) // ratio, topk), 0) if ratio else 0
            swa_start = max(pos - (window - 1), 0, g0)
            swa_len = max(pos - swa_start + 1, 0)
            for j in range(topk_len):
                rows[t][j] = tk[t][j] + M * b if 0 <= tk[t][j] < N else -1
            for i in range(swa_len):
                rows[t][topk_len + i] = M * b + N + (swa_start + i - g0)
            lens[t] = topk_len + swa_len
    return torch.tensor(rows, dtype=torch.int32).reshape(T, W), torch.tensor(lens, dtype=torch.int32)


def poisoned_out(a: dict) -> tuple[torch.Tensor, torch.Tensor]:
    T, W = a["topk_indices"].shape[0], tsc.combined_width(a["topk"], a["window_size"])
    return (
        torch.full((T, W), POISON, dtype=torch.int32, device=DEV),
        torch.full((T,), POISON, dtype=torch.int32, device=DEV),
    )


def check(name: str, got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> None:
    assert_bitwise_equal(f"{name} lens", got[1].cpu(), want[1].cpu())
    assert_bitwise_equal(f"{name} indices", got[0].cpu(), want[0].cpu())


# ----------------------------------------------------------------------------- upstream
def _vllm_root() -> Path | None:
    spec = importlib.util.find_spec("vllm")  # locates the package without importing it
    return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None


def upstream_kernel_module(dest: Path) -> Path:
    """Write upstream's `CombineTopkSwaIndicesKernel.kernel` (decorator `triton.jit(...)` kept) to dest."""
    root = _vllm_root()
    if root is None or not root.joinpath(*UPSTREAM_FILE).exists():
        pytest.skip("vLLM 0.32.0 source is not installed here")
    tree = ast.parse(root.joinpath(*UPSTREAM_FILE).read_text())
    cls = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CombineTopkSwaIndicesKernel"
    )
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "kernel")
    fn.decorator_list = [d for d in fn.decorator_list if "triton.jit" in ast.unparse(d)]
    header = ast.parse("import triton\nimport triton.language as tl\n").body
    path = dest / "upstream_combine_kernel.py"
    path.write_text(ast.unparse(ast.Module(body=[*header, fn], type_ignores=[])))
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
    path = upstream_kernel_module(tmp_path_factory.mktemp("upstream"))
    spec = importlib.util.spec_from_file_location("upstream_combine_kernel", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def run(topk_indices, query_start_loc, seq_lens, gather_lens, window_size, compress_ratio, topk, M, N):
        # upstream's launcher: fresh output filled with -1, lens from torch.empty, grid (R, 256)
        T, W = topk_indices.shape[0], tsc.combined_width(topk, window_size)
        idx = torch.full((T, W), -1, dtype=torch.int32)
        lens = torch.full((T,), POISON, dtype=torch.int32)
        mod.kernel[(seq_lens.shape[0], 256)](
            idx, idx.stride(0), lens, topk_indices, topk_indices.stride(0),
            query_start_loc, seq_lens, gather_lens, M, N, TOP_K=topk, COMPRESS_RATIO=compress_ratio,
            WINDOW_SIZE=window_size, PADDED_TOP_K=triton.next_power_of_2(topk_indices.shape[-1]),
        )  # fmt: skip
        return idx, lens

    return run


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
    path = upstream_kernel_module(tmp_path)
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
        out = poisoned_out(a)
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
    long = make_args(Chunk("long", (40, 24), (3000, 1200)), 2, seed=1)
    short = make_args(Chunk("short", (40, 24), (3, 60)), 2, seed=2)  # same T, shorter lens
    out = tsc.combine_topk_swa_indices(**long)
    tsc.combine_topk_swa_indices(**short, out=out)
    check("reuse vs reference", out, tsc.combine_topk_swa_indices_ref(**short))
    # upstream's contract with out=: equal inside [0, lens) (its stale columns stay)
    up = upstream(**short)
    assert_bitwise_equal("reuse lens vs upstream", out[1].cpu(), up[1].cpu())
    inside = torch.arange(out[0].shape[1]) < out[1].cpu()[:, None]
    assert torch.equal(out[0].cpu()[inside], up[0].cpu()[inside])


def test_int64_metadata_and_strided_topk_rows():
    a = make_args(CHUNKS[8], 1, seed=3)
    ref = tsc.combine_topk_swa_indices_ref(**a)
    wide = torch.full((a["topk_indices"].shape[0], 1024), -9, dtype=torch.int32, device=DEV)
    wide[:, :512] = a["topk_indices"]
    meta64 = {k: a[k].long() for k in ("query_start_loc", "seq_lens", "gather_lens")}
    b = a | {"topk_indices": wide[:, :512]} | meta64
    check("int64 metadata, row stride 1024", tsc.combine_topk_swa_indices(**b), ref)


def test_empty_chunk():
    a = make_args(Chunk("empty", (0,), (10,)), 1)
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
    check("fuzz kernel (poisoned out=)", tsc.combine_topk_swa_indices(**a, out=poisoned_out(a)), ref)
    cpu = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in a.items()}
    check("fuzz ref vs loop", tuple(x.cpu() for x in ref), spec_loop(cpu))
