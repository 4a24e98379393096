"""Device functions shared by the sparse MLA kernels: record addressing, K-tile dequant, the softmax finish.

Numeric rules (docs/SPARSE_MLA.md): a K value that decodes to NaN (e4m3 code 0x7F/0xFF, a 0 x inf product,
a NaN RoPE half) becomes 0, ±inf is kept; an invalid slot contributes nothing; the sink joins the softmax
denominator only; a row with nothing to attend to is 0.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from deepinfer_sm80.formats.fp8_ds_mla import NOPE_DIM, ROPE_DIM
from deepinfer_sm80.ops.fp8 import e4m3_to_f32, ue8m0_to_f32
from deepinfer_sm80.ops.record_constexprs import DATA as _DATA
from deepinfer_sm80.ops.record_constexprs import GROUP_SIZE as _GROUP
from deepinfer_sm80.ops.record_constexprs import GROUPS as _N_GROUPS
from deepinfer_sm80.ops.record_constexprs import NOPE as _NOPE
from deepinfer_sm80.ops.record_constexprs import ROPE as _ROPE
from deepinfer_sm80.ops.record_constexprs import SCALE as _SCALE

NEG_LARGE = -3.4028234663852886e38  # the running-max start and the masked score (finite: exp(x - x) = 1)
_NEG_LARGE = tl.constexpr(NEG_LARGE)
HEAD_DIM = NOPE_DIM + ROPE_DIM
_HEAD = tl.constexpr(HEAD_DIM)
# Triton 3.7.1's interpreter multiplies bf16 dot operands as raw bits (errors ~1e10): there the products
# run on fp32 copies, which are exact for bf16 inputs (same fp32 accumulation, another order)
_INTERPRET = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def mma(a, b):
    """bf16 x bf16 -> fp32 product (mma.sync m16n8k16 on SM80)."""
    if _INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def record_ptrs(cache_ptr, slot, valid, page_stride, BLOCK_SIZE: tl.constexpr):
    """Data and scale byte pointers of `slot`'s 584-byte record ([N] each); invalid slots read slot 0."""
    safe = tl.where(valid, slot, 0)
    page = cache_ptr + (safe // BLOCK_SIZE).to(tl.int64) * page_stride  # int64: pages pass 2^31 B early
    within = safe % BLOCK_SIZE
    return page + within * _DATA, page + BLOCK_SIZE * _DATA + within * _SCALE


@triton.jit
def k_tile_split(data_ptr, scale_ptr, valid):
    """Upstream's form: NoPE as a 512-wide tile (columns >= 448 zero) and RoPE apart, scales by exp2.

    Returns k_nope [N, 512] and k_rope [N, 64], bf16, NaN -> 0.
    """
    cols = tl.arange(0, 512)
    nope_mask = valid[:, None] & (cols[None, :] < _NOPE)
    codes = tl.load(data_ptr[:, None] + cols[None, :], mask=nope_mask, other=0)
    u = tl.load(scale_ptr[:, None] + cols[None, :] // _GROUP, mask=nope_mask, other=127)
    scales = tl.exp2(u.to(tl.float32) - 127.0)
    # upstream multiplies bf16(x) by bf16(scale) in bf16; both factors are exact in bf16 and the fp32
    # product rounds once to the same bf16 (and the interpreter has no bf16 arithmetic)
    k_nope = e4m3_to_f32(codes) * scales
    k_nope = tl.where(nope_mask & (k_nope == k_nope), k_nope, 0.0).to(tl.bfloat16)
    rope_cols = tl.arange(0, _ROPE)
    rope_ptr = (data_ptr + _NOPE).to(tl.pointer_type(tl.bfloat16))
    k_rope = tl.load(rope_ptr[:, None] + rope_cols[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
    k_rope = tl.where(k_rope == k_rope, k_rope, 0.0).to(tl.bfloat16)  # NaN tests in fp32 (exact widening)
    return k_nope, k_rope


@triton.jit
def k_tile_load(data_ptr, scale_ptr, valid):
    """The raw bytes of a K tile: NoPE codes [N, 8, 64] (group 7 zero), the 8 scale bytes as one 64-bit
    word [N], the 64 RoPE values [N, 1, 64] bf16; invalid rows read as 0. Split from k_tile_decode so a
    kernel can issue the next tile's loads before it decodes this one (the prefetch variant)."""
    g = tl.arange(0, _N_GROUPS + 1)[None, :, None]  # [1, 8, 1]
    col = g * _GROUP + tl.arange(0, _GROUP)[None, None, :]  # [1, 8, 64]
    v3 = valid[:, None, None]
    codes = tl.load(data_ptr[:, None, None] + col, mask=v3 & (g < _N_GROUPS), other=0)  # [N, 8, 64]
    word = tl.load(scale_ptr.to(tl.pointer_type(tl.int64)), mask=valid, other=0)  # [N] 8 scale bytes
    rope_ptr = (data_ptr + _NOPE).to(tl.pointer_type(tl.bfloat16))
    rope = tl.load(rope_ptr[:, None, None] + tl.arange(0, _GROUP)[None, None, :], mask=v3, other=0.0)
    return codes, word, rope


@triton.jit
def k_tile_decode(codes, word, rope, BLOCK_N: tl.constexpr):
    """k_tile_load's bytes -> the [BLOCK_N, 512] bf16 K tile (UE8M0 by bit placement, NaN -> 0)."""
    g = tl.arange(0, _N_GROUPS + 1)[None, :, None]  # [1, 8, 1]
    u = (word[:, None, None] >> (8 * g)) & 0xFF  # [N, 8, 1]: little-endian byte g
    nope = e4m3_to_f32(codes) * ue8m0_to_f32(u)
    k = tl.where(g < _N_GROUPS, nope, rope.to(tl.float32))  # [N, 8, 64] fp32: every value exact
    k = tl.where(k == k, k, 0.0).to(tl.bfloat16)
    return tl.reshape(k, (BLOCK_N, _HEAD))


@triton.jit
def k_tile_512(data_ptr, scale_ptr, valid, BLOCK_N: tl.constexpr):
    """The whole 512-wide K row in registers: 7 dequantized 64-groups, then the 64 RoPE values as group 7.

    The 8 scale bytes arrive as one 64-bit word and each group's byte comes out by a shift (UE8M0 by
    bit placement, docs/FP8_DS_MLA.md). Returns [BLOCK_N, 512] bf16, NaN -> 0, invalid rows 0.
    """
    codes, word, rope = k_tile_load(data_ptr, scale_ptr, valid)
    return k_tile_decode(codes, word, rope, BLOCK_N)


@triton.jit
def online_update(m_i, l_i, scores, valid):
    """One online-softmax step over a [H, N] score tile: new max, rescale factor, bf16-ready p, new sum."""
    scores = tl.where(valid[None, :], scores, _NEG_LARGE)
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(scores - m_new[:, None])
    p = tl.where(valid[None, :], p, 0.0)
    l_new = l_i * alpha + tl.sum(p, axis=1)
    return m_new, alpha, p, l_new


@triton.jit
def finish_store(
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
    BLOCK_H: tl.constexpr,
    FUSE_INV_ROPE: tl.constexpr,
):
    """out = l > 0 ? acc / max(l, 1e-30) : 0, then the optional inverse GPT-J RoPE on lanes 448..511
    (even' = e·cos + o·sin, odd' = o·cos − e·sin, fp32, cos | sin halves of cos_sin_cache[pos]), bf16 store.

    acc [BLOCK_H, 512] is already weighted by the final softmax rescale; the split-1 direct path and the
    reduce call this with the same operands, so their outputs are bitwise equal.
    """
    out = tl.where(l_final[:, None] > 0.0, acc / tl.maximum(l_final, 1.0e-30)[:, None], 0.0)
    if FUSE_INV_ROPE:
        pos = tl.load(pos_ptr + q_idx).to(tl.int64)
        pair = tl.arange(0, _HEAD // 2) - _NOPE // 2  # [256]: rope pair index, < 0 on NoPE lanes
        is_rope = pair >= 0
        k = tl.where(is_rope, pair, 0)
        cos = tl.load(cos_sin_ptr + pos * cs_stride + k, mask=is_rope, other=1.0).to(tl.float32)
        sin = tl.load(cos_sin_ptr + pos * cs_stride + _ROPE // 2 + k, mask=is_rope, other=0.0).to(tl.float32)
        even, odd = tl.split(tl.reshape(out, (BLOCK_H, _HEAD // 2, 2)))
        rot_even = tl.where(is_rope[None, :], even * cos[None, :] + odd * sin[None, :], even)
        rot_odd = tl.where(is_rope[None, :], odd * cos[None, :] - even * sin[None, :], odd)
        out = tl.reshape(tl.join(rot_even, rot_odd), (BLOCK_H, _HEAD))
    cols = tl.arange(0, _HEAD)
    row = out_ptr + q_idx.to(tl.int64) * out_stride0 + heads[:, None] * out_stride1
    tl.store(row + cols[None, :], out.to(tl.bfloat16), mask=head_mask[:, None])
