"""Sparse MLA decode and prefill (base and optimized) vs the fp32 reference; split-1 direct vs reduce bitwise.

Tolerance: |out - ref| <= eps_bf16·max|K| + 2·eps_bf16·|ref|. The kernels round the softmax weights to
bf16 before the PV product (<= eps·Σp|v|), accumulate in another order and round the output once more;
the interpreter's fp32->bf16 cast truncates, so its roundings reach a full eps. GPU-only: CUDA-graph
replay == eager, and upstream 0.32.0's own decode/prefill (hardware fp8, sm_89+) on the same inputs.
Cases, builders, the argument list, the reference call and the contracts: testing/cases/sparse_mla.py.
"""

from __future__ import annotations

import pytest
import torch

from deepinfer_sm80.formats.fp8_ds_mla import token_views
from deepinfer_sm80.ops.sparse_mla import decode as dec
from deepinfer_sm80.ops.sparse_mla import prefill as pre
from deepinfer_sm80.ops.sparse_mla.reference import prefill_ref, slot_lists
from deepinfer_sm80.testing.cases.sparse_mla import (
    BS,
    DECODE_CASES,
    GRAPH_CASE,
    PREFETCH_TWIN,
    PREFILL_CASES,
    PREFILL_KV,
    PREFILL_VMAX,
    PREFILL_WHY,
    RECORD_EDGES_CASE,
    SCALE,
    SPLIT1_CASE,
    UPSTREAM_CASE,
    VARIANT_CASES,
    VARIANT_SPLITS,
    Case,
    DecodeInputs,
    build_prefill,
    case_args,
    check,
    decode_args,
    poisoned,
    reference,
)
from deepinfer_sm80.testing.cases.sparse_mla import build as build_on
from deepinfer_sm80.testing.compare import BF16_EPS, assert_bitwise_equal, assert_close
from deepinfer_sm80.testing.gates import requires_cuda, requires_sm, test_device
from deepinfer_sm80.testing.inputs import seed_note

DEV = test_device()
# scripts/h200_final.sh phase 2 runs this module under compute-sanitizer, in this order (time-boxed)
H200_SANITIZE_ORDER = 1
DECODE = {"base": dec.base_sparse_attn_decode, "optimized": dec.sparse_attn_decode}
PREFILL = {"base": pre.base_sparse_attn_prefill, "optimized": pre.sparse_attn_prefill}


def build(case: Case) -> DecodeInputs:
    return build_on(case, DEV)


def call(level: str, case: Case, inp: DecodeInputs, out: torch.Tensor, **knobs) -> int:
    if not knobs:
        pos, cs = (inp.positions, inp.cos_sin) if case.inv_rope else (None, None)
        return DECODE[level](*case_args(case, inp, out), inv_rope_positions=pos, inv_rope_cos_sin_cache=cs)
    # the test knobs go through decode_into, past the public signature
    sink = None if case.sink == "none" else inp.sink
    pos, cs = (inp.positions, inp.cos_sin) if case.inv_rope else (None, None)
    tq = inp.q.shape[0]
    main = dec._segment("swa", inp.swa_dense, inp.swa_lens, *_ragged(case, inp, "swa"), tq)
    extra = (
        None
        if case.swa_only
        else dec._segment("topk", inp.topk_dense, inp.topk_lens, *_ragged(case, inp, "topk"), tq)
    )
    kv = None if case.swa_only else inp.kv_cache
    dec.decode_into(inp.q, inp.swa_cache, main, kv, extra, sink, SCALE, out, pos, cs, level=level, **knobs)
    return 0


def _ragged(case: Case, inp: DecodeInputs, which: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    if not case.ragged:
        return None, None
    return (inp.swa_ragged, inp.swa_indptr) if which == "swa" else (inp.topk_ragged, inp.topk_indptr)


def first_valid(dense: torch.Tensor, lens: torch.Tensor, row: int, num_rows: int) -> int:
    """A slot that row `row` attends to and no other row lists."""
    entries = dense[row, : int(lens[row])]
    others = torch.cat([dense[:row], dense[row + 1 :]]).flatten()
    mine = entries[(entries >= 0) & (entries < num_rows) & ~torch.isin(entries, others)]
    return int(mine[0])


@pytest.mark.parametrize("level", DECODE)
@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: c.name)
def test_decode_vs_reference(level: str, case: Case) -> None:
    inp = build(case)
    out = poisoned(inp.q)
    if case.splits is not None:
        call(level, case, inp, out, splits=case.splits)
    else:
        rotated = call(level, case, inp, out)
        assert rotated == (inp.q.shape[0] if case.inv_rope else 0)
    check(f"{level} {case.name} ({seed_note(case.name)})", out, reference(case, inp))


