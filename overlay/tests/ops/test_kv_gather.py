"""dequantize_and_gather_k_cache: base and optimized vs the reference, bitwise (docs/OPERATORS.md).

`out` starts as random bits, and the whole tensor is compared, so rows outside a gather must survive
untouched. Upstream's own kernel (tl.float8e4nv) is compared on GPUs of capability >= 8.9 (the H200).
Cases, the input builder and the contract: testing/cases/kv_gather.py.
"""

import inspect

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_sm80.formats.fp8_ds_mla import RECORD_BYTES, make_k_cache, page_bytes, token_views
from deepinfer_sm80.ops import kv_gather as kvg
from deepinfer_sm80.testing.cases.kv_gather import (
    CASES,
    Case,
    comparable,
    gather,
    gather_inputs,
    upstream_gather,
)
from deepinfer_sm80.testing.compare import assert_bitwise_equal
from deepinfer_sm80.testing.gates import interpreting, requires_cuda, requires_sm, test_device
from deepinfer_sm80.testing.inputs import generator, seed_note

DEV = test_device()
IMPLS = {"base": kvg.base_dequantize_and_gather_k_cache, "optimized": kvg.dequantize_and_gather_k_cache}


def run_and_check(impl: str, case: Case, seed: int | None = None) -> None:
    # base scales with exp2(u - 127): the interpreter's numpy exp2(-127) is 2^-127, the GPU's
    # ex2.approx.ftz is 0 (docs/FP8_DS_MLA.md), so base meets scale byte 0 on the GPU only
    inputs = gather_inputs(case, DEV, seed, with_zero_scale=impl == "optimized" or not interpreting())
    out, cache, seq_lens, gather_lens, table = inputs
    ref = out.clone()
    kvg.dequantize_and_gather_ref(ref, cache, seq_lens, gather_lens, table, case.block_size, case.offset)
    gather(IMPLS[impl], case, inputs)
    note = seed_note(case.name) if seed is None else f"hypothesis seed {seed}"
    assert_bitwise_equal(f"gather[{impl}] {note}", comparable(out, ref), ref)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_reference(case, impl):
    run_and_check(impl, case)


def test_reference_decodes_every_code_and_scale():
    # independent check of the reference on one page: all 256 codes x all 256 scale bytes
    bs = 256
    cache = make_k_cache(1, bs, generator=torch.Generator().manual_seed(9))
    data, scale = token_views(cache, bs)
    data[0, :, :256] = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    scale[0, :, :7] = torch.arange(256, dtype=torch.int32).to(torch.uint8)[:, None]
    out = torch.zeros(1, bs, 512, dtype=torch.bfloat16)
    kvg.dequantize_and_gather_ref(
        out, cache, torch.tensor([bs]), None, torch.zeros(1, 1, dtype=torch.int32), bs, 0
    )
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double()
    want = codes[None, :] * torch.pow(2.0, torch.arange(256).double() - 127)[:, None]  # [scale, code]
    want[0] = codes * 0.0  # UE8M0 0 decodes to 0 (the bit shift, docs/FP8_DS_MLA.md); 0 x NaN stays NaN
    want[255] = codes * float("inf")
    assert_bitwise_equal("ref all codes x scales", out[0, :, :256], want.to(torch.bfloat16))


@settings(max_examples=10, deadline=None)
@given(
    block_size=st.sampled_from([32, 64, 128]),
    seq_gather=st.lists(st.tuples(st.integers(0, 260), st.floats(0, 1)), min_size=1, max_size=3),
    whole=st.booleans(),
    offset=st.integers(0, 20),
    out_row_stride=st.sampled_from([512, 768]),
    table_pad=st.integers(0, 2),
    layers=st.integers(1, 2),
    seed=st.integers(0, 2**31 - 1),
)
def test_fuzz_optimized(block_size, seq_gather, whole, offset, out_row_stride, table_pad, layers, seed):
    seq = tuple(s for s, _ in seq_gather)
    gather = None if whole else tuple(int(s * f) for s, f in seq_gather)
    case = Case(
        "fuzz",
        seq,
        gather,
        block_size=block_size,
        offset=offset,
        out_row_stride=out_row_stride,
        table_pad=table_pad,
        layers_per_block=layers,
    )
    run_and_check("optimized", case, seed)


