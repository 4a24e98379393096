"""Cases of the KV gather (row `kv_gather`, ops/kv_gather.py): the entry-point A/B compressed-cache shapes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from deepinfer_sm80.testing.cases.entry_point import Shape, bitwise


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


ENTRY_POINT_CASES = {"kv_gather": entry_point_shapes}
