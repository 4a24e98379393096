"""Upstream vLLM 0.32.0's own Triton functions timed on the GPU at hand (from the carried bundle).

The project's first measurement: `combine_topk_swa_indices` at a T=1536 prefill chunk and the
Triton path of `dequantize_and_gather_k_cache` on the 584-byte record at 16K and 48K tokens.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from deepinfer_sm80.bench.inputs import random_combine_inputs
from deepinfer_sm80.bench.kv_cache import GATHER_BYTES_PER_TOKEN, block_table_for, random_pool
from deepinfer_sm80.testing.bench import Ceilings, format_line, input_sets_needed, summarize, time_graph

GATHER_TOKENS = (16_384, 49_152)
GATHER_BLOCK_SIZE = 64
COMBINE_T = 1536
COMBINE_REQUESTS = 4
COMBINE_PREFIX = 8192


def _bench_combine(cu: object, ratio: int, ceilings: Ceilings, gen: torch.Generator) -> dict[str, object]:
    q = COMBINE_T // COMBINE_REQUESTS
    one = random_combine_inputs(
        [q] * COMBINE_REQUESTS,
        [COMBINE_PREFIX] * COMBINE_REQUESTS,
        compress_ratio=ratio,
        device="cuda",
        generator=gen,
    )
    width = -(-(one.topk + one.window_size) // 128) * 128
    bytes_moved = one.topk_indices.numel() * 4 + COMBINE_T * (width + 1) * 4
    sets = [one] + [
        random_combine_inputs(
            [q] * COMBINE_REQUESTS,
            [COMBINE_PREFIX] * COMBINE_REQUESTS,
            compress_ratio=ratio,
            device="cuda",
            generator=gen,
        )
        for _ in range(input_sets_needed(bytes_moved) - 1)
    ]
    outs = [
        (
            torch.empty(COMBINE_T, width, dtype=torch.int32, device="cuda"),
            torch.empty(COMBINE_T, dtype=torch.int32, device="cuda"),
        )
        for _ in sets
    ]

    def call(i: int) -> object:
        s = sets[i]
        return cu.combine_topk_swa_indices(  # type: ignore[attr-defined]
            s.topk_indices,
            s.query_start_loc,
            s.seq_lens,
            s.gather_lens,
            s.window_size,
            s.compress_ratio,
            s.topk,
            s.M,
            s.N,
            out=outs[i],
        )

    timing = summarize(
        f"upstream combine T={COMBINE_T} ratio={ratio}", time_graph(call, len(sets)), bytes_moved, ceilings
    )
    print(format_line(timing))
    return timing.as_dict() | {"T": COMBINE_T, "requests": COMBINE_REQUESTS, "ratio": ratio}


def _bench_gather(cu: object, tokens: int, ceilings: Ceilings, gen: torch.Generator) -> dict[str, object]:
    bytes_moved = tokens * GATHER_BYTES_PER_TOKEN
    num_blocks = -(-tokens // GATHER_BLOCK_SIZE) + 1
    sets = [
        (
            random_pool(num_blocks, GATHER_BLOCK_SIZE, gen, valid=True),
            block_table_for([tokens], num_blocks, GATHER_BLOCK_SIZE, gen),
            torch.empty(1, tokens, 512, dtype=torch.bfloat16, device="cuda"),
        )
        for _ in range(input_sets_needed(bytes_moved, limit=8))
    ]
    seq_lens = torch.tensor([tokens], dtype=torch.int32, device="cuda")

    def call(i: int) -> object:
        k_cache, table, out = sets[i]
        return cu.dequantize_and_gather_k_cache_triton(  # type: ignore[attr-defined]
            out, k_cache, seq_lens, None, table, GATHER_BLOCK_SIZE, 0, max_gather_len=tokens
        )

    samples = time_graph(call, len(sets), replays=10)
    timing = summarize(
        f"upstream gather {tokens // 1024}K tokens (Triton path)", samples, bytes_moved, ceilings
    )
    print(format_line(timing))
    return timing.as_dict() | {
        "tokens": tokens,
        "block_size": GATHER_BLOCK_SIZE,
        "spread_us": round(statistics.pstdev(samples), 3),
    }


def main(out_dir: Path, ceilings: Ceilings) -> dict[str, object]:
    import vllm.models.deepseek_v41.common.ops.cache_utils as cu  # the carried upstream tree

    cpu_gen = torch.Generator().manual_seed(20261129)  # the combiner's inputs are drawn on the CPU
    gpu_gen = torch.Generator(device="cuda").manual_seed(20261129)  # the cache pages on the GPU
    return {
        "upstream": "vllm 0.32.0 (official wheel's Python tree)",
        "combine_topk_swa_indices": [_bench_combine(cu, r, ceilings, cpu_gen) for r in (1, 2)],
        "dequantize_and_gather_k_cache_triton": [
            _bench_gather(cu, t, ceilings, gpu_gen) for t in GATHER_TOKENS
        ],
    }
