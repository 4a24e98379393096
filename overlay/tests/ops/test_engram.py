"""Engram lookup on SM8x: the byte-table kernel vs the exact torch decode (bitwise), packed bytes copied
unchanged, the sorted path equal to the unsorted one; on a GPU of capability >= 8.9 also bitwise vs
upstream's own fp8-table kernel on the same inputs. Cases and builders: testing/cases/engram.py."""

from __future__ import annotations

import pytest
import torch

from deepinfer_sm80.ops import engram as eg
from deepinfer_sm80.testing.cases.engram import (
    BF16_CASES,
    DIM,
    PACKED_CASE,
    QUANT_BLOCK,
    SORTED_CASE,
    Lookup,
    ids,
    launch,
    tables,
    upstream_outputs,
)
from deepinfer_sm80.testing.compare import assert_bitwise_equal
from deepinfer_sm80.testing.gates import requires_sm, test_device

DEV = test_device()
# scripts/h200_final.sh phase 2 runs this module under compute-sanitizer, in this order (time-boxed)
H200_SANITIZE_ORDER = 7
KERNEL = eg.EngramLookupKernel(None)


@pytest.mark.parametrize("case", BF16_CASES, ids=lambda c: f"{c.head_start}-{c.local_heads}")
def test_bf16_rows_match_exact_decode(case: Lookup) -> None:
    weight, scales = tables(case, DEV)
    hashes = ids(case).to(DEV)
    out = torch.full((case.tokens * case.local_heads, DIM), float("nan"), dtype=torch.bfloat16, device=DEV)
    launch(KERNEL, case, weight, scales, hashes, out)
    ref = eg.engram_lookup_ref(
        weight.cpu(), scales.cpu(), hashes.cpu(), case.vocab_start, case.vocab_end, case.head_start,
        case.local_heads, QUANT_BLOCK,
    )  # fmt: skip
    # the table covers [vocab_start, vocab_end): local row = id - vocab_start
    assert_bitwise_equal("engram bf16", out.cpu(), ref)


def test_packed_rows_are_the_table_bytes() -> None:
    case = PACKED_CASE
    weight, scales = tables(case, DEV)
    hashes = ids(case).to(DEV)
    width = DIM + DIM // QUANT_BLOCK
    out = torch.zeros((case.tokens, case.local_heads * width), dtype=torch.uint8, device=DEV)
    launch(KERNEL, case, weight, scales, hashes, out)
    picked = hashes.cpu()
    want = torch.cat([weight.view(torch.uint8).cpu()[picked], scales.cpu()[picked]], -1)
    assert_bitwise_equal("engram packed", out.cpu(), want.reshape(case.tokens, -1))


def test_sorted_path_equals_unsorted() -> None:
    case = SORTED_CASE
    weight, scales = tables(case, DEV)
    hashes = ids(case)
    plain = torch.empty((case.tokens * case.local_heads, DIM), dtype=torch.bfloat16, device=DEV)
    launch(KERNEL, case, weight, scales, hashes.to(DEV), plain)
    local, dst = hashes.flatten().sort()
    srt = torch.empty_like(plain)
    launch(KERNEL, case, weight, scales, local.to(DEV), srt, sorted_dst=dst.int().to(DEV))
    assert_bitwise_equal("engram sorted", srt.cpu(), plain.cpu())


@requires_sm(8, 9)
def test_matches_upstream_fp8_kernel_bitwise() -> None:
    mod = pytest.importorskip("vllm.models.deepseek_v41.common.engram")
    from deepinfer_sm80.bindings import original

    upstream = original(mod.__name__, "_engram_lookup_kernel") or mod._engram_lookup_kernel
    assert not isinstance(upstream, eg.EngramLookupKernel)
    outs = upstream_outputs(upstream)
    assert_bitwise_equal("engram vs upstream", outs["ours"], outs["upstream"])
