"""Cases of the lightning indexer (ops/indexer/): the inputs and checks against upstream's hardware-fp8
kernels (sm_89+) that bench/indexer.py records in its JSON (`quant`, `logits_check`) and
tests/ops/test_indexer_quant.py and test_indexer_logits.py assert. Importing it defines no Triton kernel
(our ops import at call time)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton

from deepinfer_sm80.formats.indexer_k import RECORD_BYTES

H, D = 32, 128  # V4.1's indexer heads and head size
QUANT_TOKENS = 4096
CHECK_SHAPE = (256, 4096, 8, 16384)  # prefill queries, keys; decode rows, context

# the op tests' shapes (interpreter-sized)
# logits, prefill: (name, queries, keys, ks of every query)
LOGITS_PREFILL = [("pf-m6-n200", 6, 200, 0), ("pf-m9-n300-ks", 9, 300, 37), ("pf-m1-n64", 1, 64, 0)]
# logits, paged decode: (name, batch, next_n, block_size, lens)
LOGITS_PAGED = [
    ("pg-b2-n1", 2, 1, 64, [150, 64]),  # page crossings, a length on a page edge
    ("pg-b1-n2", 1, 2, 128, [200]),  # native next_n = 2, 1-D lens: rows see 199 and 200 keys
]
# logits, paged-decode variants vs the default: (name, batch, next_n, block_size, lens, max_len)
LOGITS_PAGED_VARIANTS = [
    ("pgv-b2-n1", 2, 1, 64, [150, 64], 320),  # page crossings, a length on a page edge
    ("pgv-b2-n6", 2, 6, 64, [140, 75], 192),  # DSpark 1+5 rows, tiles past every row's length
]
# streamed top-k, prefill: (name, queries, keys, [(ks, ke) per request])
TOPK_PREFILL = [
    ("tk-one-request", 8, 1400, [(0, 1400)]),
    ("tk-three-requests-ks", 7, 1800, [(5, 700), (700, 1300), (1300, 1800)]),  # ks > 0, tiles span requests
    ("tk-short-rows", 5, 900, [(100, 400), (400, 900)]),  # rows with < 512 entries
]
# streamed top-k, decode: (name, batch, next_n, lens)
TOPK_DECODE = [("dk-b3", 3, 1, [1300, 200, 1000]), ("dk-flat6", 1, 6, [1100])]  # page crossings; DSpark 1+5


def codes(shape: tuple[int, ...], gen: torch.Generator, device: str = "cuda") -> torch.Tensor:
    """e4m3 codes, uniform over the bytes but the NaN codes (0x7F/0xFF step down one)."""
    c = torch.randint(0, 256, shape, generator=gen, device=device, dtype=torch.int32)
    return torch.where((c & 0x7F) == 0x7F, c - 1, c).to(torch.uint8)


def spread(shape: tuple[int, ...], gen: torch.Generator, device: str = "cuda") -> torch.Tensor:
    """bf16 rows over 2^-12..2^12; one in eight capped at amax exactly 7 (div_rn(amax, 448): a power of 2)."""
    x = torch.randn(shape, generator=gen, device=device)
    x = x * torch.exp2(torch.randint(-12, 12, (*shape[:-1], 1), generator=gen, device=device).float())
    seven = torch.randint(0, 8, (*shape[:-1], 1), generator=gen, device=device) == 0
    capped = x / x.abs().amax(-1, keepdim=True).clamp_min(1e-30) * 6.5
    capped[..., :1] = 7.0  # amax exactly 7: div_rn(amax, 448) is a power of two
    return torch.where(seven, capped, x).bfloat16()


def upstream_quant_bytes(device: str = "cuda", log: Callable[[str], None] = print) -> dict[str, object]:
    """Q bytes and weights, K records at ratio 1 and 2, counted where they differ from upstream's
    hardware-fp8 Triton kernels on the same inputs (the whole K pool, 0xAB-filled: a stray write counts)."""
    from vllm.models.deepseek_v4.common.ops.fused_indexer_q import FusedIndexerQRopeQuantTritonKernel
    from vllm.models.deepseek_v41.common.ops.indexer_k_store import indexer_k_norm_rope_store as up_k

    from deepinfer_sm80.ops.indexer import k_store, q_quant

    gen = torch.Generator(device=device).manual_seed(10)
    out: dict[str, object] = {}
    t = QUANT_TOKENS
    q = spread((t, H, D), gen, device)
    pos = torch.randint(0, 65536, (t,), generator=gen, device=device)
    ang = torch.rand(65536, 32, generator=gen, device=device) * 6.3
    cs = torch.cat([ang.cos(), ang.sin()], 1).float()
    w = (torch.randn(t, H, generator=gen, device=device) * 4).bfloat16()
    sm, hs = 128**-0.5, H**-0.5
    q8, w_out = q_quant.fused_indexer_q_rope_quant(pos, q, cs, w, sm, hs)
    q8_up = torch.empty((t, H, D), dtype=torch.float8_e4m3fn, device=device)
    w_up = torch.empty((t, H), dtype=torch.float32, device=device)
    FusedIndexerQRopeQuantTritonKernel.kernel[(t, H)](
        pos,
        q,
        q.stride(0),
        q.stride(1),
        cs,
        cs.stride(0),
        32,
        q8_up,
        q8_up.stride(0),
        q8_up.stride(1),
        D,
        w,
        w.stride(0),
        sm,
        hs,
        w_up,
        w_up.stride(0),
        FP8_MAX=448.0,
        USE_FNUZ=False,
        USE_EXPLICIT_FMA=False,
        enable_fp_fusion=True,
        num_warps=1,
    )
    out["q_bytes_differ"] = int((q8.view(torch.uint8) != q8_up.view(torch.uint8)).sum())
    out["q_weights_differ"] = int((w_out.view(torch.int32) != w_up.view(torch.int32)).sum())
    out["q_tokens"] = t
    for ratio, bs in ((1, 128), (2, 64)):
        kpre = spread((t, D), gen, device)
        kw = (1 + 0.1 * torch.randn(D, generator=gen, device=device)).bfloat16()
        blocks = t // bs + 2
        slots = torch.randperm(blocks * bs, generator=gen, device=device)[:t]
        slots[::17] = -1
        pb = -(-bs * RECORD_BYTES // 576) * 576
        ours = torch.full((blocks, pb), 0xAB, dtype=torch.uint8, device=device)
        ups = ours.clone()
        shape, strides = (blocks, bs, RECORD_BYTES), (pb, RECORD_BYTES, 1)
        k_store.indexer_k_norm_rope_store(
            kpre, pos, cs, kw, 1e-20, ours.as_strided(shape, strides), slots, ratio, False
        )
        up_k(kpre, pos, cs, kw, 1e-20, ups.as_strided(shape, strides), slots, ratio, False)
        out[f"k_r{ratio}_bytes_differ"] = int((ours != ups).sum())
        out[f"k_r{ratio}_records"] = int(((slots >= 0) & ((pos + 1) % ratio == 0)).sum())
    log(f"quant vs upstream: {out}")
    return out


def normalized_error(out: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor) -> float:
    return float(((out.double() - ref.double()).abs() / mag.clamp_min(1e-30)).max())


def upstream_logits(device: str = "cuda", log: Callable[[str], None] = print) -> dict[str, object]:
    """Prefill and paged-decode logits, max error over the magnitude Σ|w|·relu(q·k)·kscale, vs upstream's
    torch reference (prefill), upstream's Triton fp8 kernel (decode) and fp64 (both)."""
    from vllm.v1.attention.ops.rocm_aiter_mla_sparse import (
        _fp8_paged_mqa_logits_decode_kernel,
        fp8_mqa_logits_torch,
    )

    from deepinfer_sm80.ops.indexer import logits as lg

    gen = torch.Generator(device=device).manual_seed(11)
    res: dict[str, object] = {}
    m, n, rows, ctx = CHECK_SHAPE
    q8, k8 = codes((m, H, D), gen, device), codes((n, D), gen, device)
    ks = torch.exp2(torch.randint(-10, -6, (n,), generator=gen, device=device).float())
    w = torch.randn(m, H, generator=gen, device=device) * 2.0**-6
    zeros, full = (
        torch.zeros(m, dtype=torch.int32, device=device),
        torch.full((m,), n, dtype=torch.int32, device=device),
    )
    ours = lg.fp8_fp4_mqa_logits((q8, None), (k8, ks), w, zeros, full, False)
    qf, kf = q8.view(torch.float8_e4m3fn).float(), k8.view(torch.float8_e4m3fn).float()
    mag = torch.einsum("mhd,nd->mhn", qf, kf).relu().mul(w.abs()[:, :, None]).sum(1) * ks[None, :]
    up = fp8_mqa_logits_torch(
        q8.view(torch.float8_e4m3fn), (k8.view(torch.float8_e4m3fn), ks), w, zeros, full
    )
    res["prefill_vs_upstream_torch_max_rel"] = normalized_error(ours, up, mag)
    exact = torch.einsum("mhd,nd->mhn", qf.double(), kf.double()).relu().mul(w.double()[:, :, None]).sum(1)
    res["prefill_vs_fp64_max_rel"] = normalized_error(ours, exact * ks.double()[None, :], mag)
    # decode: upstream's Triton fp8 kernel on an unpadded 128-state page pool
    bs = 128
    pool, bt = paged_pool(rows, ctx, bs, gen, padded=False, device=device)
    q4 = codes((rows, 1, H, D), gen, device)
    wd = torch.randn(rows, H, generator=gen, device=device) * 2.0**-6
    lens = torch.full((rows,), ctx, dtype=torch.int32, device=device)
    ours_d = lg.fp8_fp4_paged_mqa_logits((q4, None), pool, wd, lens, bt, None, ctx, False)
    up_d = upstream_paged(_fp8_paged_mqa_logits_decode_kernel, q4, pool, wd, lens, bt, ctx, device)
    k_all = pool.reshape(pool.shape[0], -1)
    codes_all = k_all[:, : bs * D].reshape(-1, bs, D)[bt.long()].reshape(rows, ctx, D)
    sc_all = (
        k_all[:, bs * D : bs * RECORD_BYTES].contiguous().view(torch.float32)[bt.long()].reshape(rows, ctx)
    )
    qd = q4.view(torch.float8_e4m3fn).float().reshape(rows, H, D)
    magd = torch.einsum("rhd,rnd->rhn", qd, codes_all.view(torch.float8_e4m3fn).float()).relu()
    magd = magd.mul(wd.abs()[:, :, None]).sum(1) * sc_all
    res["decode_vs_upstream_triton_max_rel"] = normalized_error(ours_d, up_d, magd)
    exact_d = torch.einsum("rhd,rnd->rhn", qd.double(), codes_all.view(torch.float8_e4m3fn).double()).relu()
    exact_d = exact_d.mul(wd.double()[:, :, None]).sum(1) * sc_all.double()
    res["decode_vs_fp64_max_rel"] = normalized_error(ours_d, exact_d, magd)
    res["decode_upstream_vs_fp64_max_rel"] = normalized_error(up_d, exact_d, magd)
    log(f"logits vs upstream: {res}")
    return res


