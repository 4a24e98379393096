"""TileLang kernels of one mHC boundary: split-h partials (post, collapse, projection) and the epilogue.

Numerics are those of `reference.py`: R' in fp32 with k in order, stored bf16, and the stored bf16
R' is what the projection, its square sum and the collapse read (the same at every token count).
Imported only where TileLang is installed; the split selector and the reference need neither.
"""

from __future__ import annotations

import tilelang
import tilelang.language as T

# TMA and warp specialisation do not exist below sm_90; keep TileLang from planning for them.
PASS_CONFIGS = {
    tilelang.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True,
    tilelang.PassConfigKey.TL_DISABLE_TMA_LOWER: True,
}
MIX_SLOTS = 24  # hc_mult * (hc_mult + 2) at hc_mult 4: 4 pre, 4 post, 16 comb
EPILOGUE_VEC = 8  # bf16 per thread in the epilogue: one 16-byte load


def partials_max_regs(block_m: int) -> int:
    """Registers per thread the partials kernel is held to (via __launch_bounds__ min blocks).

    Left alone, nvcc hoists all 96 fn loads of an iteration and takes 240-255 registers (8 B
    spilled at one warp per CTA), capping an SM at 4-8 CTAs; 128 fits block_m <= 2 with no spill.
    block_m 4 keeps 96 accumulators + 32 stream values and spills ~400 B at 128, so it gets 255.
    """
    return 128 if block_m <= 2 else 255


