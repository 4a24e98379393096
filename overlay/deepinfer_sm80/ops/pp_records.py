"""Copy planar paged records between a KV cache and per-token rows: the pipeline replication payload.

A page of `block_size` states is planar (formats/fp8_ds_mla.py, docs/FP8_DS_MLA.md): state j's data bytes at
`page + DATA·j`, its scale bytes at `page + DATA·block_size + SCALE·j`, `page = base + block·stride(0)`.
Compressed KV: DATA 576, SCALE 8 (the 584-byte V4 record); indexer K: DATA 128, SCALE 4 (fp32 2^e).

`gather_records`: row t = the record at `slots[t]` (DATA bytes then SCALE bytes), zeros where slot < 0.
`scatter_records`: the record at `slots[t]` = row t, for slot >= 0; other bytes untouched.
Both are byte copies: the contract is bitwise. The Triton kernel is sync-free (no nonzero), so the
scatter can sit inside a CUDA-graph-captured forward; the torch reference is the spec.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_sm80.registry import CompileSpec, signature

CKV_FORMAT = (576, 8)
IKV_FORMAT = (128, 4)


def _pages(cache: torch.Tensor, block_size: int | None) -> tuple[int, int]:
    """(block_size, page stride in bytes) of a [blocks, block_size, record] or [blocks, page] uint8 cache."""
    if cache.dtype != torch.uint8 or cache.stride(-1) != 1 or cache.dim() not in (2, 3):
        raise ValueError(
            f"cache must be a uint8 [blocks, block_size, record] or [blocks, bytes] page array, got "
            f"{cache.dtype} {tuple(cache.shape)} strides {cache.stride()}"
        )
    bs = cache.shape[1] if cache.dim() == 3 else block_size
    if bs is None or (block_size is not None and bs != block_size):
        raise ValueError(f"block_size {block_size} does not match the cache's {bs}")
    return bs, cache.stride(0)


def _check_rows(rows: torch.Tensor, slots: torch.Tensor, width: int) -> None:
    if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[1] != width or rows.stride(1) != 1:
        raise ValueError(f"rows must be uint8 [T, {width}], got {rows.dtype} {tuple(rows.shape)}")
    if slots.dim() != 1 or slots.shape[0] != rows.shape[0] or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"slots must be int32/int64 [{rows.shape[0]}], got {slots.dtype} {tuple(slots.shape)}"
        )


# ----------------------------------------------------------------------------- reference
def record_views(
    cache: torch.Tensor, fmt: tuple[int, int], block_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of the data [blocks, bs, DATA] and scale [blocks, bs, SCALE] regions of every page."""
    data_b, scale_b = fmt
    bs, s0 = _pages(cache, block_size)
    nb, base = cache.shape[0], cache.storage_offset()
    data = cache.as_strided((nb, bs, data_b), (s0, data_b, 1), base)
    scale = cache.as_strided((nb, bs, scale_b), (s0, scale_b, 1), base + bs * data_b)
    return data, scale


