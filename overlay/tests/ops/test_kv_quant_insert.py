"""quantize_and_insert_k_cache: base and optimized vs the reference, bitwise (docs/FP8_DS_MLA.md).

Every comparison covers the whole page pool, so a stray or missing write anywhere shows. Upstream's own
kernel (tl.float8e4nv) is compared on GPUs of capability >= 8.9 (the H200) at the end.
Cases, the input builder and the contract: testing/cases/kv_quant_insert.py.
"""

import inspect

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_sm80.formats.fp8_ds_mla import RECORD_BYTES, make_k_cache, token_views
from deepinfer_sm80.ops import kv_quant_insert as kvi
from deepinfer_sm80.ops.fp8 import e4m3_decode_ref, e4m3_encode_ref
from deepinfer_sm80.testing.cases.kv_quant_insert import (
    CASES,
    TILE_CASE,
    Case,
    insert_inputs,
    upstream_insert,
)
from deepinfer_sm80.testing.cases.upstream_records import clone_view, pool_of
from deepinfer_sm80.testing.compare import assert_bitwise_equal
from deepinfer_sm80.testing.gates import requires_cuda, requires_sm, test_device
from deepinfer_sm80.testing.inputs import avoid_seven_pow2, generator, k_rows, seed_note

DEV = test_device()
IMPLS = {"base": kvi.base_quantize_and_insert_k_cache, "optimized": kvi.quantize_and_insert_k_cache}


def check(
    impl: str, k: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor, block_size: int, note: str = ""
) -> None:
    if impl == "base":
        k = avoid_seven_pow2(k)
    ref, out = clone_view(cache), clone_view(cache)
    kvi.quantize_and_insert_ref(k, ref, slots, block_size)
    IMPLS[impl](k, out, slots, block_size)
    assert_bitwise_equal(f"insert[{impl}] {note}", pool_of(out), pool_of(ref))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_reference(case, impl):
    k, slots, cache = insert_inputs(case, DEV)
    check(impl, k, slots, cache, case.block_size, note=seed_note(case.name))


@pytest.mark.parametrize("block_t", [kvi.BLOCK_T, kvi.PREFILL_BLOCK_T])
def test_both_launch_tiles_match_reference(block_t):
    # the launcher picks the tile by batch size; both tiles must write the same bytes (T=37: a tail)
    case = TILE_CASE
    k, slots, cache = insert_inputs(case, DEV)
    ref, out = clone_view(cache), clone_view(cache)
    kvi.quantize_and_insert_ref(k, ref, slots, case.block_size)
    kvi.launch_insert(k, out, slots, case.block_size, block_t=block_t)
    assert_bitwise_equal(f"insert tile {block_t}", pool_of(out), pool_of(ref))


@pytest.mark.parametrize("impl", IMPLS)
def test_every_finite_code_and_exponent(impl):
    # 7 groups, each with amax top·2^e and every finite code <= top spread over them, at exponents
    # from the floor (-22) to bf16's top (119 with a 448 max): the bytes must be the codes themselves.
    # base tops at 0x7D (416): 448·2^e = 7·2^(e+6) is the case its float exponent may round up.
    top = 0x7E if impl == "optimized" else 0x7D
    codes = torch.tensor([c for c in range(256) if (c & 0x7F) <= top], dtype=torch.uint8)
    exps = torch.tensor([-22, -9, -1, 0, 1, 37, 119])
    grid = torch.full((7, 64), top, dtype=torch.uint8)
    spots = torch.arange(448).reshape(7, 64)[:, 1:].reshape(-1)  # column 0 keeps the group max
    grid.view(-1)[
        spots[torch.randperm(len(spots), generator=torch.Generator().manual_seed(1))[: len(codes)]]
    ] = codes
    x = e4m3_decode_ref(grid) * torch.exp2(exps.float())[:, None]
    k = torch.zeros(2, 512)
    k[:, :448] = x.reshape(448)
    k[:, 448:] = torch.randn(64)
    k = k.bfloat16().to(DEV)
    cache = make_k_cache(2, 32, device=DEV, generator=torch.Generator().manual_seed(2))
    slots = torch.tensor([33, 7], device=DEV)
    IMPLS[impl](k, cache, slots, 32)
    data, scale = token_views(cache, 32)
    for blk, pos in ((1, 1), (0, 7)):
        assert torch.equal(data[blk, pos, :448].cpu(), grid.reshape(448))
        assert scale[blk, pos].cpu().tolist() == [*(exps + 127).tolist(), 0]