@tilelang.jit(pass_configs=PASS_CONFIGS)
def mhc_partials_kernel(
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
    gemm_width: int,
    has_post: bool,
    use_pre_mix: bool,
    write_aux: bool,
    block_m: int,
    n_thr: int,
    n_splits: int,
    vec: int,
    n_groups: int = 1,
):
    """One CTA: `block_m` tokens x one h-slice of `hidden // n_splits` columns.

    Writes R' (has_post), the unnormalised bf16 collapse y into `layer_input`, the stream mean
    (write_aux), and per-split partials: 24 projections, sum of squares of the projected row, sum
    of y^2. gemm_width = 4*hidden projects the streams; = hidden projects `x` (the first layer's
    embedding, whose broadcast streams are 4 copies of it).

    The warps form `n_groups` output groups over the same columns: group g projects outputs
    [g*24/n_groups, (g+1)*24/n_groups), so a thread issues 96/n_groups fn loads per iteration
    instead of 96 (one memory round instead of several at few tokens); every group post-maps its
    columns (the stream loads are shared through L1), group 0 alone stores.
    """
    hc = 4
    n_out = MIX_SLOTS
    n_per = n_out // n_groups
    num_tokens = T.dynamic("num_tokens")
    h_per_split = hidden // n_splits
    n_warps = n_thr // 32
    h_warps = n_warps // n_groups
    cols_per_iter = 32 * h_warps * vec
    iters = h_per_split // cols_per_iter
    n_red = block_m * (n_per + 2)
    on_streams = gemm_width == hc * hidden
    coef_in_regs = block_m <= 2  # 24 floats per token; at block_m 4 they go to shared memory
    # arguments a variant never touches are (1, ...) placeholders
    post_rows = num_tokens if has_post else 1
    x_rows = num_tokens if (has_post or not on_streams) else 1
    pre_rows = num_tokens if use_pre_mix else 1
    aux_rows = num_tokens if write_aux else 1

    residual: T.Tensor((num_tokens, hc, hidden), T.bfloat16)  # type: ignore[no-redef, valid-type]
    x: T.Tensor((x_rows, hidden), T.bfloat16)  # type: ignore[no-redef, valid-type]
    post_mix: T.Tensor((post_rows, hc), T.float32)  # type: ignore[no-redef, valid-type]
    comb_mix: T.Tensor((post_rows, hc, hc), T.float32)  # type: ignore[no-redef, valid-type]
    fn: T.Tensor((n_out, gemm_width), T.float32)  # type: ignore[no-redef, valid-type]
    pre_mix: T.Tensor((pre_rows, hc), T.float32)  # type: ignore[no-redef, valid-type]
    residual_out: T.Tensor((post_rows, hc, hidden), T.bfloat16)  # type: ignore[no-redef, valid-type]
    layer_input: T.Tensor((num_tokens, hidden), T.bfloat16)  # type: ignore[no-redef, valid-type]
    aux_out: T.Tensor((aux_rows, hidden), T.bfloat16)  # type: ignore[no-redef, valid-type]
    part_mix: T.Tensor((n_splits, num_tokens, n_out), T.float32)  # type: ignore[no-redef, valid-type]
    part_sq: T.Tensor((n_splits, num_tokens), T.float32)  # type: ignore[no-redef, valid-type]
    part_ysq: T.Tensor((n_splits, num_tokens), T.float32)  # type: ignore[no-redef, valid-type]

    with T.Kernel(T.ceildiv(num_tokens, block_m), n_splits, threads=n_thr) as (i_m, i_s):
        T.annotate_min_blocks_per_sm(max(1, min(16, 65536 // (n_thr * partials_max_regs(block_m)))))
        tid = T.get_thread_binding()
        lane = tid % 32
        warp = tid // 32
        grp = warp % n_groups
        h_warp = warp // n_groups
        acc = T.alloc_local((block_m * n_per,), T.float32)
        sq = T.alloc_local((block_m,), T.float32)
        ysq = T.alloc_local((block_m,), T.float32)
        if coef_in_regs:
            coef_post = T.alloc_local((block_m * hc,), T.float32)
            coef_comb = T.alloc_local((block_m * hc * hc,), T.float32)
            coef_pre = T.alloc_local((block_m * hc,), T.float32)
        else:
            coef_post = T.alloc_shared((block_m * hc,), T.float32)
            coef_comb = T.alloc_shared((block_m * hc * hc,), T.float32)
            coef_pre = T.alloc_shared((block_m * hc,), T.float32)
        rin = T.alloc_local((hc * vec,), T.float32)
        xin = T.alloc_local((vec,), T.float32)
        rnew = T.alloc_local((block_m * hc * vec,), T.float32)
        xg = T.alloc_local((block_m * vec,), T.float32)
        rb = T.alloc_local((hc * vec,), T.bfloat16)
        yb = T.alloc_local((vec,), T.bfloat16)
        ab = T.alloc_local((vec,), T.bfloat16)
        red = T.alloc_shared((n_warps, n_red), T.float32)
        T.clear(acc)
        T.clear(sq)
        T.clear(ysq)

        if coef_in_regs:
            # every thread loads its tokens' 24 coefficients (same address across the warp: one
            # broadcast transaction each) with no barrier in front of the fn loads
            for m in T.unroll(block_m):
                t = i_m * block_m + m
                ok = t < num_tokens
                for j in T.unroll(hc):
                    if has_post:
                        coef_post[m * hc + j] = T.if_then_else(ok, post_mix[t, j], 0.0)
                        for k in T.unroll(hc):
                            coef_comb[(m * hc + k) * hc + j] = T.if_then_else(ok, comb_mix[t, k, j], 0.0)
                    if use_pre_mix:
                        coef_pre[m * hc + j] = T.if_then_else(ok, pre_mix[t, j], 0.0)
                    else:
                        coef_pre[m * hc + j] = T.if_then_else(j == 0, 1.0, 0.0)
        else:
            for c0 in T.serial(T.ceildiv(block_m * hc * (hc + 2), n_thr)):
                idx = c0 * n_thr + tid
                if idx < block_m * hc * (hc + 2):
                    m = idx // (hc * (hc + 2))
                    e = idx % (hc * (hc + 2))
                    t = i_m * block_m + m
                    ok = t < num_tokens
                    if e < hc * hc:
                        # comb[k, j] at e = k*4 + j
                        if has_post:
                            coef_comb[m * hc * hc + e] = T.if_then_else(ok, comb_mix[t, e // hc, e % hc], 0.0)
                    elif e < hc * hc + hc:
                        if has_post:
                            coef_post[m * hc + e - hc * hc] = T.if_then_else(
                                ok, post_mix[t, e - hc * hc], 0.0
                            )
                    else:
                        jj = e - hc * hc - hc
                        if use_pre_mix:
                            coef_pre[m * hc + jj] = T.if_then_else(ok, pre_mix[t, jj], 0.0)
                        else:
                            coef_pre[m * hc + jj] = T.if_then_else(jj == 0, 1.0, 0.0)
            T.sync_threads()

        for it in T.serial(iters):
            h0 = i_s * h_per_split + (it * h_warps + h_warp) * (32 * vec) + lane * vec
            for m in T.unroll(block_m):
                t = i_m * block_m + m
                if t < num_tokens:
                    for j in T.unroll(hc):
                        for v in T.vectorized(vec):
                            rin[j * vec + v] = T.cast(residual[t, j, h0 + v], T.float32)
                    if has_post or not on_streams:
                        for v in T.vectorized(vec):
                            xin[v] = T.cast(x[t, h0 + v], T.float32)
                    for j in T.unroll(hc):
                        for v in T.unroll(vec):
                            if has_post:
                                # R'[j] = post[j]*x + sum_k comb[k,j]*R[k], k in order, then bf16
                                val = T.alloc_var(T.float32)
                                val = coef_post[m * hc + j] * xin[v]
                                for k in T.unroll(hc):
                                    val = val + coef_comb[(m * hc + k) * hc + j] * rin[k * vec + v]
                                rb[j * vec + v] = T.cast(val, T.bfloat16)
                            else:
                                rb[j * vec + v] = T.cast(rin[j * vec + v], T.bfloat16)
                            rnew[(m * hc + j) * vec + v] = T.cast(rb[j * vec + v], T.float32)
                    for v in T.unroll(vec):
                        y = T.alloc_var(T.float32)
                        y = 0.0
                        for j in T.unroll(hc):
                            y = y + coef_pre[m * hc + j] * rnew[(m * hc + j) * vec + v]
                        yb[v] = T.cast(y, T.bfloat16)
                        yf = T.cast(yb[v], T.float32)
                        ysq[m] += yf * yf
                        if write_aux:
                            s = T.alloc_var(T.float32)
                            s = 0.0
                            for j in T.unroll(hc):
                                s = s + rnew[(m * hc + j) * vec + v]
                            ab[v] = T.cast(s / hc, T.bfloat16)
                    if grp == 0:
                        if has_post:
                            for j in T.unroll(hc):
                                for v in T.vectorized(vec):
                                    residual_out[t, j, h0 + v] = rb[j * vec + v]
                        for v in T.vectorized(vec):
                            layer_input[t, h0 + v] = yb[v]
                        if write_aux:
                            for v in T.vectorized(vec):
                                aux_out[t, h0 + v] = ab[v]
                    if on_streams:
                        for j in T.unroll(hc):
                            for v in T.unroll(vec):
                                rv = rnew[(m * hc + j) * vec + v]
                                sq[m] += rv * rv
                    else:
                        for v in T.unroll(vec):
                            xg[m * vec + v] = xin[v]
                            sq[m] += xin[v] * xin[v]
                else:
                    for j in T.unroll(hc):
                        for v in T.unroll(vec):
                            rnew[(m * hc + j) * vec + v] = 0.0
                    for v in T.unroll(vec):
                        xg[m * vec + v] = 0.0
            # projection: each fn element is loaded once and used for all block_m tokens
            for nn in T.unroll(n_per):
                n = grp * n_per + nn
                if on_streams:
                    for j in T.unroll(hc):
                        wv = T.alloc_local((vec,), T.float32)
                        for v in T.vectorized(vec):
                            wv[v] = fn[n, j * hidden + h0 + v]
                        for v in T.unroll(vec):
                            for m in T.unroll(block_m):
                                acc[m * n_per + nn] += wv[v] * rnew[(m * hc + j) * vec + v]
                else:
                    wx = T.alloc_local((vec,), T.float32)
                    for v in T.vectorized(vec):
                        wx[v] = fn[n, h0 + v]
                    for v in T.unroll(vec):
                        for m in T.unroll(block_m):
                            acc[m * n_per + nn] += wx[v] * xg[m * vec + v]

        # block reduction: warp shuffles, then across the h-warps of each group in shared memory
        for m in T.unroll(block_m):
            for nn in T.unroll(n_per):
                acc[m * n_per + nn] = T.warp_reduce_sum(acc[m * n_per + nn])
            sq[m] = T.warp_reduce_sum(sq[m])
            ysq[m] = T.warp_reduce_sum(ysq[m])
        if lane == 0:
            for m in T.unroll(block_m):
                for nn in T.unroll(n_per):
                    red[warp, m * (n_per + 2) + nn] = acc[m * n_per + nn]
                red[warp, m * (n_per + 2) + n_per] = sq[m]
                red[warp, m * (n_per + 2) + n_per + 1] = ysq[m]
        T.sync_threads()
        for r0 in T.serial(T.ceildiv(n_groups * n_red, n_thr)):
            idx = r0 * n_thr + tid
            if idx < n_groups * n_red:
                g = idx // n_red
                r = idx % n_red
                total = T.alloc_var(T.float32)
                total = 0.0
                for w in T.unroll(h_warps):
                    total = total + red[w * n_groups + g, r]
                m = r // (n_per + 2)
                col = r % (n_per + 2)
                t = i_m * block_m + m
                if t < num_tokens:
                    if col < n_per:
                        part_mix[i_s, t, g * n_per + col] = total
                    elif g == 0:
                        if col == n_per:
                            part_sq[i_s, t] = total
                        else:
                            part_ysq[i_s, t] = total


@tilelang.jit(pass_configs=PASS_CONFIGS)
def mhc_epilogue_kernel(
    part_mix,
    part_sq,
    part_ysq,
    hc_scale,
    hc_base,
    norm_weight,
    layer_input,
    post_out,
    comb_out,
    pre_out,
    hidden: int,
    n_splits: int,
    rms_numel: int,
    rms_eps: float,
    hc_pre_eps: float,
    hc_sinkhorn_eps: float,
    hc_post_mult_value: float,
    sinkhorn_repeat: int,
    norm_eps: float,
    use_norm: bool,
    n_thr: int,
):
    """Grid (tokens, hidden chunks + 1): each chunk CTA RMS-normalises its 1024 columns of y in
    place; the extra CTA (index n_chunks) turns the reduced projections into pre/post gates and the
    Sinkhorn-normalised 4x4 comb, in parallel with them (Sinkhorn is the longest dependent chain).

    Sinkhorn runs on 16 lanes of warp 0, one matrix entry each; row sums are xor-shuffles over
    lanes 1,2 and column sums over lanes 4,8.
    """
    hc = 4
    n_out = MIX_SLOTS
    num_tokens = T.dynamic("num_tokens")
    chunk = n_thr * EPILOGUE_VEC
    n_chunks = hidden // chunk

    part_mix: T.Tensor((n_splits, num_tokens, n_out), T.float32)  # type: ignore[no-redef, valid-type]
    part_sq: T.Tensor((n_splits, num_tokens), T.float32)  # type: ignore[no-redef, valid-type]
    part_ysq: T.Tensor((n_splits, num_tokens), T.float32)  # type: ignore[no-redef, valid-type]
    hc_scale: T.Tensor((3,), T.float32)  # type: ignore[no-redef, valid-type]
    hc_base: T.Tensor((n_out,), T.float32)  # type: ignore[no-redef, valid-type]
    norm_weight: T.Tensor((hidden,), T.bfloat16)  # type: ignore[no-redef, valid-type]
    layer_input: T.Tensor((num_tokens, hidden), T.bfloat16)  # type: ignore[no-redef, valid-type]
    post_out: T.Tensor((num_tokens, hc), T.float32)  # type: ignore[no-redef, valid-type]
    comb_out: T.Tensor((num_tokens, hc * hc), T.float32)  # type: ignore[no-redef, valid-type]
    pre_out: T.Tensor((num_tokens, hc), T.float32)  # type: ignore[no-redef, valid-type]

    with T.Kernel(num_tokens, n_chunks + 1, threads=n_thr) as (t, i_c):
        tid = T.get_thread_binding()
        mixes = T.alloc_shared((n_out,), T.float32)
        if use_norm and i_c < n_chunks:
            ytot = T.alloc_var(T.float32)
            ytot = 0.0
            for s in T.unroll(n_splits):  # all split loads in flight at once
                ytot = ytot + part_ysq[s, t]
            rnorm = T.rsqrt(ytot / hidden + norm_eps)
            yv = T.alloc_local((EPILOGUE_VEC,), T.bfloat16)
            wv = T.alloc_local((EPILOGUE_VEC,), T.bfloat16)
            ov = T.alloc_local((EPILOGUE_VEC,), T.bfloat16)
            h0 = i_c * chunk + tid * EPILOGUE_VEC
            for v in T.vectorized(EPILOGUE_VEC):
                yv[v] = layer_input[t, h0 + v]
            for v in T.vectorized(EPILOGUE_VEC):
                wv[v] = norm_weight[h0 + v]
            for v in T.unroll(EPILOGUE_VEC):
                ov[v] = T.cast(T.cast(yv[v], T.float32) * rnorm * T.cast(wv[v], T.float32), T.bfloat16)
            for v in T.vectorized(EPILOGUE_VEC):
                layer_input[t, h0 + v] = ov[v]
        if i_c == n_chunks:
            if tid < n_out:
                stot = T.alloc_var(T.float32)
                stot = 0.0
                for s in T.unroll(n_splits):  # all split loads in flight at once
                    stot = stot + part_sq[s, t]
                rms = T.rsqrt(stot / rms_numel + rms_eps)
                mtot = T.alloc_var(T.float32)
                mtot = 0.0
                for s in T.unroll(n_splits):  # all split loads in flight at once
                    mtot = mtot + part_mix[s, t, tid]
                mixes[tid] = mtot * rms
            T.sync_threads()
            if tid < hc:
                pre_out[t, tid] = T.sigmoid(mixes[tid] * hc_scale[0] + hc_base[tid]) + hc_pre_eps
                post_out[t, tid] = (
                    T.sigmoid(mixes[hc + tid] * hc_scale[1] + hc_base[hc + tid]) * hc_post_mult_value
                )
            if tid < 32:
                e = tid % 16  # lanes 16..31 mirror 0..15 so every shuffle partner is live
                c = T.alloc_var(T.float32)
                c = mixes[2 * hc + e] * hc_scale[2] + hc_base[2 * hc + e]
                pair_max = T.max(c, T.shfl_xor(c, 1))
                row_max = T.max(pair_max, T.shfl_xor(pair_max, 2))
                c = T.exp(c - row_max)
                pair_sum = c + T.shfl_xor(c, 1)
                row_sum = pair_sum + T.shfl_xor(pair_sum, 2)
                c = c / row_sum + hc_sinkhorn_eps
                cpair = c + T.shfl_xor(c, 4)
                col_sum = cpair + T.shfl_xor(cpair, 8)
                c = c / (col_sum + hc_sinkhorn_eps)
                for _ in T.serial(sinkhorn_repeat - 1):
                    rpair_i = c + T.shfl_xor(c, 1)
                    rsum_i = rpair_i + T.shfl_xor(rpair_i, 2)
                    c = c / (rsum_i + hc_sinkhorn_eps)
                    cpair_i = c + T.shfl_xor(c, 4)
                    csum_i = cpair_i + T.shfl_xor(cpair_i, 8)
                    c = c / (csum_i + hc_sinkhorn_eps)
                if tid < 16:
                    comb_out[t, tid] = c


@tilelang.jit(pass_configs=PASS_CONFIGS)
def mhc_post_kernel(
    comb_mix,
    residual,
    post_mix,
    x,
    out,
    hidden: int,
    n_thr: int,
    vec: int,
):
    """R'[j] = post[j]*x + sum_k comb[k,j]*R[k] over a (tokens, hidden chunks) grid, 16-byte loads."""
    hc = 4
    num_tokens = T.dynamic("num_tokens")
    chunk = n_thr * vec

    comb_mix: T.Tensor((num_tokens, hc, hc), T.float32)  # type: ignore[no-redef, valid-type]
    residual: T.Tensor((num_tokens, hc, hidden), T.bfloat16)  # type: ignore[no-redef, valid-type]
    post_mix: T.Tensor((num_tokens, hc), T.float32)  # type: ignore[no-redef, valid-type]
    x: T.Tensor((num_tokens, hidden), T.bfloat16)  # type: ignore[no-redef, valid-type]
    out: T.Tensor((num_tokens, hc, hidden), T.bfloat16)  # type: ignore[no-redef, valid-type]

    with T.Kernel(num_tokens, hidden // chunk, threads=n_thr) as (t, i_c):
        tid = T.get_thread_binding()
        h0 = i_c * chunk + tid * vec
        rin = T.alloc_local((hc * vec,), T.float32)
        xin = T.alloc_local((vec,), T.float32)
        rb = T.alloc_local((hc * vec,), T.bfloat16)
        pm = T.alloc_local((hc,), T.float32)
        cm = T.alloc_local((hc * hc,), T.float32)
        for j in T.unroll(hc):
            pm[j] = post_mix[t, j]
            for k in T.unroll(hc):
                cm[k * hc + j] = comb_mix[t, k, j]
        for j in T.unroll(hc):
            for v in T.vectorized(vec):
                rin[j * vec + v] = T.cast(residual[t, j, h0 + v], T.float32)
        for v in T.vectorized(vec):
            xin[v] = T.cast(x[t, h0 + v], T.float32)
        for j in T.unroll(hc):
            for v in T.unroll(vec):
                val = T.alloc_var(T.float32)
                val = pm[j] * xin[v]
                for k in T.unroll(hc):
                    val = val + cm[k * hc + j] * rin[k * vec + v]
                rb[j * vec + v] = T.cast(val, T.bfloat16)
        for j in T.unroll(hc):
            for v in T.vectorized(vec):
                out[t, j, h0 + v] = rb[j * vec + v]
