"""Engram table lookup on SM80/SM86: the e4m3 table read as bytes and decoded in software.

vLLM 0.32.0's `_engram_lookup_kernel` (models/deepseek_v41/common/engram.py) takes the table as a
`float8_e4m3fn` pointer, which Triton rejects below sm_89. `EngramLookupKernel` stands in for the
kernel object: `kernel[grid](weight, ...)` views the table as uint8 and launches `engram_lookup_kernel`
(same parameters) that decodes the bytes exactly (`e4m3_to_f32`) and multiplies by the UE8M0 scale
(exponent placement), rounding once to bf16 -- as upstream's hardware decode does. The packed path
(`out` uint8) copies value and scale bytes unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from deepinfer_sm80.ops.fp8 import e4m3_decode_ref, e4m3_to_f32
from deepinfer_sm80.registry import CompileSpec, signature


# ----------------------------------------------------------------------------- reference
def engram_lookup_ref(
    weight: torch.Tensor,
    scales: torch.Tensor,
    ids: torch.Tensor,
    vocab_start: int,
    vocab_end: int,
    head_start: int,
    local_heads: int,
    quant_block: int,
) -> torch.Tensor:
    """Unsorted bf16 path: ids [T, TOTAL_HEADS] -> out [T * LOCAL_HEADS, DIM] bf16 (0 where not owned)."""
    t, total = ids.shape
    dim = weight.shape[1]
    heads = head_start + torch.arange(local_heads)
    idx = torch.full((t, local_heads), -1, dtype=torch.long)
    live = heads < total
    idx[:, live] = ids[:, heads[live]].long()
    owned = (idx >= vocab_start) & (idx < vocab_end)
    local = torch.where(owned, idx - vocab_start, 0).reshape(-1)
    values = e4m3_decode_ref(weight.view(torch.uint8)[local])  # [rows, DIM] fp32
    scale = (scales[local].to(torch.int32) << 23).view(torch.float32).repeat_interleave(quant_block, 1)
    out = (values * scale).to(torch.bfloat16)
    return torch.where(owned.reshape(-1, 1), out, torch.zeros((), dtype=torch.bfloat16)).reshape(-1, dim)


# ----------------------------------------------------------------------------- kernel
@triton.jit(
    do_not_specialize=(
        "vocab_start",
        "vocab_end",
        "num_rows",
        "ids_stride_t",
        "ids_stride_h",
        "GRID",
        "SORTED",
    )
)
def engram_lookup_kernel(
    weight,
    scales,
    ids,
    sorted_dst,
    out,
    vocab_start,
    vocab_end,
    num_rows,
    ids_stride_t,
    ids_stride_h,
    HEAD_START: tl.constexpr,
    LOCAL_HEADS: tl.constexpr,
    TOTAL_HEADS: tl.constexpr,
    DIM: tl.constexpr,
    QUANT_BLOCK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    GRID,
    SORTED,
    PACKED: tl.constexpr,
    OUT_STRIDE: tl.constexpr,
):
    """Persistent grid over rows of BLOCK_R (token, head) pairs; weight is the table's uint8 bytes."""
    cols = tl.arange(0, DIM)
    scale_cols = cols // QUANT_BLOCK
    for base in tl.range(tl.program_id(0) * BLOCK_R, num_rows, GRID * BLOCK_R):
        rows = base + tl.arange(0, BLOCK_R)
        valid = rows < num_rows
        if SORTED:
            local = tl.load(ids + rows, mask=valid, other=-1).to(tl.int64)
            dst = tl.load(sorted_dst + rows, mask=valid, other=0).to(tl.int32)
            owned = (local >= 0) & (local < vocab_end - vocab_start)
        else:
            head = HEAD_START + rows % LOCAL_HEADS
            token = (rows // LOCAL_HEADS).to(tl.int64)
            in_heads = valid & (head < TOTAL_HEADS)
            index = tl.load(ids + token * ids_stride_t + head * ids_stride_h, mask=in_heads, other=-1).to(
                tl.int64
            )
            dst = rows
            owned = in_heads & (index >= vocab_start) & (index < vocab_end)
            local = index - vocab_start
        local = tl.where(owned, local, 0)
        codes = tl.load(weight + local[:, None] * DIM + cols[None, :], mask=owned[:, None], other=0)
        scale = tl.load(
            scales + local[:, None] * (DIM // QUANT_BLOCK) + scale_cols[None, :], mask=owned[:, None], other=0
        )
        if PACKED:
            width: tl.constexpr = DIM + DIM // QUANT_BLOCK
            d = dst.to(tl.int64)
            d = d // LOCAL_HEADS * OUT_STRIDE + d % LOCAL_HEADS * width
            tl.store(out + d[:, None] + cols[None, :], codes, mask=valid[:, None])
            first = (cols[None, :] % QUANT_BLOCK) == 0
            tl.store(out + d[:, None] + DIM + scale_cols[None, :], scale, mask=valid[:, None] & first)
        else:
            factor = (scale.to(tl.int32) << 23).to(tl.float32, bitcast=True)  # UE8M0 -> 2^(u-127)
            value = e4m3_to_f32(codes) * factor  # exact: a power-of-two multiple of an e4m3 value
            tl.store(out + dst[:, None] * DIM + cols[None, :], value.to(tl.bfloat16), mask=valid[:, None])


class EngramLookupKernel:
    """What the binding row puts in place of upstream's kernel object: `self[grid](*args, **kw)`."""

    def __init__(self, upstream: Any) -> None:
        self.upstream = upstream

    def __getitem__(self, grid: Any) -> Any:
        def launch(weight: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if weight.dtype == torch.float8_e4m3fn:
                weight = weight.view(torch.uint8)
            return engram_lookup_kernel[grid](weight, *args, **kwargs)

        return launch


def engram_lookup_via_bytes(upstream_kernel: Any) -> EngramLookupKernel:
    """Factory for the `_engram_lookup_kernel` row."""
    return EngramLookupKernel(upstream_kernel)


def _sig(out: str) -> dict[str, str]:
    # upstream's argument names (no `_ptr` suffix): every pointer named with its dtype
    pointers = {"weight": "u8", "scales": "u8", "ids": "i64", "sorted_dst": "i32", "out": out}
    return signature(engram_lookup_kernel, pointers, SORTED="i1")


# Engram rows of 1024 dims in 128-dim scale blocks, 16 rows a tile, as upstream launches them; heads per
# rank at TP8 of a 16-column hash table (the [cfg] head count is an assumption of these specs only)
COMPILE_SPECS = tuple(
    CompileSpec(
        f"engram_lookup.{'packed' if packed else 'bf16'}",
        engram_lookup_kernel,
        _sig("u8" if packed else "bf16"),
        {
            "HEAD_START": 0,
            "LOCAL_HEADS": 2,
            "TOTAL_HEADS": 16,
            "DIM": 1024,
            "QUANT_BLOCK": 128,
            "BLOCK_R": 16,
            "PACKED": packed,
            "OUT_STRIDE": 2 * (1024 + 8),
        },
        num_warps=4,
        divisible_by_16=("weight", "scales", "ids", "out"),
    )
    for packed in (False, True)
)
