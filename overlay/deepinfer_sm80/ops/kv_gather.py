"""`dequantize_and_gather_k_cache` for the 584-byte fp8_ds_mla record (docs/OPERATORS.md).

SM80 baseline: upstream's CUDA path (`_dequantize_and_gather_k_kernel`, grid `(R, gather_num_workers)`)
bitcasts to `tl.float8e4nv`, which Triton rejects below sm_89, and its CuTeDSL path is SM90/SM100-only;
`base` is a port of the Triton kernel with the software e4m3 decoder and its `exp2` scales.
`optimized` decodes a [BLOCK_T, 8, 64] tile per step (bit-shift UE8M0) and stores straight into `out`.
Both take the block-table row stride from `stride(0)`, where upstream uses `shape[-1]` (wrong for views),
and form `out` row offsets in int64 (upstream: int32 `b * stride(0)`, which wraps past 2^31 elements).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_sm80.formats.fp8_ds_mla import (
    GROUP,
    HEAD_DIM,
    N_GROUPS,
    NOPE_DIM,
    RECORD_BYTES,
    check_k_cache,
    token_views,
)
from deepinfer_sm80.ops.fp8 import e4m3_decode_ref, e4m3_to_f32, ue8m0_decode_ref, ue8m0_to_f32
from deepinfer_sm80.ops.record_constexprs import DATA as _DATA
from deepinfer_sm80.ops.record_constexprs import GROUP_SIZE as _GROUP
from deepinfer_sm80.ops.record_constexprs import GROUPS as _N_GROUPS
from deepinfer_sm80.ops.record_constexprs import NOPE as _NOPE
from deepinfer_sm80.ops.record_constexprs import SCALE as _SCALE
from deepinfer_sm80.registry import CompileSpec, signature


# ----------------------------------------------------------------------------- reference
def dequantize_and_gather_ref(
    out: torch.Tensor,
    k_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    gather_lens: torch.Tensor | None,
    block_table: torch.Tensor,
    block_size: int,
    offset: int,
) -> None:
    """docs/OPERATORS.md in plain torch: out[b, offset+i] = record of position seq_len-L+i, i < L."""
    data_view, scale_view = token_views(k_cache, block_size)
    lens = (gather_lens if gather_lens is not None else seq_lens).tolist()
    for b, (seq_len, n) in enumerate(zip(seq_lens.tolist(), lens, strict=True)):
        if n <= 0:
            continue
        pos = torch.arange(seq_len - n, seq_len, device=out.device)  # [L]
        blk = block_table[b, pos // block_size].long()
        data = data_view[blk, pos % block_size]  # [L, 576]
        scales = ue8m0_decode_ref(scale_view[blk, pos % block_size, :N_GROUPS])  # [L, 7]
        nope = e4m3_decode_ref(data[:, :NOPE_DIM]).reshape(n, N_GROUPS, GROUP) * scales[..., None]
        out[b, offset : offset + n, :NOPE_DIM] = nope.reshape(n, NOPE_DIM).to(torch.bfloat16)
        out[b, offset : offset + n, NOPE_DIM:] = data[:, NOPE_DIM:].contiguous().view(torch.bfloat16)


# ----------------------------------------------------------------------------- base (upstream port)
_GATHER_STEPS_PER_WORKER = 8  # upstream's gather_num_workers(): 128..8192 workers, 8 tokens each
_GATHER_MIN_WORKERS = 128
_GATHER_MAX_WORKERS = 8192


def gather_num_workers(max_gather_len: int | None) -> int:
    if max_gather_len is None:
        return _GATHER_MIN_WORKERS
    return max(
        _GATHER_MIN_WORKERS, min(_GATHER_MAX_WORKERS, triton.cdiv(max_gather_len, _GATHER_STEPS_PER_WORKER))
    )


@triton.jit
def _gather_base_kernel(
    out_ptr,
    out_stride0,
    out_stride1,
    k_cache_ptr,
    page_stride,
    seq_lens_ptr,
    gather_lens_ptr,
    block_table_ptr,
    block_table_stride0,
    offset,
    HAS_GATHER_LENS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Upstream's loop: worker w of request b takes tokens w, w+W, ...; seven 64-groups, then RoPE."""
    b = tl.program_id(0)
    worker = tl.program_id(1)
    num_workers = tl.num_programs(1)
    seq_len = tl.load(seq_lens_ptr + b)
    if HAS_GATHER_LENS:
        gather_len = tl.load(gather_lens_ptr + b)
    else:
        gather_len = seq_len
    start = seq_len - gather_len
    for i in range(worker, gather_len, num_workers):
        pos = start + i
        block = tl.load(block_table_ptr + b.to(tl.int64) * block_table_stride0 + pos // BLOCK_SIZE)
        page = k_cache_ptr + block.to(tl.int64) * page_stride
        data_ptr = page + (pos % BLOCK_SIZE) * _DATA
        scale_ptr = page + BLOCK_SIZE * _DATA + (pos % BLOCK_SIZE) * _SCALE
        row_ptr = out_ptr + b.to(tl.int64) * out_stride0 + (offset + i).to(tl.int64) * out_stride1
        for q in tl.static_range(_N_GROUPS):
            offs = q * _GROUP + tl.arange(0, _GROUP)
            x = e4m3_to_f32(tl.load(data_ptr + offs))
            scale = tl.exp2(tl.load(scale_ptr + q).to(tl.float32) - 127.0)
            tl.store(row_ptr + offs, (x * scale).to(tl.bfloat16))
        rope_ptr = (data_ptr + _NOPE).to(tl.pointer_type(tl.bfloat16))
        for c in tl.static_range(4):
            offs = c * 16 + tl.arange(0, 16)
            tl.store(row_ptr + _NOPE + offs, tl.load(rope_ptr + offs))


# ----------------------------------------------------------------------------- optimized
@triton.jit
def _gather_kernel(
    out_ptr,
    out_stride0,
    out_stride1,
    k_cache_ptr,
    page_stride,
    seq_lens_ptr,
    gather_lens_ptr,
    block_table_ptr,
    block_table_stride0,
    offset,
    HAS_GATHER_LENS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """Program (w, b) takes token tiles w, w+W, ... of request b; each tile is one pass of
    BLOCK_T records -> BLOCK_T output rows. The 8 scale bytes come in as one 64-bit word and each row
    leaves as one full [8, 64] bf16 store with RoPE as group 7. The first tuned form stored NoPE
    (group 7 masked, byte-wise scales) and RoPE apart; on the H200 it was 0.3-5.7 % slower from 4K to
    1M tokens (results/gpu/kv_gather-h200.json, `speedup_vs_optimized[split-store]`) and is gone."""
    b = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b)
    if HAS_GATHER_LENS:
        gather_len = tl.load(gather_lens_ptr + b)
    else:
        gather_len = seq_len
    start = seq_len - gather_len
    bt_row = block_table_ptr + b.to(tl.int64) * block_table_stride0
    out_req = out_ptr + b.to(tl.int64) * out_stride0
    g = tl.arange(0, _N_GROUPS + 1)[None, :, None]
    col = g * _GROUP + tl.arange(0, _GROUP)[None, None, :]  # [1, 8, 64]
    nope = g < _N_GROUPS
    for tile in range(tl.program_id(0), tl.cdiv(gather_len, BLOCK_T), tl.num_programs(0)):
        i = tile * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
        valid = i < gather_len
        pos = start + i
        block = tl.load(bt_row + pos // BLOCK_SIZE, mask=valid, other=0)
        page = k_cache_ptr + block.to(tl.int64) * page_stride  # 64-bit: pages pass 2^31 B early
        data_ptr = page + (pos % BLOCK_SIZE) * _DATA
        scale_ptr = page + BLOCK_SIZE * _DATA + (pos % BLOCK_SIZE) * _SCALE
        row_ptr = out_req + (offset + i).to(tl.int64) * out_stride1
        rope_ptr = (data_ptr + _NOPE).to(tl.pointer_type(tl.bfloat16))
        v3 = valid[:, None, None]
        # bytes 448..511 load as "group 7 codes" too; the where below drops them for the RoPE
        codes = tl.load(data_ptr[:, None, None] + col, mask=v3, other=0)  # [BLOCK_T, 8, 64]
        word = tl.load(scale_ptr.to(tl.pointer_type(tl.int64)), mask=valid, other=0)  # 8 scale bytes
        u = (word[:, None, None] >> (8 * g)) & 0xFF  # [BLOCK_T, 8, 1], little-endian: group g
        nope_val = (e4m3_to_f32(codes) * ue8m0_to_f32(u)).to(tl.bfloat16)
        rope = tl.load(rope_ptr[:, None, None] + tl.arange(0, _GROUP)[None, None, :], mask=v3)
        tl.store(row_ptr[:, None, None] + col, tl.where(nope, nope_val, rope), mask=v3)


# ----------------------------------------------------------------------------- launchers
# 8 tokens x 2 warps (4 tokens a warp, small CTAs): on the H200 (run of a535ef5) 2-3% faster than
# 16x4 at 48K/128K/1M; 8x4, 16x2, 16x8, 32x4, 32x8 and 64x8 were 4-17% slower than 16x4
BLOCK_T = 8
NUM_WARPS = 2
_MAX_PROGRAMS = 1 << 17  # grid cap: programs loop over tiles beyond it


def _check(
    out: torch.Tensor,
    k_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    gather_lens: torch.Tensor | None,
    block_table: torch.Tensor,
    block_size: int,
    offset: int,
    use_fnuz: bool,
) -> None:
    if out.dim() != 3 or out.shape[2] != HEAD_DIM or out.dtype != torch.bfloat16 or out.stride(2) != 1:
        raise ValueError(f"out must be [R, rows, 512] bf16 with unit last stride, got {tuple(out.shape)}")
    if use_fnuz:
        raise ValueError("use_fnuz=True is ROCm-only (FNUZ e4m3)")
    if k_cache.shape[-1] != RECORD_BYTES:
        raise NotImplementedError(
            f"only the {RECORD_BYTES}-byte V4 record runs on SM80 (got {k_cache.shape[-1]})"
        )
    check_k_cache(k_cache, block_size)
    if (
        block_table.dim() != 2
        or block_table.stride(1) != 1
        or block_table.dtype not in (torch.int32, torch.int64)
    ):
        raise ValueError("block_table must be [R, max_blocks] int32/int64 with unit last stride")
    for name, t in (("seq_lens", seq_lens), ("gather_lens", gather_lens)):
        if t is not None and (t.dim() != 1 or not t.is_contiguous() or t.shape[0] > out.shape[0]):
            raise ValueError(f"{name} must be contiguous [R] with R <= out.shape[0]")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")


def base_dequantize_and_gather_k_cache(
    out: torch.Tensor,
    k_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    gather_lens: torch.Tensor | None,
    block_table: torch.Tensor,
    block_size: int,
    offset: int,
    use_fnuz: bool = False,
    max_gather_len: int | None = None,
) -> None:
    """SM80 port of upstream's Triton gather; grid (R, gather_num_workers(max_gather_len))."""
    _check(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset, use_fnuz)
    num_reqs = seq_lens.shape[0]
    if num_reqs:
        _gather_base_kernel[(num_reqs, gather_num_workers(max_gather_len))](
            out,
            out.stride(0),
            out.stride(1),
            k_cache,
            k_cache.stride(0),
            seq_lens,
            gather_lens if gather_lens is not None else seq_lens,
            block_table,
            block_table.stride(0),
            offset,
            HAS_GATHER_LENS=gather_lens is not None,
            BLOCK_SIZE=block_size,
        )


def dequantize_and_gather_k_cache(
    out: torch.Tensor,
    k_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    gather_lens: torch.Tensor | None,
    block_table: torch.Tensor,
    block_size: int,
    offset: int,
    use_fnuz: bool = False,
    max_gather_len: int | None = None,
) -> None:
    """Dequantize L_b = gather_lens[b] (or seq_lens[b]) records into out[b, offset:offset+L_b] (bf16).

    Args:
        out: [R, rows, 512] bf16, any row/request strides; rows outside the gathered ones are untouched.
        k_cache: uint8 pages of `block_size` records at stride(0).
        seq_lens / gather_lens: [R]; gather_lens None gathers whole sequences.
        block_table: [R, max_blocks], rows at stride(0).
        max_gather_len: only sizes the grid (bound on L_b); out.shape[1] - offset bounds it otherwise.
    """
    _check(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset, use_fnuz)
    launch_gather(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset, max_gather_len)


def launch_gather(
    out: torch.Tensor,
    k_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    gather_lens: torch.Tensor | None,
    block_table: torch.Tensor,
    block_size: int,
    offset: int,
    max_gather_len: int | None,
    *,
    block_t: int = BLOCK_T,
    num_warps: int = NUM_WARPS,
    max_programs: int = _MAX_PROGRAMS,
) -> None:
    """The optimized kernel's launch, unchecked; tile shape and grid cap are knobs for the bench."""
    num_reqs = seq_lens.shape[0]
    bound = out.shape[1] - offset if max_gather_len is None else min(max_gather_len, out.shape[1] - offset)
    if num_reqs == 0 or bound <= 0:
        return
    tiles = min(triton.cdiv(bound, block_t), max(1, max_programs // num_reqs))
    _gather_kernel[(tiles, num_reqs)](
        out,
        out.stride(0),
        out.stride(1),
        k_cache,
        k_cache.stride(0),
        seq_lens,
        gather_lens if gather_lens is not None else seq_lens,
        block_table,
        block_table.stride(0),
        offset,
        HAS_GATHER_LENS=gather_lens is not None,
        BLOCK_SIZE=block_size,
        BLOCK_T=block_t,
        num_warps=num_warps,
    )


_POINTERS = {
    "out_ptr": "bf16",
    "k_cache_ptr": "u8",
    "seq_lens_ptr": "i32",
    "gather_lens_ptr": "i32",
    "block_table_ptr": "i32",
}
# what production launches pass 16-divisible: torch allocations, 512-element rows, 576-multiple pages
_ALIGNED = (
    "out_ptr",
    "out_stride0",
    "out_stride1",
    "k_cache_ptr",
    "page_stride",
    "seq_lens_ptr",
    "block_table_ptr",
)
# compressed gathers (128- or 64-state pages, gather_lens None) and SWA gathers (32-token pages, gather_lens)
_CONFIGS = ((128, False), (64, False), (32, True))
COMPILE_SPECS = tuple(
    spec
    for bs, has_lens in _CONFIGS
    for spec in (
        CompileSpec(
            f"kv_gather.base.bs{bs}",
            _gather_base_kernel,
            signature(_gather_base_kernel, _POINTERS),
            {"HAS_GATHER_LENS": has_lens, "BLOCK_SIZE": bs},
            divisible_by_16=_ALIGNED,
        ),
        CompileSpec(
            f"kv_gather.opt.bs{bs}",
            _gather_kernel,
            signature(_gather_kernel, _POINTERS),
            {"HAS_GATHER_LENS": has_lens, "BLOCK_SIZE": bs, "BLOCK_T": BLOCK_T},
            num_warps=NUM_WARPS,
            divisible_by_16=_ALIGNED,
        ),
    )
)