def test_amax_seven_pow2_takes_the_lower_exponent():
    # amax = 7·2^j: amax/448 is exactly 2^(j-6), so e = j-6 and amax encodes as 448 (0x7E)
    j = torch.arange(-13, 7)
    x = torch.randn(len(j), 512, generator=torch.Generator().manual_seed(3)).clamp(-6.9, 6.9)
    x[:, :448] *= torch.exp2(j.float())[:, None]
    x[:, 0] = 7.0 * torch.exp2(j.float())
    k = x.bfloat16().to(DEV)
    cache = make_k_cache(1, 32, device=DEV, generator=torch.Generator().manual_seed(4))
    slots = torch.arange(len(j), device=DEV)
    ref = clone_view(cache)
    kvi.quantize_and_insert_ref(k, ref, slots, 32)
    kvi.quantize_and_insert_k_cache(k, cache, slots, 32)
    assert_bitwise_equal("insert 7·2^j", pool_of(cache), pool_of(ref))
    data, scale = token_views(cache, 32)
    assert (data[0, : len(j), 0].cpu() == 0x7E).all()
    assert scale[0, : len(j), 0].cpu().tolist() == (j - 6 + 127).tolist()


@triton.jit
def _encode_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, kvi._e4m3_in_range(tl.load(src_ptr + offs, mask=offs < n)), mask=offs < n)


def test_in_range_encoder_matches_torch():
    # every bf16 value in [-448, 448] (the kernel's scaled inputs are bf16·2^-e), then random fp32
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    x = bits.view(torch.bfloat16).float()
    x = x[x.abs() <= 448]
    gen = torch.Generator().manual_seed(6)
    y = (torch.rand(1 << 14, generator=gen) * 2 - 1) * torch.exp2(
        torch.randint(-30, 9, (1 << 14,), generator=gen)
    )
    x = torch.cat([x, y.clamp(-448, 448)]).to(DEV)
    out = torch.empty(x.shape, dtype=torch.uint8, device=DEV)
    _encode_kernel[(triton.cdiv(x.numel(), 4096),)](x, out, x.numel(), BLOCK=4096)
    assert_bitwise_equal("e4m3 in-range encoder", out, e4m3_encode_ref(x))


