"""The optimized indexer: logits streamed over key chunks into a running top-k, bounded workspace.

Per call, rows go in blocks of R and row-local columns in chunks of C. A Triton kernel scores one
chunk and writes int64 selection keys (select.py: score << 32 | ~column) behind the K = 512 keys kept
so far, `buf[R, K + C]`; one integer top-k keeps the best K. Keys are unique, so the result is
deterministic (ties: lowest column). Layer 20 also keeps its best 2048 block keys the same way
(`bbuf[R, 2048 + C/8]`). Layers 24..36 score only their candidate columns (<= 2048·8 per row).

Workspace (bytes) = R·(K + C)·8 + R·K·16  [+ R·(2048 + C/8)·8 + R·2048·16 for layer 20], with R and
C chosen so it stays under `workspace_bytes` (default 128 MiB) whatever the context length
(docs/INDEXER.md). The gathered K itself (132 B per key, upstream's workspace) is not counted.
This module plans and launches; the kernels are in `stream_kernels.py`.
"""

from __future__ import annotations

import torch
import triton

from deepinfer_sm80.formats.indexer_k import CANDIDATE_BLOCKS, CODE_BYTES, INDEX_DIM, check_k_cache
from deepinfer_sm80.ops.indexer import logits as lg_mod
from deepinfer_sm80.ops.indexer.logits import (
    _as_u8,
    decode_rows,
    decode_tiles,
)
from deepinfer_sm80.ops.indexer.select import INVALID_KEY, keys_to_columns, ordered_int32
from deepinfer_sm80.ops.indexer.stream_kernels import (
    _candidate_keys_kernel,
    _paged_keys_kernel,
    _prefill_keys_kernel,
)
from deepinfer_sm80.registry import CompileSpec, signature

WORKSPACE_BYTES = 128 << 20

# ----------------------------------------------------------------------------- host side
BLOCK_M = 4  # prefill queries per program (a 128-row MMA when they share ks)
BLOCK_N = 64
TILES = 8
SPAN = BLOCK_N * TILES  # columns per program; chunks are multiples of it
CHUNK_MAX = 1 << 16
# How a chunk is merged into the kept top-k: "int64" (the kernel writes selection keys; one integer
# torch.topk per chunk) or "fp32" (the kernel writes scores; an fp32 top-(k+8) pre-selects, exact keys
# decide). H200, 8192 queries at 64K / 256K / 1M keys: int64 56 / 216 / 850 ms, fp32 74 / 276 / 1003 ms
# (docs/INDEXER.md), so int64 is the default; fp32 halves the workspace (68 vs 128 MB).
PREFILL_SELECT = "int64"
NUM_WARPS = 4
PREFILL_WARPS = 8  # 4 warps: 255 registers, one CTA per SM on sm_86
CANDIDATE_WARPS = 4
# per-column page gathers: 64-column tiles held 168 registers and spilled on sm_86, so 32 x 16
CAND_BLOCK_N = 32
CAND_TILES = SPAN // CAND_BLOCK_N
_ORDERED_NEG_INF = -2139095041  # ordered_int32(-inf)


