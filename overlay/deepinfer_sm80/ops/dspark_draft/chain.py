"""All K DSpark draft positions in one launch (docs/DSPARK.md, "`draft_chain`").

A persistent grid (at most one program per SM, so all are resident) owns fixed 1,024-wide vocabulary
blocks; per position each program computes its blocks' Markov bias in-kernel (tl.dot, one bf16
rounding), adds the base logits, reduces each block per row and waits on one grid barrier, after which
every program picks the previous tokens itself from the published partials (counters reset in-launch).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from deepinfer_sm80.device import sm_count
from deepinfer_sm80.ops.dspark_draft.kernel import NUM_WARPS, block_best, round_to_bf16
from deepinfer_sm80.ops.dspark_draft.reference import SAMPLE_BLOCK
from deepinfer_sm80.registry import CompileSpec, signature

# tl.dot needs M >= 16: requests go through the Markov GEMM 16 at a time. 64 columns per dot is the
# tile whose bf16 bias matched cuBLAS bit for bit on the H200 (0 of 2.07M values, B = 1..16).
ROW_TILE = 16
COL_TILE = 64
# about a second of polling (an atomic round trip is ~0.5 us): only a grid that is not all resident
# gets there, and then scratch.sync[2] is set instead of the GPU hanging
MAX_SPINS = tl.constexpr(1 << 21)


@triton.jit
def _pick_tokens(
    part_val_ptr, part_idx_ptr, row_off, r_ok, NUM_BLOCKS: tl.constexpr, PART_BLOCK: tl.constexpr
):
    """Per row: the block holding the first NaN, else the first maximal block; its token id."""
    k = tl.arange(0, PART_BLOCK)
    ok = r_ok[:, None] & (k[None, :] < NUM_BLOCKS)
    vals = tl.load(
        part_val_ptr + row_off[:, None] + k[None, :], mask=ok, other=float("-inf"), cache_modifier=".cg"
    )
    is_nan = (vals != vals) & ok
    first_nan = tl.min(tl.where(is_nan, k[None, :], PART_BLOCK), axis=1)
    _, first_top = tl.max(tl.where(is_nan, float("-inf"), vals), axis=1, return_indices=True)
    pick = tl.where(first_nan < PART_BLOCK, first_nan, first_top)
    return tl.load(part_idx_ptr + row_off + pick, mask=r_ok, other=0, cache_modifier=".cg").to(tl.int64)


@triton.jit
def _prev_tokens(
    ids_ptr,
    anchor_idx_ptr,
    part_val_ptr,
    part_idx_ptr,
    step,
    rows_cap,
    r,
    r_ok,
    NUM_BLOCKS: tl.constexpr,
    PART_BLOCK: tl.constexpr,
):
    if step == 0:
        anchor = tl.load(anchor_idx_ptr + r, mask=r_ok, other=0)
        prev = tl.load(ids_ptr + anchor, mask=r_ok, other=0).to(tl.int64)
    else:
        row_off = ((step - 1) * rows_cap + r.to(tl.int64)) * NUM_BLOCKS
        prev = _pick_tokens(part_val_ptr, part_idx_ptr, row_off, r_ok, NUM_BLOCKS, PART_BLOCK)
    return prev


@triton.jit
def _draft_chain_kernel(
    base_ptr,
    base_stride_row,
    base_stride_step,
    w1_ptr,
    w2_ptr,
    ids_ptr,
    anchor_idx_ptr,
    ws_ptr,
    part_val_ptr,
    part_idx_ptr,
    rows_cap,
    sync_ptr,
    tok_ptr,
    tok_stride_row,
    tok_stride_step,
    idx_map_ptr,
    idx_stride_row,
    idx_stride_step,
    temp_ptr,
    seed_ptr,
    pos_ptr,
    pos_stride_row,
    pos_stride_step,
    pos_offset,
    cache_ptr,
    cache_stride_req,
    cache_stride_col,
    num_rows,
    vocab,
    NUM_STEPS: tl.constexpr,
    RANK: tl.constexpr,
    BLOCK: tl.constexpr,
    NUM_BLOCKS: tl.constexpr,
    PART_BLOCK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    GUMBEL: tl.constexpr,
    WRITE_CACHE: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    p = tl.program_id(0)
    programs = tl.num_programs(0)
    kk = tl.arange(0, RANK)
    rows = tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_V)
    lane = tl.arange(0, BLOCK)
    for step in range(NUM_STEPS):
        # 1. Markov bias + base logits of the owned blocks, every row, into the workspace
        for j in range(p, NUM_BLOCKS, programs):
            for r0 in range(0, num_rows, BLOCK_R):
                r = r0 + rows
                r_ok = r < num_rows
                prev = _prev_tokens(
                    ids_ptr,
                    anchor_idx_ptr,
                    part_val_ptr,
                    part_idx_ptr,
                    step,
                    rows_cap,
                    r,
                    r_ok,
                    NUM_BLOCKS,
                    PART_BLOCK,
                )
                if p == 0 and step > 0 and j == p:
                    tl.store(tok_ptr + r * tok_stride_row + (step - 1) * tok_stride_step, prev, mask=r_ok)
                embed = tl.load(w1_ptr + prev[:, None] * RANK + kk[None, :], mask=r_ok[:, None], other=0.0)
                for c in range(0, BLOCK, BLOCK_V):
                    v = j * BLOCK + c + cols
                    v_ok = v < vocab
                    w = tl.load(
                        w2_ptr + v[:, None].to(tl.int64) * RANK + kk[None, :], mask=v_ok[:, None], other=0.0
                    )
                    if INTERPRETED:  # the interpreter's dot reads bf16 operands as their raw uint16 bits
                        acc = tl.dot(embed.to(tl.float32), tl.trans(w.to(tl.float32)))
                    else:
                        acc = tl.dot(embed, tl.trans(w))
                    _, bias = round_to_bf16(acc)  # [BLOCK_R, BLOCK_V], cuBLAS's bf16 on the H200
                    ok = r_ok[:, None] & v_ok[None, :]
                    x = tl.load(
                        base_ptr + r[:, None] * base_stride_row + step * base_stride_step + v[None, :],
                        mask=ok,
                        other=0.0,
                    )
                    logits, _ = round_to_bf16(x.to(tl.float32) + bias)
                    tl.store(ws_ptr + r[:, None].to(tl.int64) * vocab + v[None, :], logits, mask=ok)
        tl.debug_barrier()  # the block reductions below read what other threads just wrote
        # 2. per row and owned block: cache write, noise, block maximum -> partials of this step
        for j in range(p, NUM_BLOCKS, programs):
            offs = j * BLOCK + lane
            mask = offs < vocab
            for b in range(0, num_rows):
                logits = tl.load(ws_ptr + b * vocab + offs, mask=mask, other=0.0)
                v = tl.where(mask, logits.to(tl.float32), float("-inf"))
                temp = 0.0
                seed = 0
                pos = 0
                if GUMBEL:
                    req = tl.load(idx_map_ptr + b * idx_stride_row + step * idx_stride_step).to(tl.int64)
                    valid = req >= 0
                    if WRITE_CACHE:
                        dst = cache_ptr + req * cache_stride_req + step * cache_stride_col + offs
                        tl.store(dst, logits, mask=mask & valid)
                    temp = tl.load(temp_ptr + req, mask=valid, other=0.0).to(tl.float32)
                    seed = tl.load(seed_ptr + req, mask=valid, other=0)
                    pos = (
                        tl.load(pos_ptr + b * pos_stride_row + step * pos_stride_step).to(tl.int64)
                        + pos_offset
                    )
                val, idx = block_best(v, offs, mask, lane, temp, seed, pos, GUMBEL, BLOCK)
                slot = (step * rows_cap + b) * NUM_BLOCKS + j
                tl.store(part_val_ptr + slot, val)
                tl.store(part_idx_ptr + slot, j * BLOCK + idx)
        # 3. grid barrier: every block's partial of this step is published before anyone picks
        tl.debug_barrier()
        target = programs * (step + 1)
        seen = tl.atomic_add(sync_ptr, 1, sem="acq_rel") + 1
        spins = 0
        while (seen < target) & (spins < MAX_SPINS):
            seen = tl.atomic_add(sync_ptr, 0, sem="acq_rel")
            spins += 1
        if seen < target:  # a program never arrived (not resident): flag it rather than hang the GPU
            tl.atomic_xchg(sync_ptr + 2, 1, sem="relaxed")
        tl.debug_barrier()
    if p == 0:
        for r0 in range(0, num_rows, BLOCK_R):
            r = r0 + rows
            r_ok = r < num_rows
            last = _prev_tokens(
                ids_ptr,
                anchor_idx_ptr,
                part_val_ptr,
                part_idx_ptr,
                NUM_STEPS,
                rows_cap,
                r,
                r_ok,
                NUM_BLOCKS,
                PART_BLOCK,
            )
            tl.store(tok_ptr + r * tok_stride_row + (NUM_STEPS - 1) * tok_stride_step, last, mask=r_ok)
    # everyone is past the last barrier once it counts itself out: the last one out resets both counters
    if tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel") == programs - 1:
        tl.atomic_xchg(sync_ptr, 0, sem="acq_rel")
        tl.atomic_xchg(sync_ptr + 1, 0, sem="acq_rel")


@triton.jit
def _markov_bias_kernel(
    e_ptr,
    w_ptr,
    out_ptr,
    num_rows,
    vocab,
    RANK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    # the chain kernel's bias tile on its own: [16, 256] x [256, 64] in one dot, one bf16 rounding
    v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    kk = tl.arange(0, RANK)
    for r0 in range(0, num_rows, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        e = tl.load(e_ptr + r[:, None] * RANK + kk[None, :], mask=r[:, None] < num_rows, other=0.0)
        w = tl.load(w_ptr + v[:, None].to(tl.int64) * RANK + kk[None, :], mask=v[:, None] < vocab, other=0.0)
        if INTERPRETED:
            acc = tl.dot(e.to(tl.float32), tl.trans(w.to(tl.float32)))
        else:
            acc = tl.dot(e, tl.trans(w))
        bias, _ = round_to_bf16(acc)
        ok = (r[:, None] < num_rows) & (v[None, :] < vocab)
        tl.store(out_ptr + r[:, None].to(tl.int64) * vocab + v[None, :], bias, mask=ok)


def markov_bias(embed: torch.Tensor, markov_w2: torch.Tensor) -> torch.Tensor:
    """[B, R] x [V, R]^T -> [B, V] bf16 with exactly the chain kernel's in-kernel tile (for calibration)."""
    B, R = embed.shape
    V = markov_w2.shape[0]
    _need(
        embed.dtype == markov_w2.dtype == torch.bfloat16
        and embed.is_contiguous()
        and markov_w2.is_contiguous()
        and markov_w2.shape[1] == R,
        "markov_bias takes contiguous bf16 [B, R] and [V, R]",
    )
    out = torch.empty(B, V, dtype=torch.bfloat16, device=embed.device)
    _markov_bias_kernel[(triton.cdiv(V, COL_TILE),)](
        embed,
        markov_w2,
        out,
        B,
        V,
        RANK=R,
        BLOCK_R=ROW_TILE,
        BLOCK_V=COL_TILE,
        INTERPRETED=os.environ.get("TRITON_INTERPRET") == "1",
        num_warps=NUM_WARPS,
    )
    return out


