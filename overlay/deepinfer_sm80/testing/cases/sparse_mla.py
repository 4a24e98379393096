"""Sparse MLA cases: decode and prefill input builders (caches, slot lists, Q, sink, RoPE) for the tests and
the bench, and the entry-point A/B shapes.

Every draw comes from the caller's generator (`testing.inputs.generator(name)` in tests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from deepinfer_sm80.formats.fp8_ds_mla import N_GROUPS, token_views
from deepinfer_sm80.testing.cases.entry_point import Shape
from deepinfer_sm80.testing.inputs import page_pool

HEAD_DIM = 512
ROPE_DIM = 64


@dataclass
class DecodeInputs:
    q: torch.Tensor  # [Tq, H, 512] bf16
    swa_cache: torch.Tensor  # [blocks, bs, 584] uint8
    kv_cache: torch.Tensor  # [blocks, bs, 584] uint8
    swa_dense: torch.Tensor  # [Tq, W_swa] int32, -1 padded
    swa_lens: torch.Tensor  # [Tq] int32
    swa_ragged: torch.Tensor  # [nnz] int32 (valid slots only, as the metadata builder makes them)
    swa_indptr: torch.Tensor  # [Tq + 1] int32
    topk_dense: torch.Tensor
    topk_lens: torch.Tensor
    topk_ragged: torch.Tensor
    topk_indptr: torch.Tensor
    sink: torch.Tensor  # [H] fp32
    positions: torch.Tensor  # [Tq] int64
    cos_sin: torch.Tensor  # [P, 64] fp32, cos | sin


def scaled_pool(
    num_blocks: int, block_size: int, gen: torch.Generator, scale_range: tuple[int, int]
) -> torch.Tensor:
    """Encoder-like pages whose UE8M0 bytes lie in scale_range (near 127 keeps scores finite)."""
    pool = page_pool(num_blocks, block_size, gen, device=gen.device, valid=True)
    _, scale = token_views(pool, block_size)
    scale[..., :N_GROUPS] = torch.randint(
        *scale_range, scale[..., :N_GROUPS].shape, generator=gen, device=gen.device, dtype=torch.uint8
    )
    return pool


def _lists(
    lens: list[int], width: int, num_rows: int, gen: torch.Generator, invalid_frac: float, region: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dense [Tq, width] rows (-1 padded; a share of -1 and >= num_rows entries inside the length), the
    lengths, and the ragged (indices, indptr) of the valid entries. `region`: slots of query i come from a
    window of that many rows at a random base (a request's part of the pool)."""
    on = gen.device
    tq = len(lens)
    span = num_rows if region is None else min(region, num_rows)
    base = torch.randint(0, num_rows - span + 1, (tq, 1), generator=gen, device=on)
    dense = (base + torch.randint(0, span, (tq, width), generator=gen, device=on)).int()
    col = torch.arange(width, device=on)[None, :]
    lens_t = torch.tensor(lens, dtype=torch.int32, device=on)
    if invalid_frac > 0:
        bad = torch.rand(tq, width, generator=gen, device=on) < invalid_frac
        oob = torch.rand(tq, width, generator=gen, device=on) < 0.5
        dense = torch.where(bad, torch.where(oob, num_rows + 7, -1), dense).int()
    dense = torch.where(col < lens_t.clamp(max=width)[:, None], dense, -1).int()
    keep = (col < lens_t[:, None]) & (dense >= 0) & (dense < num_rows)
    counts = keep.sum(dim=1)
    indptr = torch.zeros(tq + 1, dtype=torch.int32, device=on)
    indptr[1:] = counts.cumsum(0)
    return dense, lens_t, dense[keep].int(), indptr


