"""Engram lookup on SM8x: the byte-table kernel vs the exact torch decode (bitwise), packed bytes copied
unchanged, the sorted path equal to the unsorted one; on a GPU of capability >= 8.9 also bitwise vs
upstream's own fp8-table kernel on the same inputs."""

from __future__ import annotations

import pytest
import torch

from deepinfer_sm80.ops import engram as eg
from deepinfer_sm80.testing.compare import assert_bitwise_equal
from deepinfer_sm80.testing.gates import requires_sm, test_device
from deepinfer_sm80.testing.inputs import generator

DEV = test_device()
# scripts/h200_final.sh phase 2 runs this module under compute-sanitizer, in this order (time-boxed)
H200_SANITIZE_ORDER = 7
DIM, QB = 256, 128


def tables(name: str, vocab: int, device: str):
    gen = generator(name)
    codes = torch.randint(0, 256, (vocab, DIM), dtype=torch.uint8, generator=gen)
    codes[(codes & 0x7F) == 0x7F] = 0x01  # the table holds no NaN codes
    scales = torch.randint(100, 140, (vocab, DIM // QB), dtype=torch.uint8, generator=gen)
    return codes.view(torch.float8_e4m3fn).to(device), scales.to(device)


def launch(weight, scales, ids, out, *, vocab_start, vocab_end, head_start, local_heads, sorted_dst=None):
    rows = ids.shape[0] * local_heads if sorted_dst is None else ids.numel()
    grid = 3
    eg.EngramLookupKernel(None)[(grid,)](
        weight,
        scales,
        ids,
        ids if sorted_dst is None else sorted_dst,
        out,
        vocab_start,
        vocab_end,
        rows,
        ids.stride(0),
        ids.stride(-1),
        HEAD_START=head_start,
        LOCAL_HEADS=local_heads,
        TOTAL_HEADS=ids.shape[-1],
        DIM=DIM,
        QUANT_BLOCK=QB,
        BLOCK_R=16,
        GRID=grid,
        SORTED=int(sorted_dst is not None),  # int: the interpreter rejects bool args
        PACKED=out.dtype == torch.uint8,
        OUT_STRIDE=out.stride(0),
    )


@pytest.mark.parametrize(("head_start", "local_heads"), [(0, 4), (3, 2), (4, 2)])
def test_bf16_rows_match_exact_decode(head_start: int, local_heads: int) -> None:
    weight, scales = tables("engram-bf16", 50, DEV)
    gen = generator(f"engram-ids-{head_start}")
    ids = torch.randint(0, 80, (7, 5), generator=gen).to(DEV)  # ids >= 50 belong to another shard
    out = torch.full((7 * local_heads, DIM), float("nan"), dtype=torch.bfloat16, device=DEV)
    launch(
        weight, scales, ids, out, vocab_start=10, vocab_end=60, head_start=head_start, local_heads=local_heads
    )
    ref = eg.engram_lookup_ref(weight.cpu(), scales.cpu(), ids.cpu() - 0, 10, 60, head_start, local_heads, QB)
    # the table covers [vocab_start, vocab_end): local row = id - vocab_start
    assert_bitwise_equal("engram bf16", out.cpu(), ref)


def test_packed_rows_are_the_table_bytes() -> None:
    weight, scales = tables("engram-packed", 40, DEV)
    ids = torch.randint(0, 40, (6, 2), generator=generator("engram-packed-ids")).to(DEV)
    width = DIM + DIM // QB
    out = torch.zeros((6, 2 * width), dtype=torch.uint8, device=DEV)
    launch(weight, scales, ids, out, vocab_start=0, vocab_end=40, head_start=0, local_heads=2)
    want = torch.cat([weight.view(torch.uint8).cpu()[ids.cpu()], scales.cpu()[ids.cpu()]], -1).reshape(6, -1)
    assert_bitwise_equal("engram packed", out.cpu(), want)


def test_sorted_path_equals_unsorted() -> None:
    weight, scales = tables("engram-sorted", 30, DEV)
    ids = torch.randint(0, 30, (9, 2), generator=generator("engram-sorted-ids"))
    plain = torch.empty((18, DIM), dtype=torch.bfloat16, device=DEV)
    launch(weight, scales, ids.to(DEV), plain, vocab_start=0, vocab_end=30, head_start=0, local_heads=2)
    local, dst = ids.flatten().sort()
    srt = torch.empty_like(plain)
    launch(
        weight,
        scales,
        local.to(DEV),
        srt,
        vocab_start=0,
        vocab_end=30,
        head_start=0,
        local_heads=2,
        sorted_dst=dst.int().to(DEV),
    )
    assert_bitwise_equal("engram sorted", srt.cpu(), plain.cpu())


@requires_sm(8, 9)
def test_matches_upstream_fp8_kernel_bitwise() -> None:
    mod = pytest.importorskip("vllm.models.deepseek_v41.common.engram")
    from deepinfer_sm80.bindings import original

    upstream = original(mod.__name__, "_engram_lookup_kernel") or mod._engram_lookup_kernel
    assert not isinstance(upstream, eg.EngramLookupKernel)
    weight, scales = tables("engram-gpu", 64, "cuda")
    ids = torch.randint(0, 90, (33, 6), generator=generator("engram-gpu-ids")).cuda()
    outs = []
    for kernel in (upstream, eg.EngramLookupKernel(upstream)):
        out = torch.empty((33 * 3, DIM), dtype=torch.bfloat16, device="cuda")
        kernel[(4,)](
            weight,
            scales,
            ids,
            ids,
            out,
            8,
            72,
            99,
            ids.stride(0),
            ids.stride(1),
            HEAD_START=3,
            LOCAL_HEADS=3,
            TOTAL_HEADS=6,
            DIM=DIM,
            QUANT_BLOCK=QB,
            BLOCK_R=16,
            GRID=4,
            SORTED=False,
            PACKED=False,
            OUT_STRIDE=out.stride(0),
        )
        outs.append(out)
    torch.cuda.synchronize()
    assert_bitwise_equal("engram vs upstream", outs[1], outs[0])
