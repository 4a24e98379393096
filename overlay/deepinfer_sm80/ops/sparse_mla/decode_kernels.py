"""Sparse MLA decode kernels over two fp8_ds_mla caches (the layer's SWA cache, then the compressed one).

`_partial_base_kernel` is the SM80 port of upstream's split-K partial: each split takes its share of each
segment, 16 rows a step, NoPE and RoPE as two products. `_decode_kernel` walks the two segments as one
list in 16-row tiles with one 512-wide product, and with one split finishes the softmax itself.
"""

from __future__ import annotations

import triton
import triton.language as tl

from deepinfer_sm80.ops.sparse_mla.tiles import (
    _HEAD,
    _NEG_LARGE,
    _NOPE,
    _ROPE,
    finish_store,
    k_tile_512,
    k_tile_decode,
    k_tile_load,
    k_tile_split,
    mma,
    online_update,
    record_ptrs,
)


@triton.jit
def segment(q_idx, off_ptr, len_ptr, row_stride, width, RAGGED: tl.constexpr):
    """(first index offset, length) of query q_idx's slot list: ragged [indptr[q], indptr[q+1]) or the
    dense row q cut to clamp(lens[q], 0, width)."""
    if RAGGED:
        start = tl.load(off_ptr + q_idx)
        length = tl.load(off_ptr + q_idx + 1) - start
    else:
        start = q_idx.to(tl.int64) * row_stride
        length = tl.minimum(tl.maximum(tl.load(len_ptr + q_idx), 0), width)
    return start, length


@triton.jit
def joint_records(
    j,
    hi,
    main_len,
    main_cache_ptr,
    main_page_stride,
    main_rows,
    main_idx_ptr,
    main_start,
    extra_cache_ptr,
    extra_page_stride,
    extra_rows,
    extra_idx_ptr,
    extra_start,
    HAS_EXTRA: tl.constexpr,
    MAIN_BS: tl.constexpr,
    EXTRA_BS: tl.constexpr,
):
    """Record pointers and validity of list positions j ([N]) of the joint list (SWA rows, then top-k)."""
    in_main = (j < main_len) & (j < hi)
    slot_m = tl.load(main_idx_ptr + main_start + j, mask=in_main, other=-1)
    valid_m = in_main & (slot_m >= 0) & (slot_m < main_rows)
    data_ptr, scale_ptr = record_ptrs(main_cache_ptr, slot_m, valid_m, main_page_stride, MAIN_BS)
    valid = valid_m
    if HAS_EXTRA:
        in_extra = (j >= main_len) & (j < hi)
        slot_e = tl.load(extra_idx_ptr + extra_start + (j - main_len), mask=in_extra, other=-1)
        valid_e = in_extra & (slot_e >= 0) & (slot_e < extra_rows)
        data_e, scale_e = record_ptrs(extra_cache_ptr, slot_e, valid_e, extra_page_stride, EXTRA_BS)
        data_ptr = tl.where(in_main, data_ptr, data_e)
        scale_ptr = tl.where(in_main, scale_ptr, scale_e)
        valid = valid_m | valid_e
    return data_ptr, scale_ptr, valid


