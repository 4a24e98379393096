"""Tensor-core partials for many tokens: the projection as a bf16 mma.sync GEMM against fn split hi + lo.

R' is bf16 by the spec, so R' x fn_hi + R' x fn_lo (fn_hi = bf16(fn), fn_lo = bf16(fn - fn_hi)) is
exact per product and carries fn to ~2^-16 relative: one [BM, 4*HT] x [4*HT, 48] GEMM per h-tile.
Same outputs and partials layout as `kernels.mhc_partials_kernel` (the epilogue is shared).
"""

from __future__ import annotations

import tilelang.language as T

from deepinfer_sm80.ops.mhc.kernels import MIX_SLOTS, PASS_CONFIGS, tilelang
from deepinfer_sm80.ops.mhc.splits import TC_BLOCK_M, TC_COLUMNS, TC_THREADS

# tokens per CTA, threads, columns per GEMM step (K = 4 streams x 32 = 128): one source, splits.py.
# 4 threads per token in the post-map, 8 columns (one 16-byte load per stream) each; at 128
# threads (16 columns each) the kernel took 187-204 registers, 2 CTAs per SM.
TC_H_TILE = TC_COLUMNS
TC_MIN_BLOCKS = 2  # __launch_bounds__(256, 2): <= 128 registers, 16 warps per SM