def paged_pool(
    rows: int, ctx: int, bs: int, gen: torch.Generator, padded: bool = True, device: str = "cuda"
) -> tuple[torch.Tensor, torch.Tensor]:
    """A page pool with `rows` distinct requests of ctx keys (no page shared, so no L2 reuse across rows)."""
    per = triton.cdiv(ctx, bs)
    blocks = rows * per
    page = (-(-bs * RECORD_BYTES // 576) * 576) if padded else bs * RECORD_BYTES
    raw = torch.empty((blocks, page), dtype=torch.uint8, device=device)
    raw[:, : bs * D].random_(0, 256, generator=gen).bitwise_and_(0xF7)  # never a NaN code
    scales = torch.exp2(torch.randint(-10, -6, (blocks, bs), generator=gen, device=device).float())
    raw[:, bs * D : bs * RECORD_BYTES] = scales.view(torch.uint8)
    pool = raw.as_strided((blocks, bs, RECORD_BYTES), (page, RECORD_BYTES, 1))
    bt = torch.randperm(blocks, generator=gen, device=device).to(torch.int32).reshape(rows, per)
    return pool, bt


def upstream_paged(
    kernel: Any,
    q4: torch.Tensor,
    pool: torch.Tensor,
    w: torch.Tensor,
    lens: torch.Tensor,
    bt: torch.Tensor,
    max_len: int,
    device: str = "cuda",
) -> torch.Tensor:
    """Upstream's `_fp8_paged_mqa_logits_decode_kernel` launched as its wrapper does (that wrapper needs
    vLLM's workspace manager), on an unpadded pool."""
    rows = q4.shape[0] * q4.shape[1]
    bs = pool.shape[1]
    flat = pool.reshape(pool.shape[0], -1)
    out = torch.empty((rows, max_len), dtype=torch.float32, device=device)
    splits = max(
        1,
        min(
            torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 4,
            triton.cdiv(max_len, 64),
            1024 // rows,
        ),
    )
    kernel[(rows, splits)](
        q4.view(torch.float8_e4m3fn),
        flat.view(torch.float8_e4m3fn),
        flat.view(torch.float32),
        w,
        lens,
        bt,
        out,
        q4.stride(0),
        q4.stride(1),
        q4.stride(2),
        w.stride(0),
        flat.stride(0),
        flat.stride(0) // 4,
        bs * D // 4,
        bt.stride(0),
        out.stride(0),
        bt.shape[1],
        max_len,
        NUM_HEADS=H,
        HEAD_SIZE=D,
        BLOCK_SIZE=bs,
        BLOCK_KV=64,
        N_SPLITS=splits,
        NEXT_N=1,
        CTX_PER_ROW=True,
        num_warps=4,
        num_stages=2,
    )
    return out