@settings(max_examples=12, deadline=None)
@given(
    tokens=st.integers(1, 70),
    block_size=st.sampled_from([32, 64, 128]),
    skip_frac=st.sampled_from([0.0, 0.3, 1.0]),
    slot_dtype=st.sampled_from([torch.int32, torch.int64]),
    extra_rows=st.integers(0, 3),
    layers=st.integers(1, 2),
    seed=st.integers(0, 2**31 - 1),
)
def test_fuzz_optimized(tokens, block_size, skip_frac, slot_dtype, extra_rows, layers, seed):
    case = Case(
        "fuzz",
        tokens,
        block_size=block_size,
        num_blocks=-(-tokens // block_size) + 1,
        skipped=int(tokens * skip_frac),
        slot_dtype=slot_dtype,
        extra_rows=extra_rows,
        layers_per_block=layers,
    )
    k, slots, cache = insert_inputs(case, DEV, seed)
    check("optimized", k, slots, cache, block_size)


@settings(max_examples=5, deadline=None)
@given(tokens=st.integers(1, 24), block_size=st.sampled_from([32, 128]), seed=st.integers(0, 2**31 - 1))
def test_fuzz_base(tokens, block_size, seed):
    case = Case("fuzz", tokens, block_size=block_size, num_blocks=2, skipped=tokens // 4)
    k, slots, cache = insert_inputs(case, DEV, seed)
    check("base", k, slots, cache, block_size)


@requires_cuda
@pytest.mark.parametrize("impl", IMPLS)
def test_page_offsets_past_2_31(impl):
    # 113,000 pages of 19,008 B: the last ones start past 2^31 bytes
    num_blocks, bs = 113_000, 32
    cache = torch.empty(num_blocks, 19_008, dtype=torch.uint8, device="cuda")
    cache[-4:].random_()
    view = cache.as_strided((num_blocks, bs, RECORD_BYTES), (19_008, RECORD_BYTES, 1))
    slots = torch.arange((num_blocks - 3) * bs, (num_blocks - 3) * bs + 70, device="cuda")
    k = k_rows(70, generator("past-2^31"), device="cuda")
    k = avoid_seven_pow2(k) if impl == "base" else k
    ref = cache.clone()
    kvi.quantize_and_insert_ref(k, ref.as_strided(view.shape, view.stride()), slots, bs)
    IMPLS[impl](k, view, slots, bs)
    assert_bitwise_equal(f"insert[{impl}] >2^31", cache[-4:], ref[-4:])


@pytest.mark.parametrize("impl", IMPLS)
def test_rejects_unsupported_records(impl):
    k = torch.zeros(2, 512, dtype=torch.bfloat16, device=DEV)
    cache = make_k_cache(1, 32, device=DEV)
    slots = torch.zeros(2, dtype=torch.int64, device=DEV)
    with pytest.raises(NotImplementedError, match="584"):
        IMPLS[impl](k, cache, slots, 32, bytes_per_token=528)
    with pytest.raises(ValueError, match="ROCm"):
        IMPLS[impl](k, cache, slots, 32, use_fnuz=True)
    with pytest.raises(ValueError, match="bf16"):
        IMPLS[impl](k.float(), cache, slots, 32)
    with pytest.raises(ValueError, match="block_size"):
        IMPLS[impl](k, cache, slots, 64)


def test_signatures_match_upstream():
    cu = pytest.importorskip("vllm.models.deepseek_v41.common.ops.cache_utils")
    want = inspect.signature(cu.quantize_and_insert_k_cache, eval_str=True)
    assert inspect.signature(kvi.base_quantize_and_insert_k_cache, eval_str=True) == want
    assert inspect.signature(kvi.quantize_and_insert_k_cache, eval_str=True) == want
    assert cu.V4_BYTES_PER_TOKEN == RECORD_BYTES


@requires_sm(8, 9)  # upstream's writer lowers tl.float8e4nv, which needs hardware e4m3 (sm_89+)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_upstream_kernel(case, impl):
    cu = pytest.importorskip("vllm.models.deepseek_v41.common.ops.cache_utils")
    k, slots, cache = insert_inputs(case, DEV)
    want, got = clone_view(cache), clone_view(cache)
    upstream_insert(cu, k, want, slots, case.block_size)
    IMPLS[impl](k, got, slots, case.block_size)
    assert_bitwise_equal(f"insert[{impl}] vs upstream {seed_note(case.name)}", pool_of(got), pool_of(want))


@requires_sm(8, 9)  # upstream's writer lowers tl.float8e4nv, which needs hardware e4m3 (sm_89+)
def test_bench_cases_match_upstream_kernel():
    # the cases bench/kv_quant_insert.py records in its JSON: T=8192, int32 slots, RoPE of any bits, 7·2^j
    from deepinfer_sm80.testing.cases import kv_quant_insert as cases
    from deepinfer_sm80.testing.cases.upstream_records import mismatches

    cu = pytest.importorskip("vllm.models.deepseek_v41.common.ops.cache_utils")
    name = "kv-insert-upstream-cases"
    records = cases.upstream_bitwise(cu, generator(name, "cuda"))
    assert set(records) == {f"T{t}-bs{bs}-{d}" for t, bs, d in cases.UPSTREAM_CASES} | {"amax_7x2^j"}
    assert not mismatches(records), f"{seed_note(name)}: {mismatches(records)}"
