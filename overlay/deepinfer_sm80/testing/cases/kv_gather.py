"""Cases of the KV gather (row `kv_gather`, ops/kv_gather.py): the named interpreter cases its test runs base
and optimized over (and their input builder), the entry-point A/B compressed-cache shapes, and the bitwise
cases against upstream's Triton gather (sm_89+) that bench/kv_gather.py records in its JSON and
tests/ops/test_kv_gather.py asserts.

Equality contract: bitwise on the whole `out` (it starts as random bits, so rows outside a gather must
survive untouched), against the torch reference and upstream's own kernel, but for one interpreter
artefact (`comparable`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from deepinfer_sm80.testing import kv_cache_shapes as kc
from deepinfer_sm80.testing.cases.entry_point import Shape, bitwise
from deepinfer_sm80.testing.cases.upstream_records import bitwise_record


@dataclass(frozen=True)
class Case:
    name: str  # the seed
    seq_lens: tuple[int, ...]
    gather_lens: tuple[int, ...] | None = None  # None: compressed-cache call (whole sequences)
    block_size: int = 32
    offset: int = 0
    spare_rows: int = 5  # out rows past the longest gather
    out_row_stride: int = 512  # > 512: each out row is a slice of a wider workspace row
    table_pad: int = 0  # > 0: block_table is a column slice of a wider table (stride(0) > shape[1])
    table_dtype: torch.dtype = torch.int32
    layers_per_block: int = 1
    max_gather_len: int | None = None


CASES = [
    Case("single-token", (1,)),
    Case("compressed-bs128", (300,), block_size=128),
    Case("compressed-bs64-two-reqs", (70, 129), block_size=64, max_gather_len=129),
    Case("swa-offset", (40, 500, 7), (33, 127, 7), offset=11),
    Case("zero-length", (0, 50, 20), (0, 50, 0), block_size=64),
    Case("strided-out", (45, 3), (20, 3), offset=4, out_row_stride=1024),
    Case("strided-table-int64", (90, 33), table_pad=3, table_dtype=torch.int64),
    Case("shared-block", (77,), (61,), layers_per_block=3),
    Case("max-gather-len-too-small", (150,), block_size=32, max_gather_len=1),
]

Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]


def gather_inputs(
    case: Case, device: str, seed: int | None = None, *, with_zero_scale: bool = True
) -> Inputs:
    """(out, k_cache, seq_lens, gather_lens, block_table) on `device`, drawn on the CPU from crc32(case.name)
    unless a (hypothesis) seed is given. Data bytes are uniform over all 256 codes (NaN codes included);
    RoPE halves are random bits plus NaN, ±inf and -0."""
    from deepinfer_sm80.formats.fp8_ds_mla import make_k_cache, token_views
    from deepinfer_sm80.testing.inputs import generator, scale_bytes

    gen = generator(case.name) if seed is None else torch.Generator().manual_seed(seed)
    bs, reqs = case.block_size, len(case.seq_lens)
    blocks_per_req = [-(-s // bs) for s in case.seq_lens]
    num_blocks = sum(blocks_per_req) + 2
    cache = make_k_cache(
        num_blocks,
        bs,
        layers_per_block=case.layers_per_block,
        layer=case.layers_per_block - 1,
        device=device,
        generator=gen,
    )
    data, scale = token_views(cache, bs)
    scale[..., :7] = scale_bytes((num_blocks, bs, 7), gen, with_zero=with_zero_scale)
    rope = data[..., 448:].view(torch.int16)
    for col, value in enumerate((float("nan"), float("inf"), float("-inf"), -0.0)):
        rope[:, ::3, col] = torch.tensor(value, dtype=torch.bfloat16).view(torch.int16)

    width = max(max(blocks_per_req), 1)
    table = torch.full((reqs, width + 2 * case.table_pad), -7, dtype=case.table_dtype)
    perm = torch.randperm(num_blocks, generator=gen)
    start = 0
    for r, nb in enumerate(blocks_per_req):
        table[r, case.table_pad : case.table_pad + nb] = perm[start : start + nb].to(case.table_dtype)
        start += nb
    table = table.to(device)[:, case.table_pad : case.table_pad + width]

    gathered = case.gather_lens or case.seq_lens
    rows = case.offset + max(gathered) + case.spare_rows
    out = torch.randint(
        -(2**15), 2**15, (reqs + 1, rows, case.out_row_stride), dtype=torch.int16, generator=gen
    )
    out = out.to(device).view(torch.bfloat16)[:reqs, :, :512]  # slice after the move: .to() would pack it
    seq_lens = torch.tensor(case.seq_lens, dtype=torch.int32, device=device)
    gather_lens = (
        None if case.gather_lens is None else torch.tensor(case.gather_lens, dtype=torch.int32, device=device)
    )
    return out, cache, seq_lens, gather_lens, table


def gather(fn: Callable[..., Any], case: Case, inputs: Inputs) -> None:
    """`fn` (upstream's signature) into the inputs' `out` at the case's block size, offset and limit."""
    fn(*inputs, case.block_size, case.offset, max_gather_len=case.max_gather_len)


def upstream_gather(cu: Any, want: torch.Tensor, case: Case, inputs: Inputs) -> None:
    """Upstream's Triton path (module `cu`; the CuTeDSL one is sm_90-only) into `want`. Its row stride is
    shape[-1], so it gets a contiguous table: the strided-table case checks ours against the same blocks."""
    _, cache, seq_lens, gather_lens, table = inputs
    gathered = case.gather_lens or case.seq_lens
    cu.dequantize_and_gather_k_cache_triton(
        want,
        cache,
        seq_lens,
        gather_lens,
        table.contiguous(),
        case.block_size,
        case.offset,
        max_gather_len=max(max(gathered), 1),
    )


def comparable(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Under TRITON_INTERPRET the fp32->bf16 cast of an fp32 *subnormal* is wrong (triton/runtime/
    interpreter.py `_convert_float` renormalises, then clamps the exponent), so those outputs - only
    scale bytes <= 9, never written by an encoder - are compared on the GPU alone."""
    from deepinfer_sm80.testing.gates import interpreting

    if not interpreting():
        return out
    bits = ref.view(torch.int16)
    subnormal = ((bits & 0x7F80) == 0) & ((bits & 0x7F) != 0)
    return torch.where(subnormal, ref, out)


UPSTREAM_CASES = (  # (name, seq_lens, gather_lens or None, block_size, offset)
    ("swa-3req-offset", [40, 500, 7], [33, 127, 7], 32, 11),
    ("compressed-bs128", [3000], None, 128, 0),
    ("compressed-bs64-2req", [700, 129], None, 64, 0),
    ("zero-length", [0, 50], [0, 20], 32, 5),
    ("48K", [49_152], None, 128, 0),
)


def entry_point_shapes(quick: bool) -> Iterator[Shape]:
    from deepinfer_sm80.testing.bench import input_sets_needed
    from deepinfer_sm80.testing.inputs import generator

    for tokens in (4_096,) if quick else (4_096, 49_152, 131_072):
        bs = kc.GATHER_BLOCK_SIZE
        n_bytes = tokens * kc.GATHER_BYTES_PER_TOKEN
        n_sets = input_sets_needed(n_bytes, limit=16)

        def make(tokens: int = tokens, bs: int = bs, n_sets: int = n_sets) -> Callable[..., Any]:
            gen = generator(f"ab-kv-gather-{tokens}", "cuda")
            blocks = -(-tokens // bs) + 1
            sets = [
                (kc.random_pool(blocks, bs, gen, valid=True), kc.block_table_for([tokens], blocks, bs, gen))
                for _ in range(n_sets)
            ]
            seq = torch.tensor([tokens], dtype=torch.int32, device="cuda")
            outs: dict[tuple[int, int], torch.Tensor] = {}

            def run(fn: Callable[..., Any], i: int) -> Any:
                if (id(fn), i) not in outs:
                    outs[(id(fn), i)] = torch.zeros(1, tokens, 512, dtype=torch.bfloat16, device="cuda")
                out = outs[(id(fn), i)]
                pool, table = sets[i]
                fn(out, pool, seq, None, table, bs, 0, max_gather_len=tokens)
                return out

            return run

        yield Shape(f"compressed-{tokens // 1024}k", tokens, n_bytes, make, n_sets, bitwise)


def upstream_bitwise(cu: Any, gen: Any) -> dict[str, object]:
    """Base, optimized and the torch reference vs upstream's `dequantize_and_gather_k_cache_triton` (module
    `cu`) into poisoned outputs with spare rows: SWA with an offset, compressed pages, zero lengths, 48K."""
    from deepinfer_sm80.ops import kv_gather as kvg
    from deepinfer_sm80.testing.inputs import block_table, page_pool

    out: dict[str, object] = {}
    for name, seq, gather, bs, offset in UPSTREAM_CASES:
        num_blocks = sum(-(-s // bs) for s in seq) + 3
        cache = page_pool(num_blocks, bs, gen, device="cuda", valid=False)
        table = block_table(seq, num_blocks, bs, gen, device="cuda")
        lens = gather or seq
        rows = offset + max(lens) + 9
        poison = torch.randint(
            -(2**15), 2**15, (len(seq), rows, 512), dtype=torch.int16, device="cuda", generator=gen
        ).view(torch.bfloat16)
        seq_t = torch.tensor(seq, dtype=torch.int32, device="cuda")
        gl_t = None if gather is None else torch.tensor(gather, dtype=torch.int32, device="cuda")
        outs = {n: poison.clone() for n in ("upstream", "base", "optimized", "reference")}
        cu.dequantize_and_gather_k_cache_triton(
            outs["upstream"], cache, seq_t, gl_t, table, bs, offset, max_gather_len=max(lens)
        )
        kvg.base_dequantize_and_gather_k_cache(
            outs["base"], cache, seq_t, gl_t, table, bs, offset, max_gather_len=max(lens)
        )
        kvg.dequantize_and_gather_k_cache(outs["optimized"], cache, seq_t, gl_t, table, bs, offset)
        kvg.dequantize_and_gather_ref(outs["reference"], cache, seq_t, gl_t, table, bs, offset)
        out[name] = {
            n: bitwise_record(f"gather {n} {name}", outs[n], outs["upstream"])
            for n in ("base", "optimized", "reference")
        }
    return out


ENTRY_POINT_CASES = {"kv_gather": entry_point_shapes}