def test_split1_direct_equals_reduce_bitwise() -> None:
    """One split: the optimized kernel's own epilogue and the reduce kernel see the same operands."""
    case = SPLIT1_CASE
    inp = build(case)
    direct, reduced = poisoned(inp.q), poisoned(inp.q)
    call("optimized", case, inp, direct, splits=1)
    call("optimized", case, inp, reduced, splits=1, force_reduce=True)
    assert_bitwise_equal(case.name, direct.cpu(), reduced.cpu())


@pytest.mark.parametrize("name", list(dec.VARIANTS))
@pytest.mark.parametrize("case", VARIANT_CASES, ids=lambda c: c.name)
def test_decode_variants(name: str, case: Case) -> None:
    inp = build(case)
    ref = reference(case, inp)
    for splits in VARIANT_SPLITS:
        out = poisoned(inp.q)
        call("optimized", case, inp, out, splits=splits, variant=dec.VARIANTS[name])
        check(f"{name} {case.name} S={splits} ({seed_note(case.name)})", out, ref)
        twin = PREFETCH_TWIN.get(name)
        if twin is not None:
            other = poisoned(inp.q)
            call("optimized", case, inp, other, splits=splits, variant=dec.VARIANTS[twin])
            label = f"{name} vs {twin} {case.name} S={splits}"
            if DEV == "cpu":
                assert_bitwise_equal(label, out.cpu(), other.cpu())
            else:
                check(label, out, other.cpu())


def test_variant_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dec.VARIANT_ENV, "prefetch-w8")
    assert dec.variant_from_env(1, 108) == dec.VARIANTS["prefetch-w8"]
    assert dec.variant_from_env(1000, 108) == dec.VARIANTS["prefetch-w8"]  # forced: every shape
    monkeypatch.delenv(dec.VARIANT_ENV)
    # auto: the small tile while Tq·head_blocks <= SMs / 4, the two-CTAs-a-SM tile past it
    assert dec.variant_from_env(27, 108) == dec.VARIANTS[dec.SMALL_TILE]
    assert dec.variant_from_env(28, 108) == dec.VARIANTS[dec.LARGE_TILE]
    assert dec.variant_from_env(21, 84) == dec.VARIANTS[dec.SMALL_TILE]
    assert dec.variant_from_env(22, 84) == dec.VARIANTS[dec.LARGE_TILE]
    monkeypatch.setenv(dec.VARIANT_ENV, "auto")
    assert dec.variant_from_env(33, 132) == dec.VARIANTS[dec.SMALL_TILE]
    monkeypatch.setenv(dec.VARIANT_ENV, "fastest")
    with pytest.raises(ValueError, match="DEEPINFER_SM80_SPARSE_MLA_DECODE='fastest'"):
        dec.variant_from_env()


