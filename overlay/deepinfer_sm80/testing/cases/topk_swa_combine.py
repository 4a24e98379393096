"""Cases of the top-k / SWA index combiner (row `topk_swa_combine`): the entry-point A/B chunk shapes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from deepinfer_sm80.testing.cases.entry_point import Shape, bitwise


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
