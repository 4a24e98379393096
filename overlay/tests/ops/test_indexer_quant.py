"""Indexer Q quantizer and K writer vs torch emulations of upstream's rounding: bytes and scales bitwise.

The whole page pool is compared, so a stray or missing write shows. Upstream's own hardware-fp8
kernels are compared on sm_89+ by test_bench_cases_match_upstream_kernels (testing/cases/indexer.py, the
cases bench/indexer.py records in its JSON; same inputs, bitwise).
"""

from __future__ import annotations

import pytest
import torch

from deepinfer_sm80.formats.indexer_k import RECORD_BYTES, make_k_cache, page_bytes, state_views
from deepinfer_sm80.ops.indexer import k_store, q_quant
from deepinfer_sm80.testing.compare import assert_bitwise_equal
from deepinfer_sm80.testing.gates import requires_sm, test_device
from deepinfer_sm80.testing.inputs import generator, seed_note

DEV = test_device()
# scripts/h200_final.sh phase 2 runs this module under compute-sanitizer, in this order (time-boxed)
H200_SANITIZE_ORDER = 2


def spread_bf16(shape: tuple[int, ...], gen: torch.Generator, *, lo: int = -20, hi: int = 20) -> torch.Tensor:
    """bf16 values over 2^lo..2^hi per row of the last dim; zero rows, tiny rows, exact 7·2^j maxima."""
    x = torch.randn(shape, generator=gen) * torch.exp2(
        torch.randint(lo, hi, (*shape[:-1], 1), generator=gen).float()
    )
    kind = torch.randint(0, 12, (*shape[:-1], 1), generator=gen)
    x = torch.where(kind == 0, torch.zeros_like(x), x)  # amax floor 1e-4
    x = torch.where(kind == 1, x * 1e-7, x)  # below the floor
    # amax exactly 7·2^j: div_rn(amax, 448) is a power of two, the exponent must not round up
    j = torch.exp2(torch.randint(-8, 8, (*shape[:-1], 1), generator=gen).float())
    capped = x / x.abs().amax(-1, keepdim=True).clamp_min(1e-30) * 6.5 * j
    capped[..., :1] = 7.0 * j
    x = torch.where(kind == 2, capped, x)
    return x.bfloat16()


def cos_sin(max_pos: int, gen: torch.Generator) -> torch.Tensor:
    ang = torch.rand(max_pos, 32, generator=gen) * 6.3
    return torch.cat([ang.cos(), ang.sin()], dim=1).float()  # [max_pos, 64]: 32 cos, 32 sin


Q_CASES = [("q-t1", 1, 32), ("q-t7", 7, 32), ("q-t5-h16", 5, 16), ("q-t3-h8", 3, 8)]


@pytest.mark.parametrize(("name", "tokens", "heads"), Q_CASES)
def test_q_quant_bitwise(name: str, tokens: int, heads: int) -> None:
    gen = generator(name)
    q = spread_bf16((tokens, heads, 128), gen)
    positions = torch.randint(0, 64, (tokens,), generator=gen)
    cs = cos_sin(64, gen)
    w = (torch.randn(tokens, heads, generator=gen) * 4).bfloat16()
    ref_q8, ref_w = q_quant.fused_indexer_q_rope_quant_ref(positions, q, cs, w, 0.08838834764, heads**-0.5)
    q8, w_out = q_quant.fused_indexer_q_rope_quant(
        positions.to(DEV), q.to(DEV), cs.to(DEV), w.to(DEV), 0.08838834764, heads**-0.5
    )
    assert q8.dtype == torch.float8_e4m3fn, seed_note(name)
    assert_bitwise_equal(f"{name} q8 ({seed_note(name)})", q8.view(torch.uint8).cpu(), ref_q8)
    assert_bitwise_equal(f"{name} weights ({seed_note(name)})", w_out.cpu(), ref_w)