@triton.jit
def _base_segment(
    q_nope,
    q_rope,
    m_i,
    l_i,
    acc_nope,
    acc_rope,
    cache_ptr,
    page_stride,
    num_rows,
    idx_ptr,
    start,
    lo,
    hi,
    scale,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs = tl.arange(0, BLOCK_K)
    for k0 in range(lo, hi, BLOCK_K):
        j = k0 + offs
        in_range = j < hi
        slot = tl.load(idx_ptr + start + j, mask=in_range, other=-1)
        valid = in_range & (slot >= 0) & (slot < num_rows)
        data_ptr, scale_ptr = record_ptrs(cache_ptr, slot, valid, page_stride, BLOCK_SIZE)
        k_nope, k_rope = k_tile_split(data_ptr, scale_ptr, valid)
        scores = (mma(q_nope, tl.trans(k_nope)) + mma(q_rope, tl.trans(k_rope))) * scale
        m_i, alpha, p, l_i = online_update(m_i, l_i, scores, valid)
        acc_nope = acc_nope * alpha[:, None] + mma(p.to(tl.bfloat16), k_nope)
        acc_rope = acc_rope * alpha[:, None] + mma(p.to(tl.bfloat16), k_rope)
    return m_i, l_i, acc_nope, acc_rope


@triton.jit
def _store_partial(
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    q_idx,
    split,
    num_splits,
    num_heads,
    heads,
    head_mask,
    m_i,
    l_i,
    acc,
    COL0: tl.constexpr,
    WIDTH: tl.constexpr,
    KEEP: tl.constexpr,
):
    """Raw (m, l, acc) of one split: m/l [Tq, S, H], acc [Tq, S, H, 512] fp32; acc columns
    COL0..COL0+KEEP of a WIDTH-wide tile (each address written once: no intra-CTA store race)."""
    row = (q_idx * num_splits + split) * num_heads + heads  # [BLOCK_H]
    if COL0 == 0:
        tl.store(part_m_ptr + row, m_i, mask=head_mask)
        tl.store(part_l_ptr + row, l_i, mask=head_mask)
    local = tl.arange(0, WIDTH)
    tl.store(
        part_acc_ptr + row.to(tl.int64)[:, None] * _HEAD + COL0 + local[None, :],
        acc,
        mask=head_mask[:, None] & (local[None, :] < KEEP),
    )


@triton.jit
def _partial_base_kernel(
    q_ptr,
    q_stride0,
    q_stride1,
    main_cache_ptr,
    main_page_stride,
    main_rows,
    main_idx_ptr,
    main_off_ptr,
    main_len_ptr,
    main_row_stride,
    main_width,
    extra_cache_ptr,
    extra_page_stride,
    extra_rows,
    extra_idx_ptr,
    extra_off_ptr,
    extra_len_ptr,
    extra_row_stride,
    extra_width,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    num_splits,
    num_heads,
    scale,
    HAS_EXTRA: tl.constexpr,
    MAIN_RAGGED: tl.constexpr,
    EXTRA_RAGGED: tl.constexpr,
    MAIN_BS: tl.constexpr,
    EXTRA_BS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Grid (Tq, S, ceil(H / BLOCK_H)). Split s walks [s·c, (s+1)·c) of each segment, c = ceil(len / S)."""
    q_idx = tl.program_id(0)
    split = tl.program_id(1)
    heads = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_mask = heads < num_heads
    q_row = q_ptr + q_idx.to(tl.int64) * q_stride0 + heads[:, None] * q_stride1
    cols = tl.arange(0, 512)
    q_nope = tl.load(q_row + cols[None, :], mask=head_mask[:, None] & (cols[None, :] < _NOPE), other=0.0)
    q_rope = tl.load(q_row + _NOPE + tl.arange(0, _ROPE)[None, :], mask=head_mask[:, None], other=0.0)
    m_i = tl.full((BLOCK_H,), _NEG_LARGE, tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc_nope = tl.zeros((BLOCK_H, 512), tl.float32)
    acc_rope = tl.zeros((BLOCK_H, _ROPE), tl.float32)

    start, length = segment(q_idx, main_off_ptr, main_len_ptr, main_row_stride, main_width, MAIN_RAGGED)
    chunk = tl.cdiv(length, num_splits)
    lo = split * chunk
    m_i, l_i, acc_nope, acc_rope = _base_segment(
        q_nope,
        q_rope,
        m_i,
        l_i,
        acc_nope,
        acc_rope,
        main_cache_ptr,
        main_page_stride,
        main_rows,
        main_idx_ptr,
        start,
        lo,
        tl.minimum(lo + chunk, length),
        scale,
        MAIN_BS,
        BLOCK_K,
    )
    if HAS_EXTRA:
        start, length = segment(
            q_idx, extra_off_ptr, extra_len_ptr, extra_row_stride, extra_width, EXTRA_RAGGED
        )
        chunk = tl.cdiv(length, num_splits)
        lo = split * chunk
        m_i, l_i, acc_nope, acc_rope = _base_segment(
            q_nope,
            q_rope,
            m_i,
            l_i,
            acc_nope,
            acc_rope,
            extra_cache_ptr,
            extra_page_stride,
            extra_rows,
            extra_idx_ptr,
            start,
            lo,
            tl.minimum(lo + chunk, length),
            scale,
            EXTRA_BS,
            BLOCK_K,
        )
    # acc_nope is 512 wide with zero columns 448..511 (masked K): only its first 448 are stored
    _store_partial(
        part_m_ptr,
        part_l_ptr,
        part_acc_ptr,
        q_idx,
        split,
        num_splits,
        num_heads,
        heads,
        head_mask,
        m_i,
        l_i,
        acc_nope,
        0,
        512,
        _NOPE,
    )
    _store_partial(
        part_m_ptr,
        part_l_ptr,
        part_acc_ptr,
        q_idx,
        split,
        num_splits,
        num_heads,
        heads,
        head_mask,
        m_i,
        l_i,
        acc_rope,
        _NOPE,
        _ROPE,
        _ROPE,
    )


@triton.jit
def _decode_kernel(
    q_ptr,
    q_stride0,
    q_stride1,
    main_cache_ptr,
    main_page_stride,
    main_rows,
    main_idx_ptr,
    main_off_ptr,
    main_len_ptr,
    main_row_stride,
    main_width,
    extra_cache_ptr,
    extra_page_stride,
    extra_rows,
    extra_idx_ptr,
    extra_off_ptr,
    extra_len_ptr,
    extra_row_stride,
    extra_width,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    num_splits,
    num_heads,
    scale,
    sink_ptr,
    out_ptr,
    out_stride0,
    out_stride1,
    pos_ptr,
    cos_sin_ptr,
    cs_stride,
    HAS_EXTRA: tl.constexpr,
    MAIN_RAGGED: tl.constexpr,
    EXTRA_RAGGED: tl.constexpr,
    MAIN_BS: tl.constexpr,
    EXTRA_BS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DIRECT: tl.constexpr,
    HAS_SINK: tl.constexpr,
    FUSE_INV_ROPE: tl.constexpr,
    PREFETCH: tl.constexpr = False,
):
    """Grid (Tq, S, ceil(H / BLOCK_H)). Rows 0..Lm-1 of a query's list are its SWA slots, Lm..Lm+Le-1 its
    top-k slots; split s takes BLOCK_N-aligned chunk s of that list. DIRECT (S = 1): sink, normalisation,
    inverse RoPE and the bf16 store happen here and the reduce is skipped."""
    q_idx = tl.program_id(0)
    split = tl.program_id(1)
    heads = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_mask = heads < num_heads
    cols = tl.arange(0, _HEAD)
    q_row = q_ptr + q_idx.to(tl.int64) * q_stride0 + heads[:, None] * q_stride1
    q = tl.load(q_row + cols[None, :], mask=head_mask[:, None], other=0.0)  # [BLOCK_H, 512]

    main_start, main_len = segment(
        q_idx, main_off_ptr, main_len_ptr, main_row_stride, main_width, MAIN_RAGGED
    )
    if HAS_EXTRA:
        extra_start, extra_len = segment(
            q_idx, extra_off_ptr, extra_len_ptr, extra_row_stride, extra_width, EXTRA_RAGGED
        )
    else:
        extra_start = main_start
        extra_len = 0
    total = main_len + extra_len
    chunk = tl.cdiv(tl.cdiv(total, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, total)

    m_i = tl.full((BLOCK_H,), _NEG_LARGE, tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, _HEAD), tl.float32)
    offs = tl.arange(0, BLOCK_N)
    if PREFETCH:
        # the next tile's slot and record loads are issued before this tile's decode and products, so
        # its index -> record chain (two dependent memory round trips) overlaps this tile's work
        data_ptr, scale_ptr, valid = joint_records(
            lo + offs,
            hi,
            main_len,
            main_cache_ptr,
            main_page_stride,
            main_rows,
            main_idx_ptr,
            main_start,
            extra_cache_ptr,
            extra_page_stride,
            extra_rows,
            extra_idx_ptr,
            extra_start,
            HAS_EXTRA,
            MAIN_BS,
            EXTRA_BS,
        )
        codes, word, rope = k_tile_load(data_ptr, scale_ptr, valid)
        for k0 in tl.range(lo, hi, BLOCK_N, num_stages=1):
            data_n, scale_n, valid_n = joint_records(
                k0 + BLOCK_N + offs,
                hi,
                main_len,
                main_cache_ptr,
                main_page_stride,
                main_rows,
                main_idx_ptr,
                main_start,
                extra_cache_ptr,
                extra_page_stride,
                extra_rows,
                extra_idx_ptr,
                extra_start,
                HAS_EXTRA,
                MAIN_BS,
                EXTRA_BS,
            )
            codes_n, word_n, rope_n = k_tile_load(data_n, scale_n, valid_n)
            k = k_tile_decode(codes, word, rope, BLOCK_N)  # [BLOCK_N, 512] bf16
            scores = mma(q, tl.trans(k)) * scale
            m_i, alpha, p, l_i = online_update(m_i, l_i, scores, valid)
            acc = acc * alpha[:, None] + mma(p.to(tl.bfloat16), k)
            codes, word, rope, valid = codes_n, word_n, rope_n, valid_n
    else:
        for k0 in tl.range(lo, hi, BLOCK_N):
            j = k0 + offs
            in_main = (j < main_len) & (j < hi)
            in_extra = (j >= main_len) & (j < hi)
            slot_m = tl.load(main_idx_ptr + main_start + j, mask=in_main, other=-1)
            valid_m = in_main & (slot_m >= 0) & (slot_m < main_rows)
            data_ptr, scale_ptr = record_ptrs(main_cache_ptr, slot_m, valid_m, main_page_stride, MAIN_BS)
            valid = valid_m
            if HAS_EXTRA:
                slot_e = tl.load(extra_idx_ptr + extra_start + (j - main_len), mask=in_extra, other=-1)
                valid_e = in_extra & (slot_e >= 0) & (slot_e < extra_rows)
                data_e, scale_e = record_ptrs(extra_cache_ptr, slot_e, valid_e, extra_page_stride, EXTRA_BS)
                data_ptr = tl.where(in_main, data_ptr, data_e)
                scale_ptr = tl.where(in_main, scale_ptr, scale_e)
                valid = valid_m | valid_e
            k = k_tile_512(data_ptr, scale_ptr, valid, BLOCK_N)  # [BLOCK_N, 512] bf16
            scores = mma(q, tl.trans(k)) * scale
            m_i, alpha, p, l_i = online_update(m_i, l_i, scores, valid)
            acc = acc * alpha[:, None] + mma(p.to(tl.bfloat16), k)

    if DIRECT:
        if HAS_SINK:
            sink = tl.load(sink_ptr + heads, mask=head_mask, other=_NEG_LARGE).to(tl.float32)
            m_final = tl.maximum(m_i, sink)
        else:
            m_final = m_i
        w = tl.exp(m_i - m_final)
        l_final = w * l_i
        if HAS_SINK:
            l_final = l_final + tl.exp(sink - m_final)
        finish_store(
            acc * w[:, None],
            l_final,
            out_ptr,
            q_idx,
            heads,
            head_mask,
            out_stride0,
            out_stride1,
            pos_ptr,
            cos_sin_ptr,
            cs_stride,
            BLOCK_H,
            FUSE_INV_ROPE,
        )
    else:
        _store_partial(
            part_m_ptr,
            part_l_ptr,
            part_acc_ptr,
            q_idx,
            split,
            num_splits,
            num_heads,
            heads,
            head_mask,
            m_i,
            l_i,
            acc,
            0,
            _HEAD,
            _HEAD,
        )


@triton.jit
def _reduce_kernel(
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    num_splits: tl.constexpr,
    num_heads,
    sink_ptr,
    out_ptr,
    out_stride0,
    out_stride1,
    pos_ptr,
    cos_sin_ptr,
    cs_stride,
    HAS_SINK: tl.constexpr,
    FUSE_INV_ROPE: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Grid (Tq, ceil(H / BLOCK_H)): m* = max(max_s m_s, sink), w_s = exp(m_s − m*),
    l = Σ w_s·l_s + exp(sink − m*), out = Σ w_s·acc_s / l. Split 0 seeds the sums (no 0 + x), so one
    split gives the direct path's operands exactly; the split count is a constexpr so the unrolled
    loads of all splits issue at once."""
    q_idx = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_mask = heads < num_heads
    cols = tl.arange(0, _HEAD)
    base = q_idx * num_splits * num_heads + heads  # [BLOCK_H]: split 0
    m_0 = tl.load(part_m_ptr + base, mask=head_mask, other=_NEG_LARGE)
    m_max = m_0
    for s in tl.static_range(1, num_splits):
        m_max = tl.maximum(
            m_max, tl.load(part_m_ptr + base + s * num_heads, mask=head_mask, other=_NEG_LARGE)
        )
    if HAS_SINK:
        sink = tl.load(sink_ptr + heads, mask=head_mask, other=_NEG_LARGE).to(tl.float32)
        m_final = tl.maximum(m_max, sink)
    else:
        m_final = m_max
    w = tl.exp(m_0 - m_final)
    l_final = w * tl.load(part_l_ptr + base, mask=head_mask, other=0.0)
    acc_ptr = part_acc_ptr + base.to(tl.int64)[:, None] * _HEAD + cols[None, :]
    acc = tl.load(acc_ptr, mask=head_mask[:, None], other=0.0) * w[:, None]
    for s in tl.static_range(1, num_splits):
        row = base + s * num_heads
        w = tl.exp(tl.load(part_m_ptr + row, mask=head_mask, other=_NEG_LARGE) - m_final)
        l_final = l_final + w * tl.load(part_l_ptr + row, mask=head_mask, other=0.0)
        acc_s = tl.load(
            part_acc_ptr + row.to(tl.int64)[:, None] * _HEAD + cols[None, :], mask=head_mask[:, None]
        )
        acc = acc + acc_s * w[:, None]
    if HAS_SINK:
        l_final = l_final + tl.exp(sink - m_final)
    finish_store(
        acc,
        l_final,
        out_ptr,
        q_idx,
        heads,
        head_mask,
        out_stride0,
        out_stride1,
        pos_ptr,
        cos_sin_ptr,
        cs_stride,
        BLOCK_H,
        FUSE_INV_ROPE,
    )
