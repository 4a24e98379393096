"""`combine_topk_swa_indices` for V4.1 sparse prefill (docs/OPERATORS.md): op-chain reference, one kernel.

SM80 baseline: upstream's own `CombineTopkSwaIndicesKernel.kernel` (plain int32 Triton, no fp8) cross-compiles
for sm_80/sm_86 unchanged (28/38 regs, 0 spills, 0 smem), so patch 00 leaves it alone and `base` has no copy.
Optimized: one single-warp program per token, one memory round trip, every output column stored once.
"""

import torch
import triton
import triton.language as tl

from deepinfer_sm80.registry import CompileSpec, signature

# FlashMLA sparse prefill needs topk % 128 == 0; the width is fixed per model (640 for top-k 512, 128 for 0)
TOPK_ALIGNMENT = 128


def combined_width(topk: int, window_size: int) -> int:
    """Output columns: round_up(topk + window_size, 128)."""
    return -(-(topk + window_size) // TOPK_ALIGNMENT) * TOPK_ALIGNMENT


# ----------------------------------------------------------------------------- reference
def combine_topk_swa_indices_ref(
    topk_indices: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    gather_lens: torch.Tensor,
    window_size: int,
    compress_ratio: int,
    topk: int,
    M: int,
    N: int,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch op chain (int64 math, int32 result with the kernels' wrap-around), no host syncs.

    Every output column is defined: `[0, topk_len)` top-k, `[topk_len, lens)` window, the rest -1.
    Rows of tokens outside every request get lens 0 and -1. With `out=` the result is copied in.
    """
    T, W = topk_indices.shape[0], combined_width(topk, window_size)
    dev = topk_indices.device
    R = seq_lens.shape[0]
    qsl = query_start_loc.long() - query_start_loc[:1].long()  # [R+1] chunk-local starts
    t = torch.arange(T, device=dev)  # [T]
    b = torch.searchsorted(qsl[1:].contiguous(), t, right=True)  # [T] request of each token; R = none
    in_req = b < R
    bc = b.clamp(max=max(R - 1, 0))
    pad = torch.zeros(1, dtype=torch.long, device=dev)  # gives R == 0 one dummy request to index
    q_start, q_end = torch.cat([qsl[:-1], pad])[bc], torch.cat([qsl[1:], pad])[bc]  # [T]
    seq = torch.cat([seq_lens.long(), pad])[bc]  # [T]
    g0 = seq - torch.cat([gather_lens.long(), pad])[bc]  # [T] first gathered SWA position
    pos = seq - (q_end - q_start) + (t - q_start)  # [T]
    if compress_ratio > 0:
        topk_len = torch.div(pos + 1, compress_ratio, rounding_mode="trunc").clamp(0, topk)  # [T]
    else:
        topk_len = torch.zeros_like(pos)  # ratio 0: no division (docs/FP8_DS_MLA.md)
    swa_start = torch.maximum((pos - (window_size - 1)).clamp(min=0), g0)  # [T]
    swa_len = (pos - swa_start + 1).clamp(min=0)  # [T]
    topk_len, swa_len = topk_len.where(in_req, 0), swa_len.where(in_req, 0)
    lens = topk_len + swa_len  # [T]

    col = torch.arange(W, device=dev)  # [W]
    row_base = M * b  # [T] workspace row of the request's first compressed entry
    swa = (row_base + N + swa_start - g0 - topk_len)[:, None] + col  # [T, W]
    rows = swa.where(col < lens[:, None], -1)  # [T, W]
    if topk > 0:
        tk = topk_indices[:, :topk].long()  # [T, topk]
        tk = (tk + row_base[:, None]).where((tk >= 0) & (tk < N), -1)
        rows[:, :topk] = tk.where(col[:topk] < topk_len[:, None], rows[:, :topk])
    rows, lens = rows.to(torch.int32), lens.to(torch.int32)  # two's-complement wrap, as int32 kernels
    if out is None:
        return rows, lens
    out[0].copy_(rows)
    out[1].copy_(lens)
    return out


# ----------------------------------------------------------------------------- kernel
@triton.jit
def _combine_topk_swa_kernel(
    out_ptr,
    out_stride,
    lens_ptr,
    topk_ptr,
    topk_stride,
    qsl_ptr,
    seq_lens_ptr,
    gather_lens_ptr,
    num_tokens,
    num_reqs,
    M,
    N,
    TOP_K: tl.constexpr,
    COMPRESS_RATIO: tl.constexpr,
    WINDOW_SIZE: tl.constexpr,
    WIDTH: tl.constexpr,
    TOPK_BLOCK: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    # One memory round trip per token: the top-k row and the request metadata are loaded at
    # once (neither depends on the other), then every column is computed and stored once.
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # chunk-local tokens
    t_ok = t < num_tokens
    t64 = t.to(tl.int64)
    if TOPK_BLOCK > 0:
        # the whole row (T·topk·4 B, what the floor counts), so the load need not wait for topk_len
        ck = tl.arange(0, TOPK_BLOCK)[None, :]
        tk = tl.load(topk_ptr + t64[:, None] * topk_stride + ck, mask=t_ok[:, None] & (ck < TOP_K), other=-1)
    base = tl.load(qsl_ptr)
    # the token's request r is the one with start_r <= t < end_r; its fields are selected by
    # masked sums, so no load waits for r (empty requests never match)
    b = tl.zeros([BLOCK_T], dtype=tl.int32)
    q_start = tl.zeros([BLOCK_T], dtype=tl.int32)
    q_len = tl.zeros([BLOCK_T], dtype=tl.int32)
    seq_len = tl.zeros([BLOCK_T], dtype=tl.int32)
    gather_len = tl.zeros([BLOCK_T], dtype=tl.int32)
    hits = tl.zeros([BLOCK_T], dtype=tl.int32)
    for r0 in range(0, num_reqs, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        r_ok = r < num_reqs
        start = (tl.load(qsl_ptr + r, mask=r_ok, other=0) - base).to(tl.int32)
        end = (tl.load(qsl_ptr + r + 1, mask=r_ok, other=0) - base).to(tl.int32)
        s = tl.load(seq_lens_ptr + r, mask=r_ok, other=0).to(tl.int32)
        g = tl.load(gather_lens_ptr + r, mask=r_ok, other=0).to(tl.int32)
        hit = r_ok[None, :] & (start[None, :] <= t[:, None]) & (t[:, None] < end[None, :])
        b += tl.sum(tl.where(hit, r[None, :], 0), axis=1)
        q_start += tl.sum(tl.where(hit, start[None, :], 0), axis=1)
        q_len += tl.sum(tl.where(hit, (end - start)[None, :], 0), axis=1)
        seq_len += tl.sum(tl.where(hit, s[None, :], 0), axis=1)
        gather_len += tl.sum(tl.where(hit, g[None, :], 0), axis=1)
        hits += tl.sum(hit.to(tl.int32), axis=1)
    in_req = t_ok & (hits > 0)
    pos = seq_len - q_len + (t - q_start)
    gather_start = seq_len - gather_len
    if COMPRESS_RATIO > 0:
        topk_len = tl.maximum(tl.minimum((pos + 1) // COMPRESS_RATIO, TOP_K), 0)
    else:
        topk_len = tl.zeros([BLOCK_T], dtype=tl.int32)  # constexpr ratio 0: never divide
    swa_start = tl.maximum(tl.maximum(pos - (WINDOW_SIZE - 1), 0), gather_start)
    swa_len = tl.maximum(pos - swa_start + 1, 0)
    topk_len = tl.where(in_req, topk_len, 0)
    lens = topk_len + tl.where(in_req, swa_len, 0)
    tl.store(lens_ptr + t, lens, mask=t_ok)

    row_base = M * b
    swa_first = row_base + N + swa_start - gather_start - topk_len  # window value at column c: swa_first + c
    out_row = out_ptr + t64[:, None] * out_stride
    # three disjoint intervals, each column stored exactly once: [0, topk_len) top-k,
    # [topk_len, lens) window, [lens, WIDTH) -1
    if TOPK_BLOCK > 0:
        c = tl.arange(0, TOPK_BLOCK)[None, :]
        tk = tl.where((tk >= 0) & (tk < N), tk + row_base[:, None], -1)
        val = tl.where(c < lens[:, None], swa_first[:, None] + c, -1)
        val = tl.where(c < topk_len[:, None], tk, val)
        tl.store(out_row + c, val, mask=t_ok[:, None] & (c < WIDTH))
    for c0 in tl.static_range(TOPK_BLOCK, WIDTH, BLOCK_C):  # past TOPK_BLOCK >= TOP_K: no top-k column
        c = c0 + tl.arange(0, BLOCK_C)[None, :]
        val = tl.where(c < lens[:, None], swa_first[:, None] + c, -1)
        tl.store(out_row + c, val, mask=t_ok[:, None] & (c < WIDTH))


# One token per program on one warp: 16 int32 of the top-k row per thread, loaded in 16 B vectors.
# H200 sweep (kernel alone, T=512/1536/4096): 1x1 2.7/4.0/6.7 us, 2 tokens x 1 warp 3.0/4.1/6.8,
# 4 tokens x 4 warps 3.5/4.8/8.0. SM80/86 cap 1-warp CTAs at 32/16 per SM (unmeasured there).
BLOCK_T = 1
NUM_WARPS = 1
_BLOCK_C = 128
_BLOCK_R = 64  # requests scanned per step (a prefill chunk rarely holds more)


def topk_block(topk: int) -> int:
    """Columns of the top-k row tile: next power of two >= topk (0 for SWA-only layers)."""
    return triton.next_power_of_2(topk) if topk > 0 else 0


def _check_int(name: str, x: torch.Tensor) -> None:
    if x.dtype not in (torch.int32, torch.int64) or x.dim() != 1 or x.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous 1-D int32/int64, got {x.dtype} {tuple(x.shape)}")


def combine_topk_swa_indices(
    topk_indices: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    gather_lens: torch.Tensor,
    window_size: int,
    compress_ratio: int,
    topk: int,
    M: int,
    N: int,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge top-k compressed and sliding-window workspace rows per query token (docs/OPERATORS.md).

    Args:
        topk_indices: [T, >= topk] int32, request-local compressed positions, -1 padded; row stride free.
        query_start_loc: [R+1] int32/int64, rebased on element 0.
        seq_lens, gather_lens: [R] int32/int64.
        out: optional ([T, round_up(topk+window, 128)] int32 with unit column stride, [T] int32).

    Returns (indices, lens). Unlike upstream, every column past lens is written -1 with `out=` as
    well, and tokens outside every request get lens 0; rows are otherwise bitwise upstream's.
    """
    if topk_indices.dtype != torch.int32 or topk_indices.dim() != 2 or topk_indices.stride(-1) != 1:
        raise ValueError(f"topk_indices must be [T, K] int32, unit column stride; got {topk_indices.dtype}")
    if compress_ratio not in (0, 1, 2) or topk < 0:
        raise ValueError(f"compress_ratio must be 0, 1 or 2 and topk >= 0, got {compress_ratio}, {topk}")
    if topk_indices.shape[1] < topk:
        raise ValueError(f"topk_indices has {topk_indices.shape[1]} columns, fewer than topk={topk}")
    _check_int("query_start_loc", query_start_loc)
    _check_int("seq_lens", seq_lens)
    _check_int("gather_lens", gather_lens)
    if query_start_loc.shape[0] != seq_lens.shape[0] + 1 or gather_lens.shape != seq_lens.shape:
        raise ValueError("query_start_loc must be [R+1] and gather_lens [R] for seq_lens [R]")
    T, W = topk_indices.shape[0], combined_width(topk, window_size)
    if out is None:
        indices = torch.empty((T, W), dtype=torch.int32, device=topk_indices.device)
        lens = torch.empty(T, dtype=torch.int32, device=topk_indices.device)
    else:
        indices, lens = out
        if indices.shape != (T, W) or indices.dtype != torch.int32 or indices.stride(-1) != 1:
            raise ValueError(f"out[0] must be [{T}, {W}] int32 with unit column stride")
        if lens.shape != (T,) or lens.dtype != torch.int32 or lens.stride(0) != 1:
            raise ValueError(f"out[1] must be contiguous [{T}] int32")
    launch(
        indices, lens, topk_indices, query_start_loc, seq_lens, gather_lens,
        window_size, compress_ratio, topk, M, N,
    )  # fmt: skip
    return indices, lens


def launch(
    indices: torch.Tensor,
    lens: torch.Tensor,
    topk_indices: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    gather_lens: torch.Tensor,
    window_size: int,
    compress_ratio: int,
    topk: int,
    M: int,
    N: int,
    *,
    block_t: int = BLOCK_T,
    num_warps: int = NUM_WARPS,
) -> None:
    """The kernel launch alone on checked tensors (benchmarks sweep `block_t` / `num_warps` here)."""
    T = topk_indices.shape[0]
    if T:
        _combine_topk_swa_kernel[(triton.cdiv(T, block_t),)](
            indices, indices.stride(0), lens, topk_indices, topk_indices.stride(0),
            query_start_loc, seq_lens, gather_lens, T, seq_lens.shape[0], M, N,
            TOP_K=topk, COMPRESS_RATIO=compress_ratio, WINDOW_SIZE=window_size, WIDTH=indices.shape[1],
            TOPK_BLOCK=topk_block(topk), BLOCK_T=block_t, BLOCK_C=_BLOCK_C, BLOCK_R=_BLOCK_R,
            num_warps=num_warps,
        )  # fmt: skip


_SIG = signature(_combine_topk_swa_kernel, "i32")  # every index buffer is int32


# 16 B-aligned in production (workspace rows of 640 / 512 int32); the metadata slices may not be
_ALIGNED = ("out_ptr", "out_stride", "lens_ptr", "topk_ptr", "topk_stride")


def _spec(ratio: int, topk: int) -> CompileSpec:
    constexprs = {
        "TOP_K": topk, "COMPRESS_RATIO": ratio, "WINDOW_SIZE": 128, "WIDTH": combined_width(topk, 128),
        "TOPK_BLOCK": topk_block(topk), "BLOCK_T": BLOCK_T, "BLOCK_C": _BLOCK_C, "BLOCK_R": _BLOCK_R,
    }  # fmt: skip
    return CompileSpec(
        f"topk_swa_combine.r{ratio}", _combine_topk_swa_kernel, _SIG, constexprs, NUM_WARPS,
        divisible_by_16=_ALIGNED,
    )  # fmt: skip


COMPILE_SPECS = (_spec(0, 0), _spec(1, 512), _spec(2, 512))
