"""Cases of the KV insert (row `kv_insert`, ops/kv_quant_insert.py): the entry-point A/B prefill shapes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from deepinfer_sm80.testing.cases.entry_point import Shape, bitwise


def entry_point_shapes(quick: bool) -> Iterator[Shape]:
    from deepinfer_sm80.bench import _kv_cache as kc
    from deepinfer_sm80.testing.bench import input_sets_needed
    from deepinfer_sm80.testing.inputs import avoid_seven_pow2, generator

    # amax = 7·2^j groups may round to either exponent (docs/FP8_DS_MLA.md): nudged, as the bench does
    for tokens in (64,) if quick else (1, 64, 1_536, 8_192):
        bs, n_bytes = kc.INSERT_BLOCK_SIZE, tokens * kc.INSERT_BYTES_PER_TOKEN
        n_sets = input_sets_needed(n_bytes)

        def make(tokens: int = tokens, bs: int = bs, n_sets: int = n_sets) -> Callable[..., Any]:
            gen = generator(f"ab-kv-insert-{tokens}", "cuda")
            blocks = -(-tokens // bs) + 2
            sets = [
                (avoid_seven_pow2(kc.random_k(tokens, gen)), kc.random_pool(blocks, bs, gen, valid=True),
                 kc.prefill_slots(tokens, blocks, bs, gen))
                for _ in range(n_sets)
            ]  # fmt: skip
            pools = {}

            def run(fn: Callable[..., Any], i: int) -> Any:
                k, pool, slots = sets[i]
                if (id(fn), i) not in pools:  # per-level copies, made before capture (never inside it)
                    pools[(id(fn), i)] = pool.clone()
                target = pools[(id(fn), i)]
                fn(k, target, slots, bs)
                return target

            return run

        yield Shape(f"prefill-T{tokens}", tokens, n_bytes, make, n_sets, bitwise)


ENTRY_POINT_CASES = {"kv_insert": entry_point_shapes}
