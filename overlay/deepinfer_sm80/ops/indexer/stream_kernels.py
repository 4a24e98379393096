"""The streamed indexer's Triton kernels: one chunk of selection keys per program, for prefill (dense
per-query K), decode (paged K) and the candidate-only layers (24..36); `stream.py` plans and launches them.

Each kernel scores a chunk and writes int64 selection keys (select.py: score << 32 | ~column) behind the
K keys kept so far; the host merges them with one integer top-k.
"""

from __future__ import annotations

import triton
import triton.language as tl

from deepinfer_sm80.ops.indexer.logits import (
    e4m3_to_f16_scaled,
    load_q_quads,
    row_logits_bytes,
    row_logits_words,
)
from deepinfer_sm80.ops.indexer.select import INVALID_KEY

_INVALID = tl.constexpr(INVALID_KEY)
_UNDO = tl.constexpr(65536.0)


# ----------------------------------------------------------------------------- device helpers
@triton.jit
def score_key(v, col, valid):
    """int64 selection key of fp32 scores v at int32 columns col (broadcastable); INVALID where not valid."""
    v = tl.where(v == 0.0, 0.0, v)  # -0 == +0
    bits = v.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    ordered = tl.where(v != v, 0x7FFFFFFF, ordered)  # NaN first, as torch.topk
    low = (~col).to(tl.uint32, bitcast=True).to(tl.int64)  # 2^32 - 1 - col
    key = (ordered.to(tl.int64) << 32) | low
    return tl.where(valid, key, _INVALID)


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _store_block_keys(
    blk_ptr,
    blk_stride,
    r,
    r_ok,
    logit,
    valid,
    j0,
    length,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BS: tl.constexpr,
    AS_VALUES: tl.constexpr,
):
    """Layer 20's block scores of one [BLOCK_M, BLOCK_N] tile starting at row-local column j0 (a multiple
    of BS): int64 keys, or (AS_VALUES) fp32 scores with -inf for blocks without a valid column."""
    nb: tl.constexpr = BLOCK_N // BS
    lm = tl.where(valid, logit, float("-inf"))
    bmax = tl.reduce(tl.reshape(lm, (BLOCK_M, nb, BS)), 2, _max_nan)  # [BLOCK_M, nb]
    b = j0 // BS + tl.arange(0, nb)
    newest = b[None, :] == ((length - 1) // BS)[:, None]
    bmax = tl.where(newest, float("inf"), bmax)
    bvalid = (b[None, :] * BS) < length[:, None]
    ptrs = blk_ptr + r.to(tl.int64)[:, None] * blk_stride + b[None, :]
    if AS_VALUES:
        tl.store(
            ptrs.to(tl.pointer_type(tl.float32)), tl.where(bvalid, bmax, float("-inf")), mask=r_ok[:, None]
        )
    else:
        tl.store(ptrs, score_key(bmax, b[None, :], bvalid), mask=r_ok[:, None])


# ----------------------------------------------------------------------------- prefill chunk
@triton.jit
def _prefill_keys_kernel(
    q_ptr,  # uint8 [M, H, D]
    w_ptr,  # fp32 [M, H]
    w_stride,
    k_ptr,  # uint8 [N, D]
    kscale_ptr,  # fp32 [N]
    cu_ks_ptr,
    cu_ke_ptr,
    row0,
    nrows,
    c0,  # first row-local column of this chunk
    keys_ptr,  # [R, KEEP + C] int64 keys (or fp32 scores, AS_VALUES): chunk column j at KEEP + (j - c0)
    keys_stride,
    blk_ptr,  # [R, KEEP_BLOCKS + C / BS], same dtype (WRITE_BLOCKS)
    blk_stride,
    HEADS: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TILES: tl.constexpr,
    KEEP: tl.constexpr,
    KEEP_BLOCKS: tl.constexpr,
    BS: tl.constexpr,
    WRITE_BLOCKS: tl.constexpr,
    AS_VALUES: tl.constexpr,
):
    pid_m = tl.program_id(0)
    r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    r_ok = r < nrows
    grow = row0 + r
    ks = tl.load(cu_ks_ptr + grow, mask=r_ok, other=0)
    ke = tl.load(cu_ke_ptr + grow, mask=r_ok, other=0)
    length = tl.where(r_ok, tl.maximum(ke - ks, 0), 0)
    maxlen = tl.max(length, axis=0)
    ks_first = tl.min(tl.where(r_ok, ks, 2147483647), axis=0)
    uniform = ks_first == tl.max(tl.where(r_ok, ks, -2147483647), axis=0)
    qh = (row0 + pid_m * BLOCK_M) * HEADS + tl.arange(0, BLOCK_M * HEADS)
    qh_ok = tl.arange(0, BLOCK_M * HEADS) < (nrows - pid_m * BLOCK_M) * HEADS
    d = tl.arange(0, D)
    q = e4m3_to_f16_scaled(
        tl.load(q_ptr + qh.to(tl.int64)[:, None] * D + d[None, :], mask=qh_ok[:, None], other=0)
    )
    w = tl.load(w_ptr + (qh // HEADS).to(tl.int64) * w_stride + qh % HEADS, mask=qh_ok, other=0.0)
    h = tl.arange(0, HEADS)
    mi = tl.arange(0, BLOCK_M)
    for t in range(TILES):
        j0 = (tl.program_id(1) * TILES + t) * BLOCK_N  # offset inside the chunk
        j = c0 + j0 + tl.arange(0, BLOCK_N)  # row-local columns
        valid = j[None, :] < length[:, None]
        if c0 + j0 < maxlen:
            if uniform:
                n = ks_first + j
                kt = tl.load(
                    k_ptr + n.to(tl.int64)[None, :] * D + d[:, None], mask=(j < maxlen)[None, :], other=0
                )
                s = tl.dot(q, e4m3_to_f16_scaled(kt), out_dtype=tl.float32)
                s = tl.maximum(s, 0.0) * w[:, None]
                logit = tl.sum(tl.reshape(s, (BLOCK_M, HEADS, BLOCK_N)), axis=1)
                kscale = tl.load(kscale_ptr + n, mask=j < maxlen, other=0.0) * _UNDO
                logit = logit * kscale[None, :]
            else:  # rows of different requests: one 32-row MMA per query
                logit = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for m in range(BLOCK_M):
                    ks_m = tl.sum(tl.where(mi == m, ks, 0), axis=0)
                    len_m = tl.sum(tl.where(mi == m, length, 0), axis=0)
                    n = ks_m + j
                    kt = tl.load(
                        k_ptr + n.to(tl.int64)[None, :] * D + d[:, None], mask=(j < len_m)[None, :], other=0
                    )
                    qm_row = (row0 + pid_m * BLOCK_M + m).to(tl.int64)
                    m_ok = pid_m * BLOCK_M + m < nrows
                    qm = tl.load(q_ptr + (qm_row * HEADS + h[:, None]) * D + d[None, :], mask=m_ok, other=0)
                    wm = tl.load(w_ptr + qm_row * w_stride + h, mask=m_ok, other=0.0)
                    sm = tl.dot(e4m3_to_f16_scaled(qm), e4m3_to_f16_scaled(kt), out_dtype=tl.float32)
                    lm = tl.sum(tl.maximum(sm, 0.0) * wm[:, None], axis=0)
                    lm = lm * (tl.load(kscale_ptr + n, mask=j < len_m, other=0.0) * _UNDO)
                    logit = tl.where(mi[:, None] == m, lm[None, :], logit)
        else:
            logit = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        ptrs = keys_ptr + r.to(tl.int64)[:, None] * keys_stride + KEEP + j0 + tl.arange(0, BLOCK_N)[None, :]
        if AS_VALUES:  # fp32 scores, -inf where not valid: the host pre-selects with an fp32 top-k
            tl.store(ptrs, tl.where(valid, logit, float("-inf")), mask=r_ok[:, None])
        else:  # int64 selection keys, INVALID where not valid
            tl.store(ptrs, score_key(logit, j[None, :], valid), mask=r_ok[:, None])
        if WRITE_BLOCKS:
            _store_block_keys(
                blk_ptr + KEEP_BLOCKS - c0 // BS,
                blk_stride,
                r,
                r_ok,
                logit,
                valid,
                c0 + j0,
                length,
                BLOCK_M,
                BLOCK_N,
                BS,
                AS_VALUES,
            )


# ----------------------------------------------------------------------------- decode chunk (paged)
@triton.jit
def _paged_keys_kernel(
    q_ptr,  # uint8 [R, H, D]
    w_ptr,
    w_stride,
    cache_ptr,
    page_stride,
    block_size,
    bt_ptr,
    bt_stride,
    len_ptr,  # int32 [R]
    req_ptr,
    c0,
    keys_ptr,
    keys_stride,
    blk_ptr,
    blk_stride,
    HEADS: tl.constexpr,
    D: tl.constexpr,
    NEXT_N: tl.constexpr,
    HAS_REQ: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TILES: tl.constexpr,
    KEEP: tl.constexpr,
    KEEP_BLOCKS: tl.constexpr,
    BS: tl.constexpr,
    WRITE_BLOCKS: tl.constexpr,
    WORDS: tl.constexpr,
):
    row = tl.program_id(0)
    length = tl.load(len_ptr + row)
    if HAS_REQ:
        req = tl.load(req_ptr + row)
    else:
        req = row // NEXT_N
    h = tl.arange(0, HEADS)
    q_row = q_ptr + row.to(tl.int64) * HEADS * D
    q0, q1, q2, q3 = load_q_quads(q_row, HEADS, D)
    q = e4m3_to_f16_scaled(tl.load(q_row + h[:, None] * D + tl.arange(0, D)[None, :]))
    w = tl.load(w_ptr + row.to(tl.int64) * w_stride + h)
    one = tl.arange(0, 1)
    for t in range(TILES):
        j0 = (tl.program_id(1) * TILES + t) * BLOCK_N
        j = c0 + j0 + tl.arange(0, BLOCK_N)
        valid = j < length
        if c0 + j0 < length:
            blk = tl.load(bt_ptr + req.to(tl.int64) * bt_stride + (c0 + j0) // block_size)
            page = cache_ptr + blk.to(tl.int64) * page_stride
            off = (c0 + j0) % block_size + tl.arange(0, BLOCK_N)
            if WORDS:
                logit = row_logits_words(q0, q1, q2, q3, w, page + off * D, D, off >= 0)
            else:
                logit = row_logits_bytes(q, w, page + off * D, D)
            logit = logit * (
                tl.load((page + block_size * D + off * 4).to(tl.pointer_type(tl.float32))) * _UNDO
            )
            keys = score_key(logit, j, valid)
        else:
            logit = tl.zeros((BLOCK_N,), dtype=tl.float32)
            keys = tl.full((BLOCK_N,), _INVALID, tl.int64)
        tl.store(keys_ptr + row.to(tl.int64) * keys_stride + KEEP + j0 + tl.arange(0, BLOCK_N), keys)
        if WRITE_BLOCKS:
            _store_block_keys(
                blk_ptr + KEEP_BLOCKS - c0 // BS,
                blk_stride,
                row + one,
                one == 0,
                logit[None, :],
                valid[None, :],
                c0 + j0,
                length + one * 0,
                1,
                BLOCK_N,
                BS,
                False,
            )


# ----------------------------------------------------------------------------- candidate-only scoring
@triton.jit
def _candidate_keys_kernel(
    q_ptr,
    w_ptr,
    w_stride,
    k_ptr,  # PAGED: page pool; else uint8 [N, D]
    kscale_ptr,  # not PAGED: fp32 [N]
    page_stride,
    block_size,
    bt_ptr,
    bt_stride,
    start_ptr,  # not PAGED: int32 ks per row
    len_ptr,  # int32 row lengths
    req_ptr,
    row0,
    cand_ptr,  # int32 [rows, NCAND] row-local block ids, -1 = none
    cand_stride,
    keys_ptr,
    keys_stride,
    HEADS: tl.constexpr,
    D: tl.constexpr,
    NEXT_N: tl.constexpr,
    HAS_REQ: tl.constexpr,
    PAGED: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TILES: tl.constexpr,
    KEEP: tl.constexpr,
    BS: tl.constexpr,
):
    r = tl.program_id(0)
    row = row0 + r
    length = tl.load(len_ptr + row)
    h = tl.arange(0, HEADS)
    d = tl.arange(0, D)
    q = e4m3_to_f16_scaled(tl.load(q_ptr + (row.to(tl.int64) * HEADS + h[:, None]) * D + d[None, :]))
    w = tl.load(w_ptr + row.to(tl.int64) * w_stride + h)
    for t in range(TILES):
        slot = (tl.program_id(1) * TILES + t) * BLOCK_N + tl.arange(0, BLOCK_N)
        blk = tl.load(cand_ptr + row.to(tl.int64) * cand_stride + slot // BS)
        col = blk * BS + slot % BS  # row-local column
        valid = (blk >= 0) & (col < length)
        if PAGED:
            if HAS_REQ:
                req = tl.load(req_ptr + row)
            else:
                req = row // NEXT_N
            pblk = tl.load(bt_ptr + req.to(tl.int64) * bt_stride + col // block_size, mask=valid, other=0)
            page = k_ptr + pblk.to(tl.int64) * page_stride
            off = col % block_size
            kt = tl.load(page[None, :] + off[None, :] * D + d[:, None], mask=valid[None, :], other=0)
            kscale = tl.load(
                (page + block_size * D + off * 4).to(tl.pointer_type(tl.float32)), mask=valid, other=0.0
            )
        else:
            n = tl.load(start_ptr + row) + col
            kt = tl.load(k_ptr + n.to(tl.int64)[None, :] * D + d[:, None], mask=valid[None, :], other=0)
            kscale = tl.load(kscale_ptr + n, mask=valid, other=0.0)
        s = tl.dot(q, e4m3_to_f16_scaled(kt), out_dtype=tl.float32)
        logit = tl.sum(tl.maximum(s, 0.0) * w[:, None], axis=0) * (kscale * _UNDO)
        tl.store(keys_ptr + r.to(tl.int64) * keys_stride + KEEP + slot, score_key(logit, col, valid))