def decode_inputs(
    swa_lens: list[int],
    topk_lens: list[int],
    heads: int,
    gen: torch.Generator,
    *,
    swa_blocks: int = 8,
    kv_blocks: int = 24,
    block_size: int = 32,
    swa_width: int = 128,
    topk_width: int = 512,
    scale_range: tuple[int, int] = (122, 128),
    invalid_frac: float = 0.0,
    region: int | None = None,
    q_scale: float = 1.0,
) -> DecodeInputs:
    on = gen.device
    tq = len(swa_lens)
    swa_cache = scaled_pool(swa_blocks, block_size, gen, scale_range)
    kv_cache = scaled_pool(kv_blocks, block_size, gen, scale_range)
    sd, sl, sr, sp = _lists(swa_lens, swa_width, swa_blocks * block_size, gen, invalid_frac, region)
    td, tl_, tr, tp = _lists(topk_lens, topk_width, kv_blocks * block_size, gen, invalid_frac, region)
    q = (torch.randn(tq, heads, HEAD_DIM, generator=gen, device=on) * q_scale).bfloat16()
    sink = torch.randn(heads, generator=gen, device=on) * 2
    positions = torch.randint(0, 4096, (tq,), generator=gen, device=on)
    angle = torch.rand(4096, ROPE_DIM // 2, generator=gen, device=on) * 6.3
    cos_sin = torch.cat([angle.cos(), angle.sin()], dim=1)
    return DecodeInputs(q, swa_cache, kv_cache, sd, sl, sr, sp, td, tl_, tr, tp, sink, positions, cos_sin)


@dataclass
class PrefillInputs:
    q: torch.Tensor  # [T, H, 512] bf16
    kv: torch.Tensor  # [N, 1, 512] bf16 workspace
    indices: torch.Tensor  # [T, W] int32, -1 padded
    lens: torch.Tensor  # [T] int32
    sink: torch.Tensor  # [H] fp32


def prefill_inputs(
    lens: list[int],
    heads: int,
    num_kv: int,
    gen: torch.Generator,
    *,
    width: int,
    invalid_frac: float = 0.0,
    q_scale: float = 1.0,
) -> PrefillInputs:
    on = gen.device
    dense, lens_t, _, _ = _lists(lens, width, num_kv, gen, invalid_frac, None)
    q = (torch.randn(len(lens), heads, HEAD_DIM, generator=gen, device=on) * q_scale).bfloat16()
    kv = torch.randn(num_kv, 1, HEAD_DIM, generator=gen, device=on).bfloat16()
    sink = torch.randn(heads, generator=gen, device=on) * 2
    return PrefillInputs(q, kv, dense, lens_t, sink)


def decode_sets(
    swa_lens: list[int],
    topk_lens: list[int],
    heads: int,
    gen: torch.Generator,
    n_sets: int,
    *,
    pool_bytes: int,
    region: int,
    block_size: int = 32,
    q_scale: float = 1.0,
) -> list[DecodeInputs]:
    """`n_sets` decode inputs that share two page pools of about `pool_bytes` each (SWA and compressed)
    but draw their own Q and slot lists, each query's from its own region of `region` rows at a random
    base: rotating the sets makes each call read records the previous ones did not (beyond L2 when
    n_sets x the bytes of one call exceeds it), without n_sets copies of the pools."""
    record = 576 + 8
    blocks = max(1, pool_bytes // (block_size * record))
    first = decode_inputs(
        swa_lens,
        topk_lens,
        heads,
        gen,
        swa_blocks=blocks,
        kv_blocks=blocks,
        block_size=block_size,
        region=region,
        q_scale=q_scale,
    )
    sets = [first]
    rows = blocks * block_size
    on = gen.device
    for _ in range(n_sets - 1):
        sd, sl, sr, sp = _lists(swa_lens, 128, rows, gen, 0.0, region)
        td, tl_, tr, tp = _lists(topk_lens, 512, rows, gen, 0.0, region)
        q = (torch.randn(len(swa_lens), heads, HEAD_DIM, generator=gen, device=on) * q_scale).bfloat16()
        sets.append(
            DecodeInputs(
                q,
                first.swa_cache,
                first.kv_cache,
                sd,
                sl,
                sr,
                sp,
                td,
                tl_,
                tr,
                tp,
                first.sink,
                first.positions,
                first.cos_sin,
            )
        )
    return sets


# ----------------------------------------------------------------------------- entry-point A/B (GPU)
def _sparse_close(tol: float) -> Callable[[Any, Any], str]:
    def check(a: Any, b: Any) -> str:
        from deepinfer_sm80.bench.sparse_mla import _close

        return _close(a.cpu(), b.cpu(), tol)

    return check


def decode_entry_point_shapes(quick: bool) -> Iterator[Shape]:
    import torch

    from deepinfer_sm80.formats.fp8_ds_mla import RECORD_BYTES
    from deepinfer_sm80.testing.bench import input_sets_needed
    from deepinfer_sm80.testing.inputs import generator
    from deepinfer_sm80.testing.shapes import V41

    for tq, heads, ctx in (
        ((16, 64, 16_384),) if quick else ((1, 64, 16_384), (16, 64, 16_384), (64, 8, 65_536))
    ):
        n_bytes = tq * ((128 + 512) * (RECORD_BYTES + 4) + 2 * heads * 512 * 2)
        n_sets = input_sets_needed(n_bytes, limit=16)

        def make(
            tq: int = tq, heads: int = heads, ctx: int = ctx, n_sets: int = n_sets
        ) -> Callable[..., Any]:
            gen = generator(f"ab-decode-{tq}-{heads}-{ctx}", "cuda")
            states = ctx  # ratio 1
            sets = [
                decode_inputs([128] * tq, [512] * tq, heads, gen, swa_blocks=tq * 4 + 1,
                              kv_blocks=tq * states // 32 + 1, region=states, q_scale=0.3)
                for _ in range(n_sets)
            ]  # fmt: skip
            outs: dict[tuple[int, int], torch.Tensor] = {}

            def run(fn: Callable[..., Any], i: int) -> Any:
                s = sets[i]
                if (id(fn), i) not in outs:
                    outs[(id(fn), i)] = torch.empty_like(s.q)
                out = outs[(id(fn), i)]
                fn(s.q, s.kv_cache, s.swa_cache, False, None, None, s.swa_dense, s.swa_lens, s.swa_ragged,
                   s.swa_indptr, s.topk_ragged, s.topk_indptr, s.sink, V41.scale, 512, 448, 64,
                   out)  # fmt: skip
                return out

            return run

        yield Shape(f"h{heads}-ctx{ctx // 1024}k", tq, n_bytes, make, n_sets, _sparse_close(448.0))


def prefill_entry_point_shapes(quick: bool) -> Iterator[Shape]:
    import torch

    from deepinfer_sm80.testing.inputs import generator
    from deepinfer_sm80.testing.shapes import V41

    for tokens, heads, ctx in ((256, 64, 16_384),) if quick else ((256, 64, 16_384), (1_024, 8, 65_536)):
        width = 512 + 128
        num_kv = ctx + 128 + tokens
        n_bytes = tokens * (width * 4 + 2 * heads * 512 * 2) + num_kv * 1024

        def make(tokens: int = tokens, heads: int = heads, num_kv: int = num_kv, width: int = width) -> Any:
            gen = generator(f"ab-prefill-{tokens}-{heads}-{num_kv}", "cuda")
            inp = prefill_inputs([width] * tokens, heads, num_kv, gen, width=width, q_scale=0.3)
            outs: dict[int, torch.Tensor] = {}

            def run(fn: Callable[..., Any], _: int) -> Any:
                if id(fn) not in outs:
                    outs[id(fn)] = torch.empty_like(inp.q)
                out = outs[id(fn)]
                fn(inp.q, inp.kv, inp.indices, inp.lens, V41.scale, 512, 448, 64, inp.sink, out)
                return out

            return run

        yield Shape(f"h{heads}-ctx{ctx // 1024}k", tokens, n_bytes, make, 1, _sparse_close(5.0))


ENTRY_POINT_CASES = {
    "sparse_mla_decode": decode_entry_point_shapes,
    "sparse_mla_prefill": prefill_entry_point_shapes,
}