def gather_records_ref(
    cache: torch.Tensor, slots: torch.Tensor, fmt: tuple[int, int], block_size: int | None = None
) -> torch.Tensor:
    data, scale = record_views(cache, fmt, block_size)
    bs = data.shape[1]
    rows = torch.zeros(slots.shape[0], sum(fmt), dtype=torch.uint8, device=cache.device)  # [T, DATA+SCALE]
    keep = (slots >= 0).nonzero().flatten()
    s = slots[keep].long()
    rows[keep, : fmt[0]] = data[s // bs, s % bs]
    rows[keep, fmt[0] :] = scale[s // bs, s % bs]
    return rows


def scatter_records_ref(
    cache: torch.Tensor,
    slots: torch.Tensor,
    rows: torch.Tensor,
    fmt: tuple[int, int],
    block_size: int | None = None,
) -> None:
    _check_rows(rows, slots, sum(fmt))
    data, scale = record_views(cache, fmt, block_size)
    bs = data.shape[1]
    keep = (slots >= 0).nonzero().flatten()
    s = slots[keep].long()
    data[s // bs, s % bs] = rows[keep, : fmt[0]]
    scale[s // bs, s % bs] = rows[keep, fmt[0] :]


# ----------------------------------------------------------------------------- kernel
@triton.jit
def _pp_records_kernel(
    cache_ptr,
    rows_ptr,
    slots_ptr,
    block_stride,
    rows_stride,
    block_size,
    DATA: tl.constexpr,
    SCALE: tl.constexpr,
    DATA_P2: tl.constexpr,
    SCALE_P2: tl.constexpr,
    SCATTER: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    valid = slot >= 0
    slot = tl.where(valid, slot, 0)
    page = cache_ptr + (slot // block_size) * block_stride
    j = slot % block_size
    row = rows_ptr + t.to(tl.int64) * rows_stride
    d = tl.arange(0, DATA_P2)
    s = tl.arange(0, SCALE_P2)
    dm = d < DATA
    sm = s < SCALE
    data_ptr = page + j * DATA + d
    scale_ptr = page + block_size * DATA + j * SCALE + s
    if SCATTER:
        tl.store(data_ptr, tl.load(row + d, mask=dm), mask=dm & valid)
        tl.store(scale_ptr, tl.load(row + DATA + s, mask=sm), mask=sm & valid)
    else:
        tl.store(row + d, tl.load(data_ptr, mask=dm & valid, other=0), mask=dm)
        tl.store(row + DATA + s, tl.load(scale_ptr, mask=sm & valid, other=0), mask=sm)


def _launch(
    cache: torch.Tensor,
    slots: torch.Tensor,
    rows: torch.Tensor,
    fmt: tuple[int, int],
    block_size: int | None,
    scatter: bool,
) -> None:
    bs, s0 = _pages(cache, block_size)
    _check_rows(rows, slots, sum(fmt))
    if rows.shape[0] == 0:
        return
    data_b, scale_b = fmt
    _pp_records_kernel[(rows.shape[0],)](
        cache, rows, slots, s0, rows.stride(0), bs,
        DATA=data_b, SCALE=scale_b,
        DATA_P2=triton.next_power_of_2(data_b), SCALE_P2=triton.next_power_of_2(scale_b),
        SCATTER=scatter, num_warps=NUM_WARPS,
    )  # fmt: skip


def gather_records(
    cache: torch.Tensor,
    slots: torch.Tensor,
    fmt: tuple[int, int],
    block_size: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """[T, DATA+SCALE] uint8 rows of the records at `slots` (zeros where slot < 0)."""
    if not _kernel_runs(cache):
        rows = gather_records_ref(cache, slots, fmt, block_size)
        return out.copy_(rows) if out is not None else rows
    rows = (
        out
        if out is not None
        else torch.empty(slots.shape[0], sum(fmt), dtype=torch.uint8, device=cache.device)
    )
    _launch(cache, slots, rows, fmt, block_size, scatter=False)
    return rows


def scatter_records(
    cache: torch.Tensor,
    slots: torch.Tensor,
    rows: torch.Tensor,
    fmt: tuple[int, int],
    block_size: int | None = None,
) -> None:
    """Write row t as the record at `slots[t]` for every slot >= 0."""
    if not _kernel_runs(cache):
        scatter_records_ref(cache, slots, rows, fmt, block_size)
        return
    _launch(cache, slots, rows, fmt, block_size, scatter=True)


def _kernel_runs(cache: torch.Tensor) -> bool:
    """The Triton kernel on CUDA tensors, or on CPU when it was defined under TRITON_INTERPRET=1; else the
    reference (a plain CPU process that imported us without the interpreter)."""
    return cache.is_cuda or type(_pp_records_kernel).__name__ == "InterpretedFunction"


NUM_WARPS = 4
_SIG = signature(
    _pp_records_kernel,
    {"cache_ptr": "u8", "rows_ptr": "u8", "slots_ptr": "i32"},
    block_stride="i64",
    rows_stride="i64",
)
COMPILE_SPECS = tuple(
    CompileSpec(
        f"pp_records.{name}.{'scatter' if scatter else 'gather'}",
        _pp_records_kernel,
        _SIG,
        {
            "DATA": d,
            "SCALE": s,
            "DATA_P2": triton.next_power_of_2(d),
            "SCALE_P2": triton.next_power_of_2(s),
            "SCATTER": scatter,
        },
        num_warps=NUM_WARPS,
        divisible_by_16=("cache_ptr", "rows_ptr", "slots_ptr"),
    )
    for name, (d, s) in (("ckv", CKV_FORMAT), ("ikv", IKV_FORMAT))
    for scatter in (False, True)
)
