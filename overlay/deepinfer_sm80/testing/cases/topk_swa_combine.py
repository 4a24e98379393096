"""Cases of the top-k / SWA index combiner (row `topk_swa_combine`, ops/topk_swa_combine.py): the named
prefill chunks its test runs over (and their argument builder), the token-by-token spec loop of
docs/OPERATORS.md, upstream's kernel read from the installed vLLM 0.32.0 for the interpreter, and the
entry-point A/B chunk shapes.

Equality contract: bitwise, lens and indices, against the op-chain reference, the spec loop and upstream's
own kernel; outputs start poisoned (`POISON`), so every column must be written. With a reused `out=`,
upstream keeps its stale columns: there the contract is equality inside [0, lens)."""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from deepinfer_sm80.testing.cases.entry_point import Shape, bitwise


@dataclass(frozen=True)
class V41:
    """The combiner's model constants (docs/MODEL.md): indexer top-k, sliding window, compress ratios."""

    topk: int = 512
    window: int = 128
    ratios: tuple[int, ...] = (0, 1, 2)


SHAPES = V41()
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
STRIDED_CHUNK = CHUNKS[8]  # odd-T123: int64 metadata and top-k rows of stride 1024
REUSE_LONG = Chunk("long", (40, 24), (3000, 1200))  # then REUSE_SHORT into the same out=
REUSE_SHORT = Chunk("short", (40, 24), (3, 60))  # same T, shorter lens
EMPTY_CHUNK = Chunk("empty", (0,), (10,))


def chunk_args(chunk: Chunk, ratio: int, device: str, seed: int = 0) -> dict[str, Any]:
    """Kernel arguments on `device`; top-k values mix valid entries, -1, >= N and other negatives."""
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

    def i32(v: list[int]) -> torch.Tensor:
        return torch.tensor(v, dtype=torch.int32, device=device)

    return dict(
        topk_indices=tk.to(device),
        query_start_loc=i32(qsl),
        seq_lens=i32(seq),
        gather_lens=i32(list(gather)),
        window_size=SHAPES.window,
        compress_ratio=ratio,
        topk=topk,
        M=N + SHAPES.window + T + 11,
        N=N,
    )


def spec_loop(a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """docs/OPERATORS.md transcribed token by token in Python ints; rows outside every request: -1, lens 0."""
    from deepinfer_sm80.ops.topk_swa_combine import combined_width

    tk = a["topk_indices"].tolist()
    qsl, seq, gl = (a[k].tolist() for k in ("query_start_loc", "seq_lens", "gather_lens"))
    ratio, topk, window, M, N = (a[k] for k in ("compress_ratio", "topk", "window_size", "M", "N"))
    T, W = len(tk), combined_width(topk, window)
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


def poisoned_out(a: dict[str, Any], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices, lens) for `out=` filled with POISON: a column the kernel skips shows."""
    from deepinfer_sm80.ops.topk_swa_combine import combined_width

    T, W = a["topk_indices"].shape[0], combined_width(a["topk"], a["window_size"])
    return (
        torch.full((T, W), POISON, dtype=torch.int32, device=device),
        torch.full((T,), POISON, dtype=torch.int32, device=device),
    )


# ----------------------------------------------------------------------------- upstream's kernel (CPU)
def _vllm_root() -> Path | None:
    spec = importlib.util.find_spec("vllm")  # locates the package without importing it
    return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None


def upstream_kernel_module(dest: Path) -> Path | None:
    """Write upstream's `CombineTopkSwaIndicesKernel.kernel` (decorator `triton.jit(...)` kept) to dest;
    None where vLLM 0.32.0's source is not installed."""
    root = _vllm_root()
    if root is None or not root.joinpath(*UPSTREAM_FILE).exists():
        return None
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


def interpreted_upstream(path: Path) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """Upstream's `combine_topk_swa_indices` around its kernel loaded from `path` (upstream_kernel_module)."""
    import triton

    from deepinfer_sm80.ops.topk_swa_combine import combined_width

    spec = importlib.util.spec_from_file_location("upstream_combine_kernel", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def run(**a: Any) -> tuple[torch.Tensor, torch.Tensor]:
        # upstream's launcher: fresh output filled with -1, lens from torch.empty, grid (R, 256)
        tk = a["topk_indices"]
        T, W = tk.shape[0], combined_width(a["topk"], a["window_size"])
        idx = torch.full((T, W), -1, dtype=torch.int32)
        lens = torch.full((T,), POISON, dtype=torch.int32)
        mod.kernel[(a["seq_lens"].shape[0], 256)](
            idx, idx.stride(0), lens, tk, tk.stride(0), a["query_start_loc"], a["seq_lens"],
            a["gather_lens"], a["M"], a["N"], TOP_K=a["topk"], COMPRESS_RATIO=a["compress_ratio"],
            WINDOW_SIZE=a["window_size"], PADDED_TOP_K=triton.next_power_of_2(tk.shape[-1]),
        )  # fmt: skip
        return idx, lens

    return run


def entry_point_shapes(quick: bool) -> Iterator[Shape]:
    from deepinfer_sm80.bench import topk_swa_combine as bc
    from deepinfer_sm80.testing.bench import input_sets_needed
    from deepinfer_sm80.testing.inputs import generator

    for tokens, ratio in ((512, 1),) if quick else ((64, 1), (512, 1), (1_536, 2), (4_096, 1)):
        gen = generator(f"ab-combine-{tokens}-{ratio}")  # the combiner builder draws on the CPU
        probe = bc.chunk(tokens, ratio, gen)
        n_bytes = bc.bytes_moved(probe)
        n_sets = input_sets_needed(n_bytes, limit=16)

        def make(tokens: int = tokens, ratio: int = ratio, n_sets: int = n_sets) -> Callable[..., Any]:
            gen = generator(f"ab-combine-{tokens}-{ratio}")  # the combiner builder draws on the CPU
            sets = [bc.chunk(tokens, ratio, gen) for _ in range(n_sets)]

            def run(fn: Callable[..., Any], i: int) -> Any:
                return fn(**bc.args(sets[i]))  # out=None: both write every column

            return run

        yield Shape(f"r{ratio}-T{tokens}", tokens, n_bytes, make, n_sets, bitwise)


ENTRY_POINT_CASES = {"topk_swa_combine": entry_point_shapes}