def test_record_edges() -> None:
    """Slot 0 (where masked rows point) holds scale 255, NaN codes and inf/NaN RoPE and is never listed;
    a listed record has NaN codes and a 0 scale byte (-> zeros); a listed record with scale 255 spoils
    only its own query."""
    case = RECORD_EDGES_CASE
    inp = build(case)
    for cache in (inp.swa_cache, inp.kv_cache):
        data, scale = token_views(cache, BS)
        data[0, 0, :448] = 0x7F
        data[0, 0, 448:452] = torch.tensor([float("inf"), float("nan")], dtype=torch.bfloat16).view(
            torch.uint8
        )
        scale[0, 0, :7] = 255
    for dense in (inp.swa_dense, inp.topk_dense):
        dense[dense == 0] = 1
    used = first_valid(inp.topk_dense, inp.topk_lens, 0, inp.kv_cache.shape[0] * BS)
    data, scale = token_views(inp.kv_cache, BS)
    data[used // BS, used % BS, 0:64:3] = 0xFF  # NaN codes -> 0
    scale[used // BS, used % BS, 2] = 0  # group 2 -> 0
    bad = first_valid(inp.topk_dense, inp.topk_lens, 2, inp.kv_cache.shape[0] * BS)
    scale[bad // BS, bad % BS, 1] = 255
    ref = reference(case, inp)
    for level in DECODE:
        out = poisoned(inp.q)
        call(level, case, inp, out)
        check(f"{level} {case.name} clean queries", out[:2], ref[:2])
        # inf K: a head's denominator turns NaN (-> 0 by the l > 0 guard, as upstream) or its
        # accumulator does (0 x inf): either way the head cannot come out as a normal finite row
        hit = out[2].float().cpu()
        poisoned_heads = (~hit.isfinite()).any(dim=1) | (hit == 0).all(dim=1)
        assert poisoned_heads.all(), (
            f"{level}: a scale-255 record left heads {(~poisoned_heads).nonzero().tolist()}"
        )


@pytest.mark.parametrize("level", PREFILL)
@pytest.mark.parametrize("name,lens,heads,invalid,width", PREFILL_CASES, ids=[c[0] for c in PREFILL_CASES])
def test_prefill_vs_reference(
    level: str, name: str, lens: tuple[int, ...], heads: int, invalid: float, width: int
) -> None:
    inp = build_prefill(name, lens, heads, invalid, DEV)
    out = torch.full((len(lens), heads, width), float("nan"), dtype=torch.bfloat16, device=DEV)
    PREFILL[level](inp.q, inp.kv, inp.indices, inp.lens, SCALE, 512, 448, 64, inp.sink, out)
    slots = slot_lists(len(lens), inp.indices, inp.lens, None, None, PREFILL_KV)
    ref = prefill_ref(inp.q, inp.kv, slots, inp.sink, SCALE, width)
    assert_close(
        f"{level} {name} ({seed_note(name)})",
        out.cpu(),
        ref,
        abs=BF16_EPS * PREFILL_VMAX,
        rel_in_eps=2.0,
        why=PREFILL_WHY,
    )


@pytest.mark.parametrize("sms", [108, 82, 132])
def test_base_splits_follow_upstream(sms: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The base heuristic is upstream's `_decode_num_splits` (its own code, imported from vLLM 0.32.0),
    at the base kernel's rows per step."""
    up = pytest.importorskip("vllm.v1.attention.ops.rocm_aiter_mla_sparse")
    monkeypatch.setattr(up, "_decode_cu_count", lambda: sms)
    for tq in (1, 2, 3, 6, 13, 24, 48, 100, 200):
        for blocks in (1, 2, 4):
            for main, extra in ((128.0, 512.0), (128.0, 0.0), (37.5, 300.0)):
                ours = dec.base_num_splits(tq, blocks, main, extra, sms)
                theirs = up._decode_num_splits(tq, blocks, main, extra, dec.BASE_BLOCK_K)
                assert ours == theirs, (tq, blocks, main, extra, sms)


def test_optimized_splits_fill_the_gpu_then_go_direct() -> None:
    tiles = 640 // dec.BLOCK_N
    for sms in (108, 82, 132):
        slots = dec.CTAS_PER_SM * sms
        for tq in range(1, 400, 7):
            s = dec.num_splits(tq, 1, 640.0, sms)
            assert 1 <= s <= min(dec.MAX_SPLITS, tiles)
            if tq >= slots:
                assert s == 1, (tq, sms, s)  # the batch fills every slot: direct output, no reduce
        assert dec.num_splits(1, 1, 640.0, sms) > 1  # one query alone must be split


def test_bad_inputs_name_the_problem() -> None:
    case = DECODE_CASES[0]
    inp = build(case)
    bare = dict(ragged=False, sink=False)  # dense SWA rows only
    with pytest.raises(ValueError, match="dims"):
        dec.sparse_attn_decode(*decode_args(inp, poisoned(inp.q), **bare, dims=(576, 512, 64)))
    with pytest.raises(NotImplementedError, match="gfx950"):
        dec.sparse_attn_decode(*decode_args(inp, None, **bare), output_mxfp8=(inp.q, inp.q))
    with pytest.raises(ValueError, match="uint8"):
        args = decode_args(inp, poisoned(inp.q), **bare, dense_topk=True, kv_cache=inp.kv_cache.float())
        dec.sparse_attn_decode(*args)


# ----------------------------------------------------------------------------- GPU only
@requires_cuda
@pytest.mark.parametrize("level", DECODE)
def test_decode_cuda_graph_replay_equals_eager(level: str) -> None:
    case = GRAPH_CASE
    inp = build(case)
    eager, captured = poisoned(inp.q), poisoned(inp.q)
    call(level, case, inp, eager)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call(level, case, inp, captured)  # warm (JIT) outside capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            call(level, case, inp, captured)
    torch.cuda.current_stream().wait_stream(stream)
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(f"{level} graph replay", captured.cpu(), eager.cpu())


@requires_sm(8, 9)
@pytest.mark.parametrize("level", DECODE)
def test_decode_vs_upstream(level: str) -> None:
    """Upstream's CUDA path (single-pass kernel, hardware e4m3) on the same inputs, without inverse RoPE
    (upstream's CUDA kernel skips it); same tolerance as against the reference."""
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as up

    case = UPSTREAM_CASE
    inp = build(case)
    ours, theirs = poisoned(inp.q), poisoned(inp.q)
    call(level, case, inp, ours)
    up.rocm_sparse_attn_decode(*decode_args(inp, theirs))
    check(f"{level} vs upstream", ours, theirs.cpu())