# ----------------------------------------------------------------------------- launcher
@dataclass(frozen=True)
class ChainScratch:
    """Workspace logits, per-position partial maxima and the barrier counters (zero between launches)."""

    logits: torch.Tensor  # [rows, V] bf16
    part_val: torch.Tensor  # [K, rows, blocks] fp32
    part_idx: torch.Tensor  # [K, rows, blocks] int32
    sync: torch.Tensor  # [3] int32: barrier arrivals, exits, "a barrier timed out" flag (stays set)

    @classmethod
    def allocate(cls, rows: int, steps: int, vocab: int, device: torch.device | str) -> ChainScratch:
        blocks = triton.cdiv(vocab, SAMPLE_BLOCK)
        return cls(
            torch.empty(rows, vocab, dtype=torch.bfloat16, device=device),
            torch.empty(steps, rows, blocks, dtype=torch.float32, device=device),
            torch.empty(steps, rows, blocks, dtype=torch.int32, device=device),
            torch.zeros(3, dtype=torch.int32, device=device),
        )


def resident_programs(device: torch.device, blocks: int) -> int:
    """One program per SM at most (all resident, so the spin barrier cannot wait on an unscheduled
    program); under the interpreter programs run one after another, so exactly one."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return 1
    return max(
        1, min(blocks, sm_count(device.index if device.index is not None else torch.cuda.current_device()))
    )


def _need(ok: bool, message: str | Callable[[], str]) -> None:
    """One launcher check; f-string messages come as lambdas so a passing check formats nothing."""
    if not ok:
        raise ValueError(message if isinstance(message, str) else message())


def draft_chain(
    base_logits: torch.Tensor,
    input_ids: torch.Tensor,
    anchor_idx: torch.Tensor,
    markov_w1: torch.Tensor,
    markov_w2: torch.Tensor,
    tokens_out: torch.Tensor,
    scratch: ChainScratch,
    *,
    gumbel: bool,
    idx_map: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
    seeds: torch.Tensor | None = None,
    sample_pos: torch.Tensor | None = None,
    pos_offset: int = -1,
    logits_cache: torch.Tensor | None = None,
    programs: int | None = None,
) -> None:
    """All K draft positions of B requests in one launch; no host sync, CUDA-graph safe.

    Args:
        base_logits: [B, K, V] bf16 base logits (row/position strides free, unit column stride).
        input_ids, anchor_idx: the token before position 0 of row b is input_ids[anchor_idx[b]].
        markov_w1, markov_w2: [V, R] bf16 contiguous Markov embedding and head (R a power of 2).
        tokens_out: [B, K] int64, any strides.
        scratch: ChainScratch with >= B rows, >= K positions, the same V.
        gumbel, idx_map, temperature, seeds, sample_pos, pos_offset, logits_cache: as `draft_step`,
            with idx_map / sample_pos [B, K] and the cache column = position.
        programs: grid size; default one per SM (capped by the block count), 1 under the interpreter.
    """
    B, K, V = base_logits.shape
    R = markov_w1.shape[1]
    _need(
        base_logits.dtype == torch.bfloat16 and base_logits.stride(2) == 1,
        "base_logits must be bf16, unit last stride",
    )
    for name, w in (("markov_w1", markov_w1), ("markov_w2", markov_w2)):
        _need(
            w.dtype == torch.bfloat16 and w.shape == (V, R) and w.is_contiguous(),
            lambda name=name: f"{name} must be contiguous [{V}, {R}] bf16",
        )
    _need(R >= 16 and R & (R - 1) == 0, lambda: f"Markov rank must be a power of 2 >= 16, got {R}")
    _need(
        tokens_out.dtype == torch.int64 and tokens_out.shape == (B, K),
        lambda: f"tokens_out must be [{B}, {K}] int64",
    )
    _need(
        anchor_idx.shape == (B,) and anchor_idx.stride(0) == 1 and input_ids.dim() == 1,
        "anchor_idx must be contiguous [B]",
    )
    blocks = triton.cdiv(V, SAMPLE_BLOCK)
    _need(
        scratch.logits.shape[0] >= B and scratch.logits.shape[1] == V and scratch.part_val.shape[0] >= K,
        lambda: (
            f"scratch holds {tuple(scratch.part_val.shape)} / {tuple(scratch.logits.shape)}, "
            f"need [{K}, {B}, {blocks}] / [{B}, {V}]"
        ),
    )
    if gumbel:
        for name, t in (("idx_map", idx_map), ("sample_pos", sample_pos)):
            _need(
                t is not None and t.dtype == torch.int64 and t.shape == (B, K),
                lambda name=name: f"{name} must be [{B}, {K}] int64",
            )
        _need(
            temperature is not None and temperature.dtype == torch.float32, "temperature must be fp32 [slots]"
        )
        _need(seeds is not None and seeds.dtype == torch.int64, "seeds must be int64 [slots]")
    if logits_cache is not None:
        _need(gumbel, "logits_cache is written in Gumbel mode only (upstream's greedy path keeps none)")
        _need(
            logits_cache.dtype == torch.bfloat16
            and logits_cache.shape[1] >= K
            and logits_cache.shape[2] >= V
            and logits_cache.stride(2) == 1,
            lambda: f"logits_cache must be [slots, >= {K}, >= {V}] bf16",
        )
    if B == 0:
        return
    grid = programs or resident_programs(base_logits.device, blocks)
    dummy = scratch.sync
    cache = logits_cache if logits_cache is not None else base_logits
    _draft_chain_kernel[(grid,)](
        base_logits,
        base_logits.stride(0),
        base_logits.stride(1),
        markov_w1,
        markov_w2,
        input_ids,
        anchor_idx,
        scratch.logits,
        scratch.part_val,
        scratch.part_idx,
        scratch.part_val.shape[1],
        scratch.sync,
        tokens_out,
        tokens_out.stride(0),
        tokens_out.stride(1),
        idx_map if gumbel else dummy,
        idx_map.stride(0) if gumbel else 0,
        idx_map.stride(1) if gumbel else 0,
        temperature if gumbel else dummy,
        seeds if gumbel else dummy,
        sample_pos if gumbel else dummy,
        sample_pos.stride(0) if gumbel else 0,
        sample_pos.stride(1) if gumbel else 0,
        pos_offset,
        cache,
        cache.stride(0) if logits_cache is not None else 0,
        cache.stride(1) if logits_cache is not None else 0,
        B,
        V,
        NUM_STEPS=K,
        RANK=R,
        BLOCK=SAMPLE_BLOCK,
        NUM_BLOCKS=blocks,
        PART_BLOCK=triton.next_power_of_2(blocks),
        BLOCK_R=ROW_TILE,
        BLOCK_V=COL_TILE,
        GUMBEL=gumbel,
        WRITE_CACHE=logits_cache is not None,
        INTERPRETED=os.environ.get("TRITON_INTERPRET") == "1",
        num_warps=NUM_WARPS,
    )


# ----------------------------------------------------------------------------- compile specs
_SIG = signature(
    _draft_chain_kernel,
    {
        "base_ptr": "bf16", "w1_ptr": "bf16", "w2_ptr": "bf16", "ids_ptr": "i32", "anchor_idx_ptr": "i64",
        "ws_ptr": "bf16", "part_val_ptr": "fp32", "part_idx_ptr": "i32", "sync_ptr": "i32", "tok_ptr": "i64",
        "idx_map_ptr": "i64", "temp_ptr": "fp32", "seed_ptr": "i64", "pos_ptr": "i64", "cache_ptr": "bf16",
    },
)  # fmt: skip
_ALIGNED = (
    "base_ptr", "base_stride_row", "base_stride_step", "w1_ptr", "w2_ptr", "ws_ptr", "cache_ptr",
    "cache_stride_req", "cache_stride_col", "vocab",
)  # fmt: skip


def _spec(gumbel: bool) -> CompileSpec:
    blocks = triton.cdiv(129_280, SAMPLE_BLOCK)
    constexprs = {
        "NUM_STEPS": 5,
        "RANK": 256,
        "BLOCK": SAMPLE_BLOCK,
        "NUM_BLOCKS": blocks,
        "PART_BLOCK": triton.next_power_of_2(blocks),
        "BLOCK_R": ROW_TILE,
        "BLOCK_V": COL_TILE,
        "GUMBEL": gumbel,
        "WRITE_CACHE": gumbel,
        "INTERPRETED": False,
    }
    name = f"dspark_draft.chain.{'gumbel' if gumbel else 'greedy'}.k5"
    return CompileSpec(name, _draft_chain_kernel, _SIG, constexprs, NUM_WARPS, divisible_by_16=_ALIGNED)


COMPILE_SPECS = (_spec(False), _spec(True))