def test_q_quant_strided_input() -> None:
    """index_q is a view of the wq_b output ([T, H·128] rows); q8 is written contiguous."""
    name = "q-strided"
    gen = generator(name)
    base = spread_bf16((4, 32 * 128 + 64), gen)
    q = base[:, : 32 * 128].view(4, 32, 128)
    positions = torch.arange(4)
    cs = cos_sin(8, gen)
    w = torch.randn(4, 32, generator=gen).bfloat16()
    ref_q8, ref_w = q_quant.fused_indexer_q_rope_quant_ref(positions, q, cs, w, 0.5, 0.25)
    q8, w_out = q_quant.fused_indexer_q_rope_quant(
        positions.to(DEV), q.to(DEV), cs.to(DEV), w.to(DEV), 0.5, 0.25
    )
    assert_bitwise_equal(name, q8.view(torch.uint8).cpu(), ref_q8)
    assert_bitwise_equal(name + " w", w_out.cpu(), ref_w)


def test_q_quant_rejects_fp4() -> None:
    with pytest.raises(NotImplementedError, match="MXFP4"):
        q_quant.fused_indexer_q_rope_quant(
            torch.zeros(1, dtype=torch.long),
            torch.zeros(1, 32, 128).bfloat16(),
            torch.zeros(1, 64),
            torch.zeros(1, 32),
            1.0,
            1.0,
            use_fp4=True,
        )


K_CASES = [
    # name, tokens, block_size, num_blocks, ratio, skipped
    ("k-r1-bs128", 40, 128, 2, 1, 3),
    ("k-r2-bs64", 50, 64, 3, 2, 4),
    ("k-r1-one", 1, 128, 1, 1, 0),
]


@pytest.mark.parametrize(("name", "tokens", "block_size", "num_blocks", "ratio", "skipped"), K_CASES)
def test_k_store_bitwise(
    name: str, tokens: int, block_size: int, num_blocks: int, ratio: int, skipped: int
) -> None:
    gen = generator(name)
    k_pre = spread_bf16((tokens + 3, 128), gen, lo=-6, hi=6)  # 3 rows past the slots (DP padding)
    positions = torch.randint(0, 200, (tokens + 3,), generator=gen)
    cs = cos_sin(256, gen)
    w = (1 + 0.2 * torch.randn(128, generator=gen)).bfloat16()
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[torch.randperm(tokens, generator=gen)[:skipped]] = -1
    ref = make_k_cache(num_blocks, block_size)
    k_store.indexer_k_store_ref(k_pre, positions, cs, w, 1e-20, ref, slots, ratio)
    out = make_k_cache(num_blocks, block_size, device=DEV)
    k_store.indexer_k_norm_rope_store(
        k_pre.to(DEV), positions.to(DEV), cs.to(DEV), w.to(DEV), 1e-20, out, slots.to(DEV), ratio, False
    )
    pb = page_bytes(block_size)
    raw_out = out.as_strided((num_blocks, pb), (pb, 1)).cpu()
    raw_ref = ref.as_strided((num_blocks, pb), (pb, 1))
    assert_bitwise_equal(f"{name} pages ({seed_note(name)})", raw_out, raw_ref)
    written = int(((slots >= 0) & ((positions[:tokens] + 1) % ratio == 0)).sum())
    assert written > 0, "the case must write something"
    _codes, scales = state_views(ref)
    assert int(torch.isfinite(scales).sum()) == written  # unwritten states keep the 0xFF poison (NaN)


def test_k_cache_views_follow_page_stride() -> None:
    cache = make_k_cache(3, 64)
    assert cache.shape == (3, 64, RECORD_BYTES) and cache.stride(0) == page_bytes(64) == 8640
    codes, scales = state_views(cache)
    assert codes.shape == (3, 64, 128) and scales.shape == (3, 64)
    assert scales.data_ptr() - cache.data_ptr() == 64 * 128


@requires_sm(8, 9)  # upstream's Q and K writers lower tl.float8e4nv, which needs hardware e4m3 (sm_89+)
def test_bench_cases_match_upstream_kernels():
    # the cases bench/indexer.py records (`quant`): 4096 tokens, 7·2^j maxima, ratios 1 and 2, skipped slots
    pytest.importorskip("vllm.models.deepseek_v41.common.ops.indexer_k_store")
    from deepinfer_sm80.testing.cases import indexer as cases

    counts = cases.upstream_quant_bytes("cuda")
    differ = {k: v for k, v in counts.items() if k.endswith("differ")}
    assert set(differ) == {"q_bytes_differ", "q_weights_differ", "k_r1_bytes_differ", "k_r2_bytes_differ"}
    assert all(v == 0 for v in differ.values()), differ
    assert counts["k_r1_records"] > 0 and counts["k_r2_records"] > 0  # the K comparison wrote records
