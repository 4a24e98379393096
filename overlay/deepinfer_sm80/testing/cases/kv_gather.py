"""Cases of the KV gather (row `kv_gather`, ops/kv_gather.py): the entry-point A/B compressed-cache shapes,
and the bitwise cases against upstream's Triton gather (sm_89+) that bench/kv_gather.py records in its JSON
and tests/ops/test_kv_gather.py asserts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from deepinfer_sm80.testing.cases.entry_point import Shape, bitwise
from deepinfer_sm80.testing.cases.upstream_records import bitwise_record

UPSTREAM_CASES = (  # (name, seq_lens, gather_lens or None, block_size, offset)
    ("swa-3req-offset", [40, 500, 7], [33, 127, 7], 32, 11),
    ("compressed-bs128", [3000], None, 128, 0),
    ("compressed-bs64-2req", [700, 129], None, 64, 0),
    ("zero-length", [0, 50], [0, 20], 32, 5),
    ("48K", [49_152], None, 128, 0),
)


def entry_point_shapes(quick: bool) -> Iterator[Shape]:
    import torch

    from deepinfer_sm80.bench import _kv_cache as kc
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
    import torch

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