@tilelang.jit(pass_configs=PASS_CONFIGS)
def mhc_partials_tc_kernel(
    residual,
    x,
    post_mix,
    comb_mix,
    fn,
    pre_mix,
    residual_out,
    layer_input,
    aux_out,
    part_mix,
    part_sq,
    part_ysq,
    hidden: int,
    n_splits: int,
    write_aux: bool,
):
    """Fused post + pre partials for T >= a few hundred tokens (grid (ceil(T / 64), n_splits))."""
    hc = 4
    n_out = MIX_SLOTS
    bm = TC_BLOCK_M
    ht = TC_H_TILE
    kt = hc * ht
    # hi and lo columns, padded to 64 so 8 warps tile N in multiples of 8 (48 split 2 ways is 24)
    n_gemm = 64
    per_token = TC_THREADS // bm
    half = ht // per_token  # columns per thread
    num_tokens = T.dynamic("num_tokens")
    h_per_split = hidden // n_splits
    tiles = h_per_split // ht
    fn_per_thread = n_out * kt // TC_THREADS  # 12 fn values per thread per 32-column step
    aux_rows = num_tokens if write_aux else 1

    residual: T.Tensor((num_tokens, hc, hidden), T.bfloat16)  # type: ignore[no-redef, valid-type]
    x: T.Tensor((num_tokens, hidden), T.bfloat16)  # type: ignore[no-redef, valid-type]
    post_mix: T.Tensor((num_tokens, hc), T.float32)  # type: ignore[no-redef, valid-type]
    comb_mix: T.Tensor((num_tokens, hc, hc), T.float32)  # type: ignore[no-redef, valid-type]
    fn: T.Tensor((n_out, hc * hidden), T.float32)  # type: ignore[no-redef, valid-type]
    pre_mix: T.Tensor((num_tokens, hc), T.float32)  # type: ignore[no-redef, valid-type]
    residual_out: T.Tensor((num_tokens, hc, hidden), T.bfloat16)  # type: ignore[no-redef, valid-type]
    layer_input: T.Tensor((num_tokens, hidden), T.bfloat16)  # type: ignore[no-redef, valid-type]
    aux_out: T.Tensor((aux_rows, hidden), T.bfloat16)  # type: ignore[no-redef, valid-type]
    part_mix: T.Tensor((n_splits, num_tokens, n_out), T.float32)  # type: ignore[no-redef, valid-type]
    part_sq: T.Tensor((n_splits, num_tokens), T.float32)  # type: ignore[no-redef, valid-type]
    part_ysq: T.Tensor((n_splits, num_tokens), T.float32)  # type: ignore[no-redef, valid-type]

    with T.Kernel(T.ceildiv(num_tokens, bm), n_splits, threads=TC_THREADS) as (i_m, i_s):
        T.annotate_min_blocks_per_sm(TC_MIN_BLOCKS)
        tid = T.get_thread_binding()
        a_s = T.alloc_shared((bm, kt), T.bfloat16)
        b_s = T.alloc_shared((kt, n_gemm), T.bfloat16)
        c_s = T.alloc_shared((bm, n_gemm), T.float32)
        coef_post = T.alloc_shared((bm * hc,), T.float32)
        coef_comb = T.alloc_shared((bm * hc * hc,), T.float32)
        coef_pre = T.alloc_shared((bm * hc,), T.float32)
        c_f = T.alloc_fragment((bm, n_gemm), T.float32)
        rin = T.alloc_local((hc * half,), T.float32)
        xin = T.alloc_local((half,), T.float32)
        rb = T.alloc_local((hc * half,), T.bfloat16)
        rf = rin  # R' (fp32 of the stored bf16) replaces R in place
        col = T.alloc_local((hc,), T.float32)
        fv = T.alloc_local((fn_per_thread,), T.float32)
        yb = T.alloc_local((half,), T.bfloat16)
        ab = T.alloc_local((half,), T.bfloat16)
        sq = T.alloc_var(T.float32)
        ysq = T.alloc_var(T.float32)
        sq = 0.0
        ysq = 0.0
        T.clear(c_f)
        for p0 in T.serial(kt * (n_gemm - 2 * n_out) // TC_THREADS):
            idx = p0 * TC_THREADS + tid
            b_s[idx // (n_gemm - 2 * n_out), 2 * n_out + idx % (n_gemm - 2 * n_out)] = T.cast(0.0, T.bfloat16)

        m_local = tid // per_token  # this thread's token in the block
        h_half = tid % per_token  # which `half` columns of the tile
        t = i_m * bm + m_local
        live = t < num_tokens

        for c0 in T.serial(T.ceildiv(bm * hc * (hc + 2), TC_THREADS)):
            idx = c0 * TC_THREADS + tid
            if idx < bm * hc * (hc + 2):
                m = idx // (hc * (hc + 2))
                e = idx % (hc * (hc + 2))
                tt = i_m * bm + m
                ok = tt < num_tokens
                if e < hc * hc:
                    coef_comb[m * hc * hc + e] = T.if_then_else(ok, comb_mix[tt, e // hc, e % hc], 0.0)
                elif e < hc * hc + hc:
                    coef_post[m * hc + e - hc * hc] = T.if_then_else(ok, post_mix[tt, e - hc * hc], 0.0)
                else:
                    coef_pre[m * hc + e - hc * hc - hc] = T.if_then_else(
                        ok, pre_mix[tt, e - hc * hc - hc], 0.0
                    )
        T.sync_threads()

        for it in T.serial(tiles):
            h0 = i_s * h_per_split + it * ht
            hc0 = h0 + h_half * half
            # fn tile -> hi/lo bf16 in b_s[k = j*32 + h][n | 24 + n]
            # loads first, then the hi and the lo stores (in one loop TileLang put a barrier
            # between the two stores of every element: 12 per tile)
            for r0 in T.unroll(fn_per_thread):
                idx = r0 * TC_THREADS + tid
                fv[r0] = fn[idx // kt, ((idx % kt) // ht) * hidden + h0 + idx % ht]
            for r0 in T.unroll(fn_per_thread):
                idx = r0 * TC_THREADS + tid
                b_s[idx % kt, idx // kt] = T.cast(fv[r0], T.bfloat16)
            for r0 in T.unroll(fn_per_thread):
                idx = r0 * TC_THREADS + tid
                lo = fv[r0] - T.cast(T.cast(fv[r0], T.bfloat16), T.float32)
                b_s[idx % kt, n_out + idx // kt] = T.cast(lo, T.bfloat16)
            if live:
                for j in T.unroll(hc):
                    for v in T.vectorized(half):
                        rin[j * half + v] = T.cast(residual[t, j, hc0 + v], T.float32)
                for v in T.vectorized(half):
                    xin[v] = T.cast(x[t, hc0 + v], T.float32)
                # R' overwrites R column by column (4 temporaries, not a second 64-float array)
                for v in T.unroll(half):
                    for k in T.unroll(hc):
                        col[k] = rin[k * half + v]
                    for j in T.unroll(hc):
                        val = T.alloc_var(T.float32)
                        val = coef_post[m_local * hc + j] * xin[v]
                        for k in T.unroll(hc):
                            val = val + coef_comb[(m_local * hc + k) * hc + j] * col[k]
                        rb[j * half + v] = T.cast(val, T.bfloat16)
                        rf[j * half + v] = T.cast(rb[j * half + v], T.float32)
                        sq = sq + rf[j * half + v] * rf[j * half + v]
                for j in T.unroll(hc):
                    for v in T.vectorized(half):
                        residual_out[t, j, hc0 + v] = rb[j * half + v]
                    for v in T.unroll(half):
                        a_s[m_local, j * ht + h_half * half + v] = rb[j * half + v]
                for v in T.unroll(half):
                    y = T.alloc_var(T.float32)
                    y = 0.0
                    for j in T.unroll(hc):
                        y = y + coef_pre[m_local * hc + j] * rf[j * half + v]
                    yb[v] = T.cast(y, T.bfloat16)
                    yf = T.cast(yb[v], T.float32)
                    ysq = ysq + yf * yf
                    if write_aux:
                        s = T.alloc_var(T.float32)
                        s = 0.0
                        for j in T.unroll(hc):
                            s = s + rf[j * half + v]
                        ab[v] = T.cast(s / hc, T.bfloat16)
                for v in T.vectorized(half):
                    layer_input[t, hc0 + v] = yb[v]
                if write_aux:
                    for v in T.vectorized(half):
                        aux_out[t, hc0 + v] = ab[v]
            else:
                for j in T.unroll(hc):
                    for v in T.unroll(half):
                        a_s[m_local, j * ht + h_half * half + v] = T.cast(0.0, T.bfloat16)
            T.sync_threads()
            T.gemm(a_s, b_s, c_f)
            T.sync_threads()

        T.copy(c_f, c_s)
        # the threads of a token are adjacent lanes: xor-shuffles over 1, 2 sum them
        sq_pair = sq + T.shfl_xor(sq, 1)
        sq_tok = sq_pair + T.shfl_xor(sq_pair, 2)
        ysq_pair = ysq + T.shfl_xor(ysq, 1)
        ysq_tok = ysq_pair + T.shfl_xor(ysq_pair, 2)
        T.sync_threads()
        if live and h_half == 0:
            part_sq[i_s, t] = sq_tok
            part_ysq[i_s, t] = ysq_tok
        for r0 in T.serial(bm * n_out // TC_THREADS):
            idx = r0 * TC_THREADS + tid
            m = idx // n_out
            n = idx % n_out
            tt = i_m * bm + m
            if tt < num_tokens:
                part_mix[i_s, tt, n] = c_s[m, n] + c_s[m, n_out + n]
