"""Indexer MQA logits on SM80 tensor cores: dense ragged prefill and paged decode (the base level).

`logit[m, n] = Σ_h w'[m, h]·relu(q8[m, h]·k8[n])·kscale[n]`, fp32. DeepGEMM (upstream's only CUDA
path) has no SM80 kernels and the ROCm Triton kernel uses an fp8 `tl.dot`. Here both operands are
decoded in software to fp16 (e4m3 values are exact in fp16, scaled by 2^-8 each: docs/INDEXER.md) and
multiplied by a 16-bit MMA with fp32 accumulation; the 2^16 goes back with kscale, an exact multiply.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from deepinfer_sm80.device import sm_count as device_sm_count
from deepinfer_sm80.formats.indexer_k import CODE_BYTES, INDEX_DIM, check_k_cache
from deepinfer_sm80.registry import CompileSpec, signature

UNDO_DECODE_SCALE = 65536.0  # 2^8 per operand
_UNDO = tl.constexpr(UNDO_DECODE_SCALE)


# ----------------------------------------------------------------------------- references
def mqa_logits_ref(
    q8: torch.Tensor, weights: torch.Tensor, k8: torch.Tensor, kscale: torch.Tensor
) -> torch.Tensor:
    """fp64 logits [M, N] of q8 uint8 [M, H, D], weights [M, H], k8 uint8 [N, D], kscale [N] (no mask)."""
    q = q8.view(torch.float8_e4m3fn).double()
    k = k8.view(torch.float8_e4m3fn).double()
    s = torch.einsum("mhd,nd->mhn", q, k).relu()
    return (s * weights.double()[:, :, None]).sum(1) * kscale.double().reshape(-1)[None, :]


def row_lengths(context_lens: torch.Tensor, batch: int, next_n: int) -> torch.Tensor:
    """Visible keys per flattened decode row [B·next_n]: ctx − next_n + 1 + i for 1-D lens, else
    lens[b, i]."""
    if context_lens.dim() == 2 and context_lens.shape[1] == next_n:
        return context_lens.reshape(-1).to(torch.int32)
    lens = context_lens.reshape(-1)[:batch].to(torch.int32)
    i = torch.arange(next_n, device=lens.device, dtype=torch.int32)
    return (lens[:, None] - next_n + 1 + i[None, :]).reshape(-1)


# ----------------------------------------------------------------------------- device helpers
@triton.jit
def e4m3_to_f16_scaled(b):
    """uint8 e4m3fn codes -> fp16 holding value·2^-8, exact for all finite codes (NaN codes -> ±1.875)."""
    bi = b.to(tl.int32)
    h = (((bi & 0x80) << 8) | ((bi & 0x7F) << 7)).to(tl.int16)
    return h.to(tl.float16, bitcast=True)


@triton.jit
def e4m3_words_to_f16(words):
    """int32 words of 4 codes (dims 4i..4i+3, little-endian) -> four fp16 tensors holding value·2^-8 of
    dims 4i, 4i+1, 4i+2, 4i+3, exact for finite codes. Two codes decode at once per 32-bit word:
    with b in the low byte of a 16-bit lane, (b + (b & 0x80)) << 7 carries the sign bit from bit 14
    to bit 15 and leaves the magnitude in bits 13..7 — the same pattern as e4m3_to_f16_scaled."""
    even = words & 0x00FF00FF  # dims 4i (low half), 4i+2 (high half)
    odd = (words >> 8) & 0x00FF00FF  # dims 4i+1, 4i+3
    fe = (even + (even & 0x00800080)) << 7
    fo = (odd + (odd & 0x00800080)) << 7
    f16 = tl.float16
    k0 = fe.to(tl.int16).to(f16, bitcast=True)
    k2 = (fe >> 16).to(tl.int16).to(f16, bitcast=True)
    k1 = fo.to(tl.int16).to(f16, bitcast=True)
    k3 = (fo >> 16).to(tl.int16).to(f16, bitcast=True)
    return k0, k1, k2, k3


@triton.jit
def load_q_quads(q_row_ptr, HEADS: tl.constexpr, D: tl.constexpr):
    """One query row's [HEADS, D] codes as four fp16 [HEADS, D/4] tensors of dims 4i+j (value·2^-8)."""
    h = tl.arange(0, HEADS)
    qb = q_row_ptr + h[:, None] * D + 4 * tl.arange(0, D // 4)[None, :]
    q0 = e4m3_to_f16_scaled(tl.load(qb))
    q1 = e4m3_to_f16_scaled(tl.load(qb + 1))
    q2 = e4m3_to_f16_scaled(tl.load(qb + 2))
    q3 = e4m3_to_f16_scaled(tl.load(qb + 3))
    return q0, q1, q2, q3


@triton.jit
def row_logits_words(q0, q1, q2, q3, w, key_ptrs, D: tl.constexpr, mask):
    """Σ_h w[h]·relu(q·k) (times 2^-16) of one query row against keys whose rows start at key_ptrs
    ([BLOCK_N] uint8 pointers, 4-byte aligned; masked-off keys read as 0): four MMAs over the dims
    mod 4, so K decodes two codes per 32-bit operation (e4m3_words_to_f16)."""
    i4 = tl.arange(0, D // 4)
    ptrs = key_ptrs.to(tl.pointer_type(tl.int32))[None, :] + i4[:, None]
    words = tl.load(ptrs, mask=mask[None, :], other=0)  # [D/4, BLOCK_N]
    k0, k1, k2, k3 = e4m3_words_to_f16(words)
    s = tl.dot(q0, k0, out_dtype=tl.float32)
    s = tl.dot(q1, k1, s, out_dtype=tl.float32)
    s = tl.dot(q2, k2, s, out_dtype=tl.float32)
    s = tl.dot(q3, k3, s, out_dtype=tl.float32)
    return tl.sum(tl.maximum(s, 0.0) * w[:, None], axis=0)


@triton.jit
def row_logits_bytes(q, w, key_ptrs, D: tl.constexpr):
    """The same sum with one [HEADS, D] x [D, BLOCK_N] MMA, K decoded a code at a time (16-byte loads)."""
    kt = tl.load(key_ptrs[None, :] + tl.arange(0, D)[:, None])  # [D, BLOCK_N]
    s = tl.dot(q, e4m3_to_f16_scaled(kt), out_dtype=tl.float32)
    return tl.sum(tl.maximum(s, 0.0) * w[:, None], axis=0)


# Paged K decode: one code at a time from 16-byte loads (False), or two codes per 32-bit op from
# 4-byte loads (True). H200 (torch 2.11 / triton 3.6): 3.7 ms vs 5.0 ms at 48 rows x 1M keys, so the
# bytes form is the default; docs/INDEXER.md has both runs.
PAGED_WORD_DECODE = False


# ----------------------------------------------------------------------------- prefill (dense)
@triton.jit
def _prefill_logits_kernel(
    q_ptr,  # uint8 [M, H, D]
    w_ptr,  # fp32 [M, H]
    w_stride,
    k_ptr,  # uint8 [N, D]
    ks_ptr,  # fp32 [N]
    cu_ks_ptr,
    cu_ke_ptr,
    out_ptr,  # fp32 [M, N]
    out_stride,
    M,
    N,
    HEADS: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TILES: tl.constexpr,
):
    """BLOCK_M queries share every K tile: one [BLOCK_M·HEADS, D] x [D, BLOCK_N] MMA per tile."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    ks = tl.load(cu_ks_ptr + rows, mask=row_ok, other=2147483647)
    ke = tl.load(cu_ke_ptr + rows, mask=row_ok, other=0)
    lo = tl.min(ks, axis=0)
    hi = tl.minimum(tl.max(ke, axis=0), N)
    span_lo = pid_n * (BLOCK_N * TILES)
    if (span_lo >= hi) | (span_lo + BLOCK_N * TILES <= lo):
        return
    qh = pid_m * BLOCK_M * HEADS + tl.arange(0, BLOCK_M * HEADS)  # flat (query, head) rows
    qh_ok = qh < M * HEADS
    d = tl.arange(0, D)
    q = tl.load(q_ptr + qh.to(tl.int64)[:, None] * D + d[None, :], mask=qh_ok[:, None], other=0)
    q = e4m3_to_f16_scaled(q)  # [BLOCK_M·H, D]
    hh = tl.arange(0, BLOCK_M * HEADS)
    w = tl.load(
        w_ptr + (pid_m * BLOCK_M + hh // HEADS).to(tl.int64) * w_stride + hh % HEADS, mask=qh_ok, other=0.0
    )
    for t in range(TILES):
        n0 = span_lo + t * BLOCK_N
        if (n0 < hi) & (n0 + BLOCK_N > lo):
            n = n0 + tl.arange(0, BLOCK_N)
            n_ok = n < N
            kt = tl.load(k_ptr + n.to(tl.int64)[None, :] * D + d[:, None], mask=n_ok[None, :], other=0)
            s = tl.dot(q, e4m3_to_f16_scaled(kt), out_dtype=tl.float32)  # [BLOCK_M·H, BLOCK_N]
            s = tl.maximum(s, 0.0) * w[:, None]
            logit = tl.sum(tl.reshape(s, (BLOCK_M, HEADS, BLOCK_N)), axis=1)  # [BLOCK_M, BLOCK_N]
            kscale = tl.load(ks_ptr + n, mask=n_ok, other=0.0) * _UNDO
            logit = logit * kscale[None, :]
            ptrs = out_ptr + rows.to(tl.int64)[:, None] * out_stride + n[None, :]
            tl.store(ptrs, logit, mask=row_ok[:, None] & n_ok[None, :])


PREFILL_BLOCK_M = 4  # 4 queries x 32 heads = a 128-row MMA
PREFILL_BLOCK_N = 64
PREFILL_TILES = 16
PREFILL_WARPS = 8  # 4 warps: 168 registers


def _as_u8(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.uint8) if x.dtype != torch.uint8 else x


def fp8_fp4_mqa_logits(
    q: tuple[torch.Tensor, torch.Tensor | None],
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    clean_logits: bool,
) -> torch.Tensor:
    """DeepGEMM's `fp8_fp4_mqa_logits` for the FP8 path: logits fp32 [M, N], valid on [ks, ke) per row.

    q = (q8 [M, H, 128], None); kv = (k8 [N, 128], kscale fp32 [N] or [N, 1]). With clean_logits the
    columns outside [ks, ke) are -inf; without, they are left as computed or unwritten (unspecified).
    """
    q8, q_scale = q
    if q_scale is not None:
        raise NotImplementedError("MXFP4 Q (a q_scale tensor) is SM100-only; SM80 runs the FP8 path")
    k8, kscale = kv
    q8, k8 = _as_u8(q8), _as_u8(k8)
    if q8.dim() != 3 or q8.shape[2] != INDEX_DIM or not q8.is_contiguous():
        raise ValueError(f"q8 must be contiguous [M, H, {INDEX_DIM}], got {tuple(q8.shape)}")
    m, heads, _ = q8.shape
    if k8.dim() != 2 or k8.shape[1] != CODE_BYTES or k8.stride(1) != 1 or k8.stride(0) != CODE_BYTES:
        raise ValueError(f"k8 must be contiguous [N, {CODE_BYTES}], got {tuple(k8.shape)}")
    n = k8.shape[0]
    kscale = kscale.reshape(-1)
    if kscale.dtype != torch.float32 or kscale.shape[0] != n:
        raise ValueError(f"kscale must be fp32 [{n}], got {kscale.dtype} {tuple(kscale.shape)}")
    if weights.shape != (m, heads) or weights.dtype != torch.float32 or weights.stride(1) != 1:
        raise ValueError(f"weights must be fp32 [{m}, {heads}] with unit last stride")
    out = torch.empty((m, n), dtype=torch.float32, device=q8.device)
    if clean_logits:
        out.fill_(float("-inf"))
    if m and n:
        span = PREFILL_BLOCK_N * PREFILL_TILES
        _prefill_logits_kernel[(triton.cdiv(m, PREFILL_BLOCK_M), triton.cdiv(n, span))](
            q8,
            weights,
            weights.stride(0),
            k8,
            kscale.contiguous(),
            cu_seqlen_ks,
            cu_seqlen_ke,
            out,
            out.stride(0),
            m,
            n,
            HEADS=heads,
            D=INDEX_DIM,
            BLOCK_M=PREFILL_BLOCK_M,
            BLOCK_N=PREFILL_BLOCK_N,
            TILES=PREFILL_TILES,
            num_warps=PREFILL_WARPS,
        )
    if clean_logits:
        cols = torch.arange(n, device=out.device)[None, :]
        out.masked_fill_((cols < cu_seqlen_ks[:, None]) | (cols >= cu_seqlen_ke[:, None]), float("-inf"))
    return out


# ----------------------------------------------------------------------------- decode (paged)
@triton.jit
def _paged_tile_load(bt_row, cache_ptr, page_stride, block_size, n0, length, cols, dims, D: tl.constexpr):
    """Codes [D, BLOCK_N] and fp32 scales [BLOCK_N] of keys n0.. of one row (a tile within one page);
    keys at or past `length` read as 0 (and a tile wholly past it reads no table entry)."""
    live = n0 < length
    blk = tl.load(bt_row + n0 // block_size, mask=live, other=0)
    page = cache_ptr + blk.to(tl.int64) * page_stride
    off = n0 % block_size + cols
    ok = (n0 + cols) < length
    kt = tl.load(page + off[None, :] * D + dims[:, None], mask=ok[None, :], other=0)
    ks = tl.load((page + block_size * D + off * 4).to(tl.pointer_type(tl.float32)), mask=ok, other=0.0)
    return kt, ks


@triton.jit
def _paged_logits_kernel(
    q_ptr,  # uint8 [R, H, D] (rows flattened: request b, draft i -> b·next_n + i)
    w_ptr,  # fp32 [R, H]
    w_stride,
    cache_ptr,  # uint8 pages
    page_stride,
    block_size,
    bt_ptr,  # int32 [B, max_blocks]
    bt_stride,
    len_ptr,  # int32 [R] visible keys per row
    req_ptr,  # int32 [R] block-table row per row (HAS_REQ) else row // NEXT_N
    out_ptr,  # fp32 [R, max_model_len]
    out_stride,
    HEADS: tl.constexpr,
    D: tl.constexpr,
    NEXT_N: tl.constexpr,
    HAS_REQ: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TILES: tl.constexpr,
    WORDS: tl.constexpr,
    PREFETCH: tl.constexpr = False,
):
    """One row, TILES tiles of BLOCK_N keys; a tile never crosses a page (block_size % BLOCK_N == 0).
    PREFETCH: tile t+1's block-table entry, codes and scales are loaded before tile t's decode and MMA
    (masked, no branch per tile), so the table -> page chain of the next tile overlaps this one's work;
    per stored column the arithmetic is the same as without it (bitwise)."""
    row = tl.program_id(0)
    span_lo = tl.program_id(1) * (BLOCK_N * TILES)
    length = tl.load(len_ptr + row)
    if span_lo >= length:
        return
    if HAS_REQ:
        req = tl.load(req_ptr + row)
    else:
        req = row // NEXT_N
    h = tl.arange(0, HEADS)
    q_row = q_ptr + row.to(tl.int64) * HEADS * D
    q0, q1, q2, q3 = load_q_quads(q_row, HEADS, D)
    q = e4m3_to_f16_scaled(tl.load(q_row + h[:, None] * D + tl.arange(0, D)[None, :]))
    w = tl.load(w_ptr + row.to(tl.int64) * w_stride + h)
    if PREFETCH:
        bt_row = bt_ptr + req.to(tl.int64) * bt_stride
        out_row = out_ptr + row.to(tl.int64) * out_stride
        cols = tl.arange(0, BLOCK_N)
        dims = tl.arange(0, D)
        kt, ks = _paged_tile_load(bt_row, cache_ptr, page_stride, block_size, span_lo, length, cols, dims, D)
        for t in tl.range(0, TILES, num_stages=1):
            n0 = span_lo + t * BLOCK_N
            kt_n, ks_n = _paged_tile_load(
                bt_row, cache_ptr, page_stride, block_size, n0 + BLOCK_N, length, cols, dims, D
            )
            s = tl.dot(q, e4m3_to_f16_scaled(kt), out_dtype=tl.float32)
            logit = tl.sum(tl.maximum(s, 0.0) * w[:, None], axis=0)
            n = n0 + cols
            tl.store(out_row + n, logit * (ks * _UNDO), mask=n < length)
            kt, ks = kt_n, ks_n
        return
    for t in range(TILES):
        n0 = span_lo + t * BLOCK_N
        if n0 < length:
            blk = tl.load(bt_ptr + req.to(tl.int64) * bt_stride + n0 // block_size)
            page = cache_ptr + blk.to(tl.int64) * page_stride
            off = n0 % block_size + tl.arange(0, BLOCK_N)
            if WORDS:
                logit = row_logits_words(q0, q1, q2, q3, w, page + off * D, D, off >= 0)
            else:
                logit = row_logits_bytes(q, w, page + off * D, D)
            kscale = tl.load((page + block_size * D + off * 4).to(tl.pointer_type(tl.float32))) * _UNDO
            n = n0 + tl.arange(0, BLOCK_N)
            tl.store(out_ptr + row.to(tl.int64) * out_stride + n, logit * kscale, mask=n < length)


DECODE_BLOCK_N = 64
DECODE_TILES = 8
DECODE_WARPS = 4
# opt-in paged-decode variants (DEEPINFER_SM80_INDEXER_DECODE=<name>): (next-tile prefetch, warps),
# timed beside the default on the H200 (docs/INDEXER.md); "default" is the configuration above
DECODE_VARIANTS = {"default": (False, DECODE_WARPS), "prefetch": (True, 4), "prefetch-w8": (True, 8)}
DECODE_VARIANT_ENV = "DEEPINFER_SM80_INDEXER_DECODE"


def decode_variant() -> tuple[bool, int]:
    """(prefetch, warps) of the variant DEEPINFER_SM80_INDEXER_DECODE names (unset: default)."""
    name = os.environ.get(DECODE_VARIANT_ENV, "default") or "default"
    if name not in DECODE_VARIANTS:
        raise ValueError(f"{DECODE_VARIANT_ENV}={name!r}: expected one of {sorted(DECODE_VARIANTS)}")
    return DECODE_VARIANTS[name]


def sm_count(device: torch.device) -> int:
    """The device's SM count; 4 under the interpreter (CPU tensors), for the tiling heuristic only."""
    if device.type != "cuda":
        return 4
    return device_sm_count(device.index if device.index is not None else torch.cuda.current_device())


def decode_tiles(rows: int, width: int, device: torch.device) -> int:
    """Tiles per program: DECODE_TILES, halved while the grid would be under 4 programs per SM (a
    single decode row at 64K keys would otherwise run 128 programs on 132 SMs). Depends only on the
    static shape, so a captured graph keeps it."""
    tiles = DECODE_TILES
    while tiles > 1 and rows * triton.cdiv(width, DECODE_BLOCK_N * tiles) < 4 * sm_count(device):
        tiles //= 2
    return tiles


def decode_rows(
    q8: torch.Tensor, context_lens: torch.Tensor, indices: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
    """(q8 uint8 [R, H, D], lens int32 [R], block-table row per row or None, next_n) of a decode call."""
    q8 = _as_u8(q8)
    if q8.dim() != 4 or q8.shape[3] != INDEX_DIM or not q8.is_contiguous():
        raise ValueError(f"q8 must be contiguous [B, next_n, H, {INDEX_DIM}], got {tuple(q8.shape)}")
    batch, next_n, heads, _ = q8.shape
    if indices is not None:
        # varlen rows: each row names its request; context_lens is per row
        lens = context_lens.reshape(-1)[: batch * next_n].to(torch.int32)
        req = indices.reshape(-1)[: batch * next_n].to(torch.int32)
    else:
        lens, req = row_lengths(context_lens, batch, next_n), None
    return q8.reshape(batch * next_n, heads, INDEX_DIM), lens.contiguous(), req, next_n


def fp8_fp4_paged_mqa_logits(
    q: tuple[torch.Tensor, torch.Tensor | None],
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    schedule_metadata: torch.Tensor | None,
    max_model_len: int,
    clean_logits: bool,
    indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """DeepGEMM's `fp8_fp4_paged_mqa_logits` for the FP8 path: fp32 [B·next_n, max_model_len].

    Row b·next_n + i is valid on [0, len) (len per docs/INDEXER.md); beyond, unspecified unless
    clean_logits (-inf). schedule_metadata is not used (SM80 needs no DeepGEMM schedule).
    No host sync: safe inside CUDA-graph capture.
    """
    del schedule_metadata
    q8, q_scale = q
    if q_scale is not None:
        raise NotImplementedError("MXFP4 Q (a q_scale tensor) is SM100-only; SM80 runs the FP8 path")
    q8, lens, req, next_n = decode_rows(q8, context_lens, indices)
    rows, heads, _ = q8.shape
    block_size = check_k_cache(kv_cache)
    if block_size % DECODE_BLOCK_N:
        raise ValueError(f"block_size {block_size} must be a multiple of {DECODE_BLOCK_N}")
    if weights.shape != (rows, heads) or weights.dtype != torch.float32 or weights.stride(1) != 1:
        raise ValueError(f"weights must be fp32 [{rows}, {heads}] with unit last stride")
    out = torch.empty((rows, max_model_len), dtype=torch.float32, device=q8.device)
    if clean_logits:
        out.fill_(float("-inf"))
    launch_paged_logits(q8, weights, kv_cache, block_size, block_tables, lens, req, next_n, out)
    return out


def launch_paged_logits(
    q8: torch.Tensor,
    weights: torch.Tensor,
    kv_cache: torch.Tensor,
    block_size: int,
    block_tables: torch.Tensor,
    lens: torch.Tensor,
    req: torch.Tensor | None,
    next_n: int,
    out: torch.Tensor,
) -> None:
    """Unchecked launch: columns [0, min(len, out.shape[1])) of every row."""
    rows, heads, _ = q8.shape
    width = out.shape[1]
    if not rows or not width:
        return
    tiles = decode_tiles(rows, width, q8.device)
    span = DECODE_BLOCK_N * tiles
    prefetch, warps = decode_variant()
    _paged_logits_kernel[(rows, triton.cdiv(width, span))](
        q8,
        weights,
        weights.stride(0),
        kv_cache,
        kv_cache.stride(0),
        block_size,
        block_tables,
        block_tables.stride(0),
        lens,
        req if req is not None else lens,
        out,
        out.stride(0),
        HEADS=heads,
        D=INDEX_DIM,
        NEXT_N=next_n,
        HAS_REQ=req is not None,
        BLOCK_N=DECODE_BLOCK_N,
        TILES=tiles,
        WORDS=PAGED_WORD_DECODE,
        PREFETCH=prefetch,
        num_warps=warps,
    )


# fp8 codes and fp32 scales / weights / logits; the row bounds, block table, lengths int32
_PREFILL_SIG = signature(
    _prefill_logits_kernel,
    {
        "q_ptr": "u8",
        "w_ptr": "fp32",
        "k_ptr": "u8",
        "ks_ptr": "fp32",
        "cu_ks_ptr": "i32",
        "cu_ke_ptr": "i32",
        "out_ptr": "fp32",
    },
)
_PAGED_SIG = signature(
    _paged_logits_kernel,
    {
        "q_ptr": "u8",
        "w_ptr": "fp32",
        "cache_ptr": "u8",
        "bt_ptr": "i32",
        "len_ptr": "i32",
        "req_ptr": "i32",
        "out_ptr": "fp32",
    },
)
COMPILE_SPECS = (
    CompileSpec(
        "indexer.logits.prefill",
        _prefill_logits_kernel,
        _PREFILL_SIG,
        {
            "HEADS": 32,
            "D": INDEX_DIM,
            "BLOCK_M": PREFILL_BLOCK_M,
            "BLOCK_N": PREFILL_BLOCK_N,
            "TILES": PREFILL_TILES,
        },
        num_warps=PREFILL_WARPS,
        divisible_by_16=("q_ptr", "w_ptr", "k_ptr", "ks_ptr", "out_ptr", "out_stride"),
    ),
    *(
        CompileSpec(
            f"indexer.logits.paged{name}",
            _paged_logits_kernel,
            _PAGED_SIG,
            {
                "HEADS": 32,
                "D": INDEX_DIM,
                "NEXT_N": 1,
                "HAS_REQ": False,
                "BLOCK_N": DECODE_BLOCK_N,
                "TILES": DECODE_TILES,
                "WORDS": words,
                "PREFETCH": prefetch,
            },
            num_warps=warps,
            divisible_by_16=("q_ptr", "w_ptr", "cache_ptr", "page_stride", "block_size", "bt_ptr", "out_ptr"),
        )
        for name, words, prefetch, warps in (
            ("", False, False, DECODE_WARPS),
            (".words", True, False, DECODE_WARPS),
            *((f".{v}", False, *DECODE_VARIANTS[v]) for v in ("prefetch", "prefetch-w8")),
        )
    ),
)