@settings(max_examples=4, deadline=None)
@given(
    seq_gather=st.lists(st.tuples(st.integers(0, 80), st.floats(0, 1)), min_size=1, max_size=2),
    offset=st.integers(0, 9),
    seed=st.integers(0, 2**31 - 1),
)
def test_fuzz_base(seq_gather, offset, seed):
    case = Case(
        "fuzz", tuple(s for s, _ in seq_gather), tuple(int(s * f) for s, f in seq_gather), offset=offset
    )
    run_and_check("base", case, seed)


@requires_cuda
@pytest.mark.parametrize("impl", IMPLS)
def test_page_offsets_past_2_31(impl):
    # 113,000 pages of 19,008 B: the last ones start past 2^31 bytes
    num_blocks, bs = 113_000, 32
    pool = torch.empty(num_blocks, page_bytes(bs), dtype=torch.uint8, device="cuda")
    pool[-4:].random_()
    cache = pool.as_strided((num_blocks, bs, RECORD_BYTES), (pool.stride(0), RECORD_BYTES, 1))
    table = torch.tensor([[num_blocks - 1, num_blocks - 3, num_blocks - 2]], dtype=torch.int32, device="cuda")
    seq_lens = torch.tensor([90], dtype=torch.int32, device="cuda")
    out = torch.randn(1, 100, 512, device="cuda").bfloat16()
    ref = out.clone()
    kvg.dequantize_and_gather_ref(ref, cache, seq_lens, None, table, bs, 3)
    IMPLS[impl](out, cache, seq_lens, None, table, bs, 3)
    assert_bitwise_equal(f"gather[{impl}] >2^31", out, ref)


@pytest.mark.parametrize("impl", IMPLS)
def test_rejects_unsupported_inputs(impl):
    out, cache, seq_lens, _, table = gather_inputs(CASES[0], DEV)
    with pytest.raises(ValueError, match="ROCm"):
        IMPLS[impl](out, cache, seq_lens, None, table, 32, 0, use_fnuz=True)
    with pytest.raises(NotImplementedError, match="584"):
        IMPLS[impl](out, cache[..., :528], seq_lens, None, table, 32, 0)
    with pytest.raises(ValueError, match="bf16"):
        IMPLS[impl](out.float(), cache, seq_lens, None, table, 32, 0)
    with pytest.raises(ValueError, match="block_size"):
        IMPLS[impl](out, cache, seq_lens, None, table, 64, 0)


def test_signatures_match_upstream():
    cu = pytest.importorskip("vllm.models.deepseek_v41.common.ops.cache_utils")
    want = inspect.signature(cu.dequantize_and_gather_k_cache, eval_str=True)
    assert inspect.signature(kvg.base_dequantize_and_gather_k_cache, eval_str=True) == want
    assert inspect.signature(kvg.dequantize_and_gather_k_cache, eval_str=True) == want
    assert kvg.gather_num_workers(49_152) == cu.gather_num_workers(49_152)
    assert kvg.gather_num_workers(None) == cu.gather_num_workers(None)


@requires_sm(8, 9)  # upstream's gather bitcasts tl.float8e4nv, which needs hardware e4m3 (sm_89+)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_upstream_kernel(case, impl):
    cu = pytest.importorskip("vllm.models.deepseek_v41.common.ops.cache_utils")
    inputs = gather_inputs(case, DEV)
    out, want = inputs[0], inputs[0].clone()
    upstream_gather(cu, want, case, inputs)
    gather(IMPLS[impl], case, inputs)
    assert_bitwise_equal(f"gather[{impl}] vs upstream {seed_note(case.name)}", out, want)


@requires_sm(8, 9)  # upstream's gather bitcasts tl.float8e4nv, which needs hardware e4m3 (sm_89+)
def test_bench_cases_match_upstream_kernel():
    # the cases bench/kv_gather.py records in its JSON: poisoned outputs with spare rows, zero lengths, 48K
    from deepinfer_sm80.testing.cases import kv_gather as cases
    from deepinfer_sm80.testing.cases.upstream_records import mismatches

    cu = pytest.importorskip("vllm.models.deepseek_v41.common.ops.cache_utils")
    name = "kv-gather-upstream-cases"
    records = cases.upstream_bitwise(cu, generator(name, "cuda"))
    assert set(records) == {c[0] for c in cases.UPSTREAM_CASES}
    assert not mismatches(records), f"{seed_note(name)}: {mismatches(records)}"