def workspace_per_row(chunk: int, keep: int, keep_blocks: int, block_size: int) -> int:
    """Bytes one row costs: its keys buffer (kept + chunk) and torch.topk's values/indices output."""
    size = (keep + chunk) * 8 + keep * 16
    if keep_blocks:
        size += (keep_blocks + chunk // block_size) * 8 + keep_blocks * 16
    return size


def plan(
    rows: int,
    longest: int,
    keep: int,
    keep_blocks: int,
    block_size: int,
    workspace_bytes: int,
    row_multiple: int = BLOCK_M,
    chunk_max: int = CHUNK_MAX,
    per_row=None,
) -> tuple[int, int]:
    """(row block R, chunk C): C a multiple of SPAN covering `longest` if it can, R as large as fits."""
    chunk = min(triton.cdiv(max(longest, 1), SPAN) * SPAN, chunk_max)
    per_row = (per_row or workspace_per_row)(chunk, keep, keep_blocks, block_size)
    r = max(row_multiple, workspace_bytes // per_row // row_multiple * row_multiple)
    return min(r, triton.cdiv(rows, row_multiple) * row_multiple), chunk


def _merge(buf: torch.Tensor, nr: int, keep: int) -> None:
    buf[:nr, :keep] = torch.topk(buf[:nr], keep, dim=1, sorted=False).values


def _finish(buf: torch.Tensor, nr: int, keep: int) -> torch.Tensor:
    return torch.sort(buf[:nr, :keep], dim=1, descending=True).values


def _blocks_out(keys: torch.Tensor) -> torch.Tensor:
    ids = keys_to_columns(keys)
    return torch.where((keys >> 32) == _ORDERED_NEG_INF, torch.full_like(ids, -1), ids)


def _check_common(q8: torch.Tensor, weights: torch.Tensor, topk_indices: torch.Tensor, rows: int) -> None:
    heads = q8.shape[-2]
    if weights.shape != (rows, heads) or weights.dtype != torch.float32 or weights.stride(1) != 1:
        raise ValueError(
            f"weights must be fp32 [{rows}, {heads}] with unit last stride, got {tuple(weights.shape)}"
        )
    if topk_indices.dtype != torch.int32 or topk_indices.dim() != 2 or topk_indices.shape[0] != rows:
        raise ValueError(
            f"topk_indices must be int32 [{rows}, topk], got {topk_indices.dtype} {tuple(topk_indices.shape)}"
        )


def _check_candidates(cand: torch.Tensor, rows: int, block_size: int) -> None:
    if cand.dtype != torch.int32 or cand.dim() != 2 or cand.shape[0] < rows or cand.stride(1) != 1:
        raise ValueError(
            f"candidate_blocks must be int32 [{rows}, n] with unit last stride, got {tuple(cand.shape)}"
        )
    if SPAN % block_size or BLOCK_N % block_size:
        raise ValueError(f"candidate_block_size {block_size} must divide {BLOCK_N}")


def indexer_topk_prefill(
    q8: torch.Tensor,
    weights: torch.Tensor,
    k8: torch.Tensor,
    kscale: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    topk_indices: torch.Tensor,
    *,
    candidate_blocks: torch.Tensor | None = None,
    candidate_block_size: int = 8,
    candidate_write: bool = False,
    workspace_bytes: int = WORKSPACE_BYTES,
    chunk_max: int = CHUNK_MAX,
    select: str = PREFILL_SELECT,
) -> None:
    """Top-k of one prefill chunk's indexer rows without the dense [M, N] logits (docs/INDEXER.md).

    q8 [M, H, 128]; weights fp32 [M, H]; k8 [N, 128]; kscale fp32 [N] (or [N, 1]); ks/ke int32 [M];
    topk_indices int32 [M, topk] gets row-local columns (relative to ks), best first, -1 padded.
    One host sync (the row lengths) sizes the chunk loop.
    """
    q8, k8 = _as_u8(q8), _as_u8(k8)
    m = q8.shape[0]
    if q8.dim() != 3 or q8.shape[2] != INDEX_DIM or not q8.is_contiguous():
        raise ValueError(f"q8 must be contiguous [M, H, {INDEX_DIM}], got {tuple(q8.shape)}")
    if k8.dim() != 2 or k8.shape[1] != CODE_BYTES or not k8.is_contiguous():
        raise ValueError(f"k8 must be contiguous [N, {CODE_BYTES}], got {tuple(k8.shape)}")
    _check_common(q8, weights, topk_indices, m)
    kscale = kscale.reshape(-1).contiguous()
    keep = topk_indices.shape[1]
    if m == 0:
        return
    lengths = (cu_seqlen_ke.long() - cu_seqlen_ks.long()).clamp_min(0).cpu()
    heads = q8.shape[1]
    dev = q8.device
    if candidate_blocks is not None:
        _check_candidates(candidate_blocks, m, candidate_block_size)
    if candidate_blocks is not None and not candidate_write:
        ncols = candidate_blocks.shape[1] * candidate_block_size
        if ncols % SPAN:
            raise ValueError(
                f"{candidate_blocks.shape[1]} candidate blocks of {candidate_block_size} "
                f"is not a multiple of {SPAN} columns"
            )
        r_blk, _ = plan(m, ncols, keep, 0, candidate_block_size, workspace_bytes, 1, ncols)
        buf = torch.empty((r_blk, keep + ncols), dtype=torch.int64, device=dev)
        for r0 in range(0, m, r_blk):
            nr = min(r_blk, m - r0)
            buf[:nr, :keep].fill_(INVALID_KEY)
            _candidate_keys_kernel[(nr, ncols // SPAN)](
                q8,
                weights,
                weights.stride(0),
                k8,
                kscale,
                0,
                1,
                buf,
                0,
                cu_seqlen_ks,
                (cu_seqlen_ke - cu_seqlen_ks).clamp_min(0).to(torch.int32),
                buf,
                r0,
                candidate_blocks,
                candidate_blocks.stride(0),
                buf,
                buf.stride(0),
                HEADS=heads,
                D=INDEX_DIM,
                NEXT_N=1,
                HAS_REQ=False,
                PAGED=False,
                BLOCK_N=CAND_BLOCK_N,
                TILES=CAND_TILES,
                KEEP=keep,
                BS=candidate_block_size,
                num_warps=CANDIDATE_WARPS,
            )
            _merge(buf, nr, keep)
            topk_indices[r0 : r0 + nr] = keys_to_columns(_finish(buf, nr, keep))
        return
    keep_blocks = candidate_blocks.shape[1] if candidate_blocks is not None else 0
    as_values = select == "fp32"
    if select not in ("int64", "fp32"):
        raise ValueError(f"select must be 'int64' or 'fp32', got {select!r}")
    r_blk, chunk = plan(
        m,
        int(lengths.max()),
        keep,
        keep_blocks,
        candidate_block_size,
        workspace_bytes,
        chunk_max=chunk_max,
        per_row=prefill_row_bytes if as_values else workspace_per_row,
    )
    dt = torch.float32 if as_values else torch.int64
    fbuf = torch.empty((r_blk, keep + chunk), dtype=dt, device=dev)
    keys = torch.empty((r_blk, keep), dtype=torch.int64, device=dev) if as_values else fbuf
    nbc = chunk // candidate_block_size
    bfbuf = torch.empty((r_blk, keep_blocks + nbc) if keep_blocks else (1, 1), dtype=dt, device=dev)
    bkeys = (
        torch.empty((r_blk, keep_blocks) if keep_blocks else (1, 1), dtype=torch.int64, device=dev)
        if as_values
        else bfbuf
    )
    lengths_dev = (cu_seqlen_ke.long() - cu_seqlen_ks.long()).clamp_min(0)
    for r0 in range(0, m, r_blk):
        nr = min(r_blk, m - r0)
        longest = int(lengths[r0 : r0 + nr].max())
        row_len = lengths_dev[r0 : r0 + nr]
        keys[:nr, :keep].fill_(INVALID_KEY)
        if as_values:
            fbuf[:nr, :keep].fill_(float("-inf"))
        if keep_blocks:
            bkeys[:nr, :keep_blocks].fill_(INVALID_KEY)
            if as_values:
                bfbuf[:nr, :keep_blocks].fill_(float("-inf"))
        for c0 in range(0, max(longest, 1), chunk):
            _prefill_keys_kernel[(triton.cdiv(nr, BLOCK_M), chunk // SPAN)](
                q8,
                weights,
                weights.stride(0),
                k8,
                kscale,
                cu_seqlen_ks,
                cu_seqlen_ke,
                r0,
                nr,
                c0,
                fbuf,
                fbuf.stride(0),
                bfbuf,
                bfbuf.stride(0),
                HEADS=heads,
                D=INDEX_DIM,
                BLOCK_M=BLOCK_M,
                BLOCK_N=BLOCK_N,
                TILES=TILES,
                KEEP=keep,
                KEEP_BLOCKS=keep_blocks,
                BS=candidate_block_size,
                WRITE_BLOCKS=keep_blocks > 0,
                AS_VALUES=as_values,
                num_warps=PREFILL_WARPS,
            )
            if as_values:
                _select(fbuf, keys, nr, keep, c0, row_len)
                if keep_blocks:
                    _select(bfbuf, bkeys, nr, keep_blocks, c0 // candidate_block_size, None)
            else:
                _merge(fbuf, nr, keep)
                if keep_blocks:
                    _merge(bfbuf, nr, keep_blocks)
        topk_indices[r0 : r0 + nr] = keys_to_columns(_finish(keys, nr, keep))
        if candidate_blocks is not None:
            candidate_blocks[r0 : r0 + nr] = _blocks_out(_finish(bkeys, nr, keep_blocks))


SLACK = 8  # fp32 pre-selection keeps keep + SLACK; a tie reaching past it sends the row to the exact path


def prefill_row_bytes(chunk: int, keep: int, keep_blocks: int, block_size: int) -> int:
    """Bytes one prefill row costs: fp32 scores (kept + chunk), kept int64 keys, the pre-selection's
    outputs and keys, and up to as much again for the exact fallback of tie rows (done in slices)."""

    def part(k: int, n: int) -> int:
        return (k + n) * 8 + k * 8 + (k + SLACK) * 44 + k * 16

    return part(keep, chunk) + (part(keep_blocks, chunk // block_size) if keep_blocks else 0)


def values_of(keys: torch.Tensor) -> torch.Tensor:
    """fp32 scores of selection keys (-inf for INVALID_KEY); inverse of the ordering in select.py."""
    o = (keys >> 32).to(torch.int32)
    v = (o ^ ((o >> 31) & 0x7FFFFFFF)).view(torch.float32)
    return torch.where(keys == INVALID_KEY, torch.full_like(v, float("-inf")), v)


def _chunk_keys(vals: torch.Tensor, cols: torch.Tensor, row_len: torch.Tensor | None) -> torch.Tensor:
    """int64 keys of chunk scores at row-local columns; invalid where col >= row length (or, without
    lengths, where the score is -inf: blocks)."""
    ordered = ordered_int32(vals).to(torch.int64)
    key = (ordered << 32) | ((2**32 - 1) - cols.to(torch.int64))
    valid = cols < row_len[:, None] if row_len is not None else vals != float("-inf")
    return torch.where(valid, key, torch.full_like(key, INVALID_KEY))


def _select(
    fbuf: torch.Tensor, keys: torch.Tensor, nr: int, keep: int, c0: int, row_len: torch.Tensor | None
) -> None:
    """Merge this chunk's fp32 scores fbuf[:nr, keep:] into the kept keys[:nr] (their scores in
    fbuf[:nr, :keep]). An fp32 top-(keep + SLACK) pre-selects (fast); the exact int64 keys decide among
    the picks. Rows whose score at rank keep equals the one at rank keep + SLACK may have ties beyond
    the picks: they are redone exactly on their whole buffer."""
    width = fbuf.shape[1]
    k2 = min(keep + SLACK, width)
    vals, pos = torch.topk(fbuf[:nr], k2, dim=1, sorted=True)
    chunk_cols = c0 + pos - keep
    picked = torch.where(
        pos < keep,
        torch.gather(keys[:nr], 1, pos.clamp(max=keep - 1)),
        _chunk_keys(vals, chunk_cols, row_len),
    )
    new = torch.topk(picked, keep, dim=1, sorted=False).values
    edge, last = vals[:, keep - 1], vals[:, k2 - 1]
    tie = (edge == last) | (edge.isnan() & last.isnan())
    if k2 == width:
        tie.zero_()  # every column was picked
    bad = tie.nonzero().flatten()  # host sync: prefill only
    step = max(1, nr // 8)  # ~20 B per column of a fallback row: a slice stays under prefill_row_bytes
    for b0 in range(0, bad.numel(), step):
        rows = bad[b0 : b0 + step]
        cols = torch.arange(width - keep, device=fbuf.device) + c0
        chunk = _chunk_keys(
            fbuf[rows, keep:],
            cols[None, :].expand(rows.numel(), -1),
            None if row_len is None else row_len[rows],
        )
        full = torch.cat([keys[rows], chunk], dim=1)
        new[rows] = torch.topk(full, keep, dim=1, sorted=False).values
    keys[:nr] = new
    fbuf[:nr, :keep] = values_of(new)


def indexer_topk_decode(
    q8: torch.Tensor,
    weights: torch.Tensor,
    kv_cache: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    max_model_len: int,
    topk_indices: torch.Tensor,
    *,
    candidate_blocks: torch.Tensor | None = None,
    candidate_block_size: int = 8,
    candidate_write: bool = False,
    indices: torch.Tensor | None = None,
    workspace_bytes: int = WORKSPACE_BYTES,
) -> None:
    """Top-k of the decode rows, paged, without the dense [rows, max_model_len] logits.

    q8 [B, next_n, H, 128]; weights fp32 [B·next_n, H]; kv_cache uint8 [blocks, bs, (1,) 132];
    context_lens int32 [B] or [B, next_n]; topk_indices int32 [B·next_n, topk] gets request-local
    columns, best first, -1 padded. No host sync: the chunk loop depends on max_model_len only, so
    the call can be captured in a CUDA graph.
    """
    q8, lens, req, next_n = decode_rows(q8, context_lens, indices)
    rows, heads, _ = q8.shape
    _check_common(q8, weights, topk_indices, rows)
    block_size = check_k_cache(kv_cache)
    if block_size % BLOCK_N:
        raise ValueError(f"block_size {block_size} must be a multiple of {BLOCK_N}")
    keep = topk_indices.shape[1]
    if rows == 0:
        return
    dev = q8.device
    req_arg = req if req is not None else lens
    if candidate_blocks is not None:
        _check_candidates(candidate_blocks, rows, candidate_block_size)
    if candidate_blocks is not None and not candidate_write:
        ncols = candidate_blocks.shape[1] * candidate_block_size
        if ncols % SPAN:
            raise ValueError(f"{ncols} candidate columns is not a multiple of {SPAN}")
        buf = torch.empty((rows, keep + ncols), dtype=torch.int64, device=dev)
        buf[:, :keep].fill_(INVALID_KEY)
        _candidate_keys_kernel[(rows, ncols // SPAN)](
            q8,
            weights,
            weights.stride(0),
            kv_cache,
            lens,
            kv_cache.stride(0),
            block_size,
            block_tables,
            block_tables.stride(0),
            lens,
            lens,
            req_arg,
            0,
            candidate_blocks,
            candidate_blocks.stride(0),
            buf,
            buf.stride(0),
            HEADS=heads,
            D=INDEX_DIM,
            NEXT_N=next_n,
            HAS_REQ=req is not None,
            PAGED=True,
            BLOCK_N=CAND_BLOCK_N,
            TILES=CAND_TILES,
            KEEP=keep,
            BS=candidate_block_size,
            num_warps=CANDIDATE_WARPS,
        )
        _merge(buf, rows, keep)
        topk_indices.copy_(keys_to_columns(_finish(buf, rows, keep)))
        return
    keep_blocks = candidate_blocks.shape[1] if candidate_blocks is not None else 0
    per_col = 8 + (8 // candidate_block_size if keep_blocks else 0)
    fixed = keep * 24 + (keep_blocks * 24 if keep_blocks else 0)
    chunk = (workspace_bytes // rows - fixed) // per_col // SPAN * SPAN
    chunk = max(SPAN, min(chunk, triton.cdiv(max_model_len, SPAN) * SPAN))
    buf = torch.empty((rows, keep + chunk), dtype=torch.int64, device=dev)
    bbuf = torch.empty(
        (rows, keep_blocks + chunk // candidate_block_size) if keep_blocks else (1, 1),
        dtype=torch.int64,
        device=dev,
    )
    buf[:, :keep].fill_(INVALID_KEY)
    if keep_blocks:
        bbuf[:, :keep_blocks].fill_(INVALID_KEY)
    tiles = decode_tiles(rows, chunk, q8.device)
    for c0 in range(0, max(max_model_len, 1), chunk):
        _paged_keys_kernel[(rows, chunk // (BLOCK_N * tiles))](
            q8,
            weights,
            weights.stride(0),
            kv_cache,
            kv_cache.stride(0),
            block_size,
            block_tables,
            block_tables.stride(0),
            lens,
            req_arg,
            c0,
            buf,
            buf.stride(0),
            bbuf,
            bbuf.stride(0),
            HEADS=heads,
            D=INDEX_DIM,
            NEXT_N=next_n,
            HAS_REQ=req is not None,
            BLOCK_N=BLOCK_N,
            TILES=tiles,
            KEEP=keep,
            KEEP_BLOCKS=keep_blocks,
            BS=candidate_block_size,
            WRITE_BLOCKS=keep_blocks > 0,
            WORDS=lg_mod.PAGED_WORD_DECODE,
            num_warps=NUM_WARPS,
        )
        _merge(buf, rows, keep)
        if keep_blocks:
            _merge(bbuf, rows, keep_blocks)
    topk_indices.copy_(keys_to_columns(_finish(buf, rows, keep)))
    if candidate_blocks is not None:
        candidate_blocks[:rows] = _blocks_out(_finish(bbuf, rows, keep_blocks))


def decode_workspace_bytes(
    rows: int,
    max_model_len: int,
    keep: int,
    keep_blocks: int = 0,
    block_size: int = 8,
    workspace_bytes: int = WORKSPACE_BYTES,
) -> int:
    """The bound the decode path stays under (the formula in the module docstring)."""
    per_col = 8 + (8 // block_size if keep_blocks else 0)
    fixed = keep * 24 + keep_blocks * 24
    chunk = (workspace_bytes // rows - fixed) // per_col // SPAN * SPAN
    chunk = max(SPAN, min(chunk, triton.cdiv(max_model_len, SPAN) * SPAN))
    return rows * workspace_per_row(chunk, keep, keep_blocks, block_size)


_KEYS_COMMON = {
    "HEADS": 32,
    "D": INDEX_DIM,
    "BLOCK_N": BLOCK_N,
    "TILES": TILES,
    "KEEP": 512,
    "BS": 8,
}
# fp8 codes (u8) and fp32 weights / scales; row bounds, block tables, lengths and candidates int32;
# the kept top-k as packed int64 keys, or fp32 scores with AS_VALUES (`.f32` specs)
_KEYS = {"keys_ptr": "i64", "blk_ptr": "i64"}
_SCORES = {"keys_ptr": "fp32", "blk_ptr": "fp32"}
_QW = {"q_ptr": "u8", "w_ptr": "fp32"}
_ROWS = {"bt_ptr": "i32", "len_ptr": "i32", "req_ptr": "i32"}


def _prefill_sig(keys: dict[str, str]) -> dict[str, str]:
    pointers = {**_QW, "k_ptr": "u8", "kscale_ptr": "fp32", "cu_ks_ptr": "i32", "cu_ke_ptr": "i32", **keys}
    return signature(_prefill_keys_kernel, pointers)


_PAGED_SIG = signature(_paged_keys_kernel, {**_QW, "cache_ptr": "u8", **_ROWS, **_KEYS})
_CAND_SIG = signature(
    _candidate_keys_kernel,
    {
        **_QW,
        "k_ptr": "u8",
        "kscale_ptr": "fp32",
        **_ROWS,
        "start_ptr": "i32",
        "cand_ptr": "i32",
        "keys_ptr": "i64",
    },
)
_ALIGNED = ("q_ptr", "w_ptr", "keys_ptr", "keys_stride")
COMPILE_SPECS = (
    *(
        CompileSpec(
            f"indexer.stream.prefill{'.blocks' if kb else ''}{'.f32' if av else ''}",
            _prefill_keys_kernel,
            _prefill_sig(_SCORES if av else _KEYS),
            {**_KEYS_COMMON, "BLOCK_M": BLOCK_M, "KEEP_BLOCKS": kb, "WRITE_BLOCKS": kb > 0, "AS_VALUES": av},
            num_warps=PREFILL_WARPS,
            divisible_by_16=(*_ALIGNED, "k_ptr", "kscale_ptr"),
        )
        for kb in (0, CANDIDATE_BLOCKS)
        for av in (False, True)
    ),
    *(
        CompileSpec(
            f"indexer.stream.paged{'.blocks' if kb else ''}",
            _paged_keys_kernel,
            _PAGED_SIG,
            {
                **_KEYS_COMMON,
                "NEXT_N": 1,
                "HAS_REQ": False,
                "KEEP_BLOCKS": kb,
                "WRITE_BLOCKS": kb > 0,
                "WORDS": False,
            },
            num_warps=NUM_WARPS,
            divisible_by_16=(*_ALIGNED, "cache_ptr", "page_stride", "block_size"),
        )
        for kb in (0, CANDIDATE_BLOCKS)
    ),
    *(
        CompileSpec(
            f"indexer.stream.candidates.{'paged' if paged else 'prefill'}",
            _candidate_keys_kernel,
            _CAND_SIG,
            {
                **_KEYS_COMMON,
                "BLOCK_N": CAND_BLOCK_N,
                "TILES": CAND_TILES,
                "NEXT_N": 1,
                "HAS_REQ": False,
                "PAGED": paged,
            },
            num_warps=CANDIDATE_WARPS,
            divisible_by_16=(*_ALIGNED, "k_ptr"),
        )
        for paged in (False, True)
    ),
)
