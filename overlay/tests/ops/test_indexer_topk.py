"""Optimized indexer (streamed logits + running top-k) vs the torch references of select.py.

Selections are compared as sets (and -1 counts) against `topk_ref` on fp64 logits; the inputs keep the
gap at the 512th score far above fp32 rounding, so the rows are tie-free. Small chunks and row blocks
force several chunks and row blocks per call, so the running merge is what is tested.
"""

from __future__ import annotations

import pytest
import torch

from deepinfer_sm80.formats.indexer_k import make_k_cache, state_views
from deepinfer_sm80.ops.indexer import logits as lg
from deepinfer_sm80.ops.indexer import select as sel
from deepinfer_sm80.ops.indexer import stream
from deepinfer_sm80.testing.cases import indexer as cases
from deepinfer_sm80.testing.gates import requires_cuda, test_device
from deepinfer_sm80.testing.inputs import generator, seed_note

DEV = test_device()
H, D, K = 32, 128, 512
TINY_WS = 1  # workspace_bytes=1: the smallest row block (4 rows prefill) and chunk (512 columns)


def codes(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    c = torch.randint(0, 256, shape, generator=gen, dtype=torch.int32)
    return torch.where((c & 0x7F) == 0x7F, c - 1, c).to(torch.uint8)


def prefill_inputs(name: str, m: int, n: int, spans: list[tuple[int, int]]):
    """Rows split evenly over requests; request i owns keys [spans[i][0], spans[i][1]), causal ends."""
    gen = generator(name)
    q8 = codes((m, H, D), gen)
    k8 = codes((n, D), gen)
    kscale = torch.exp2(torch.randint(-10, -6, (n,), generator=gen).float())
    w = torch.randn(m, H, generator=gen) * 2.0**-6
    per = -(-m // len(spans))
    ks = torch.tensor([spans[i // per][0] for i in range(m)], dtype=torch.int32)
    end = torch.tensor([spans[i // per][1] for i in range(m)], dtype=torch.int32)
    ke = (end - (per - 1 - torch.arange(m) % per) * 3).clamp_min(ks).to(torch.int32)
    return gen, q8, k8, kscale, w, ks, ke


def as_sets(idx: torch.Tensor) -> list[list[int]]:
    return [sorted(x for x in row.tolist() if x >= 0) for row in idx.cpu()]


def assert_same_sets(name: str, out: torch.Tensor, ref: torch.Tensor) -> None:
    o, r = as_sets(out), as_sets(ref)
    for i, (a, b) in enumerate(zip(o, r, strict=True)):
        assert a == b, f"{name}: row {i} differs ({len(set(a) ^ set(b))} columns) {seed_note(name)}"
    assert torch.equal((out.cpu() < 0).sum(1), (ref.cpu() < 0).sum(1)), f"{name}: -1 counts differ"


@pytest.fixture(params=["int64", "fp32"])
def select(request: pytest.FixtureRequest) -> str:
    """Both chunk-merge modes of the prefill path (stream.PREFILL_SELECT)."""
    return request.param


def run_prefill(q8, w, k8, kscale, ks, ke, **kw) -> torch.Tensor:
    out = torch.full((q8.shape[0], K), -7, dtype=torch.int32, device=DEV)  # poison
    stream.indexer_topk_prefill(
        q8.to(DEV),
        w.to(DEV),
        k8.to(DEV),
        kscale.to(DEV),
        ks.to(DEV),
        ke.to(DEV),
        out,
        workspace_bytes=TINY_WS,
        chunk_max=stream.SPAN,
        **kw,
    )
    return out


CASES = cases.TOPK_PREFILL


@pytest.mark.parametrize(("name", "m", "n", "spans"), CASES)
def test_prefill_topk_sets(name: str, m: int, n: int, spans: list[tuple[int, int]], select: str) -> None:
    _, q8, k8, kscale, w, ks, ke = prefill_inputs(name, m, n, spans)
    out = run_prefill(q8, w, k8, kscale, ks, ke, select=select)
    ref64 = lg.mqa_logits_ref(q8, w, k8, kscale)
    scores, valid = sel.local_view(ref64.float(), ks, ke)
    assert_same_sets(name, out, sel.topk_ref(scores, valid, K))
    # best first: the selected fp64 scores never increase along a row
    got = out.cpu()
    picked = torch.gather(scores, 1, got.clamp_min(0).long())
    tol = 1e-6 * float(picked[got >= 0].abs().max())
    pairs = (got[:, 1:] >= 0) & (got[:, :-1] >= 0)
    assert bool((picked[:, 1:] <= picked[:, :-1] + tol)[pairs].all()), seed_note(name)


def test_prefill_ties_lowest_index_and_nan(select: str) -> None:
    """All-equal keys (every score ties): the lowest 512 columns win. NaN scores rank first."""
    name = "tk-ties"
    gen = generator(name)
    m, n = 4, 1100
    q8 = codes((m, H, D), gen)
    k8 = codes((1, D), gen).expand(n, D).contiguous()
    kscale = torch.full((n,), 2.0**-8)
    kscale[[900, 1000]] = float("nan")  # an unwritten page's scale is NaN
    w = torch.randn(m, H, generator=gen) * 2.0**-6
    ks = torch.zeros(m, dtype=torch.int32)
    ke = torch.full((m,), n, dtype=torch.int32)
    out = run_prefill(q8, w, k8, kscale, ks, ke, select=select).cpu()
    for r in range(m):
        assert out[r, :2].tolist() == [900, 1000], f"NaN columns first, lowest first: {out[r, :4].tolist()}"
        assert out[r, 2:].tolist() == list(range(510)), "ties must resolve to the lowest columns, in order"


def test_prefill_candidate_write_matches_reference(select: str) -> None:
    """Layer 20: its block list (NaN-propagating max, newest block pinned) and its own top-k."""
    name = "tk-cand-write"
    _, q8, k8, kscale, w, ks, ke = prefill_inputs(name, 6, 1700, [(3, 1700)])
    cand = torch.full((6, 64), -5, dtype=torch.int32, device=DEV)
    out = run_prefill(q8, w, k8, kscale, ks, ke, candidate_blocks=cand, candidate_write=True, select=select)
    ref64 = lg.mqa_logits_ref(q8, w, k8, kscale).float()
    scores, valid = sel.local_view(ref64, ks, ke)
    assert_same_sets(name, out, sel.topk_ref(scores, valid, K))
    ref_cand = sel.select_candidate_blocks_ref(ref64, ks, ke, 64, 8)
    assert_same_sets(name + " blocks", cand, ref_cand)
    newest = ((ke - ks - 1) // 8).tolist()
    assert cand[:, 0].cpu().tolist() == newest, "the newest block is pinned to +inf, so it comes first"


def test_prefill_candidate_only_equals_masked_dense() -> None:
    """Layers 24..36: scoring only the listed blocks selects what masked dense logits would."""
    name = "tk-cand-only"
    gen, q8, k8, kscale, w, ks, ke = prefill_inputs(name, 6, 2000, [(0, 900), (900, 2000)])
    nb = 128  # listed blocks per row (a multiple of 64): 1024 columns, some -1, some past the row end
    cand = torch.stack([torch.randperm(137, generator=gen)[:nb] for _ in range(6)]).to(torch.int32)
    cand[:, ::9] = -1
    out = run_prefill(q8, w, k8, kscale, ks, ke, candidate_blocks=cand.to(DEV), candidate_write=False)
    ref64 = lg.mqa_logits_ref(q8, w, k8, kscale).float()
    scores, valid = sel.local_view(ref64, ks, ke)
    masked = valid & sel.candidate_valid_ref(ks, ke, cand, 8, scores.shape[1])
    assert int(masked.sum(1).min()) >= K, "each row must list >= 512 valid columns for the equality"
    assert_same_sets(name, out, sel.topk_ref(scores, masked, K))


def paged_inputs(name: str, batch: int, lens: list[int], block_size: int = 64, blocks: int = 40):
    gen = generator(name)
    cache = make_k_cache(blocks, block_size)
    c, s = state_views(cache)
    c.copy_(codes(tuple(c.shape), gen))
    s.copy_(torch.exp2(torch.randint(-10, -6, tuple(s.shape), generator=gen).float()))
    per = -(-max(lens) // block_size)
    bt = torch.stack([torch.randperm(blocks, generator=gen)[:per] for _ in range(batch)]).to(torch.int32)
    return gen, cache, c, s, bt


def cache_to_dev(cache: torch.Tensor) -> torch.Tensor:
    page = cache.stride(0)
    raw = cache.as_strided((cache.shape[0], page), (page, 1)).to(DEV)
    return raw.as_strided(tuple(cache.shape), tuple(cache.stride()))


def decode_ref(q8, w, c, s, bt, lens_rows, next_n):
    rows = q8.shape[0] * q8.shape[1]
    width = int(lens_rows.max())
    out = torch.full((rows, width), float("nan"))
    for r in range(rows):
        length = int(lens_rows[r])
        k8 = c[bt[r // next_n].long()].reshape(-1, D)[:length]
        ks = s[bt[r // next_n].long()].reshape(-1)[:length]
        out[r, :length] = lg.mqa_logits_ref(q8.reshape(-1, H, D)[r : r + 1], w[r : r + 1], k8, ks)[0].float()
    j = torch.arange(width)[None, :]
    return out, j < lens_rows[:, None]


@pytest.mark.parametrize(("name", "batch", "next_n", "lens"), cases.TOPK_DECODE)
@pytest.mark.parametrize("words", [False, True], ids=["byte-decode", "word-decode"])
def test_decode_topk_sets(
    name: str, batch: int, next_n: int, lens: list[int], words: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lg, "PAGED_WORD_DECODE", words)
    gen, cache, c, s, bt = paged_inputs(name, batch, lens)
    q8 = codes((batch, next_n, H, D), gen)
    w = torch.randn(batch * next_n, H, generator=gen) * 2.0**-6
    context = torch.tensor(lens, dtype=torch.int32)
    rows = batch * next_n
    ws = rows * stream.workspace_per_row(stream.SPAN, K, 0, 8)  # one 512-column chunk
    out = torch.full((rows, K), -7, dtype=torch.int32, device=DEV)
    stream.indexer_topk_decode(
        q8.to(DEV), w.to(DEV), cache_to_dev(cache), context.to(DEV), bt.to(DEV), 1536, out, workspace_bytes=ws
    )
    scores, valid = decode_ref(q8, w, c, s, bt, lg.row_lengths(context, batch, next_n), next_n)
    assert_same_sets(name, out, sel.topk_ref(scores, valid, K))


def test_decode_candidates_write_and_read() -> None:
    name = "dk-cand"
    gen, cache, c, s, bt = paged_inputs(name, 2, [1500, 900])
    q8 = codes((2, 1, H, D), gen)
    w = torch.randn(2, H, generator=gen) * 2.0**-6
    context = torch.tensor([1500, 900], dtype=torch.int32)
    scores, valid = decode_ref(q8, w, c, s, bt, context, 1)
    dev_cache = cache_to_dev(cache)
    cand = torch.full((2, 128), -5, dtype=torch.int32, device=DEV)
    out = torch.full((2, K), -7, dtype=torch.int32, device=DEV)
    ws = 2 * stream.workspace_per_row(stream.SPAN, K, 128, 8)
    stream.indexer_topk_decode(
        q8.to(DEV),
        w.to(DEV),
        dev_cache,
        context.to(DEV),
        bt.to(DEV),
        1536,
        out,
        candidate_blocks=cand,
        candidate_write=True,
        workspace_bytes=ws,
    )
    zeros = torch.zeros(2, dtype=torch.int32)
    full = torch.where(valid, scores, float("-inf"))
    assert_same_sets(name + " blocks", cand, sel.select_candidate_blocks_ref(full, zeros, context, 128, 8))
    out2 = torch.full((2, K), -7, dtype=torch.int32, device=DEV)
    stream.indexer_topk_decode(
        q8.to(DEV),
        w.to(DEV),
        dev_cache,
        context.to(DEV),
        bt.to(DEV),
        1536,
        out2,
        candidate_blocks=cand,
        candidate_write=False,
    )
    masked = valid & sel.candidate_valid_ref(zeros, context, cand.cpu(), 8, scores.shape[1])
    assert_same_sets(name + " candidate-only", out2, sel.topk_ref(scores, masked, K))


def test_workspace_bound_is_independent_of_context() -> None:
    for ctx in (1 << 16, 1 << 18, 1 << 20, 1 << 22):
        assert stream.decode_workspace_bytes(48, ctx, K) <= stream.WORKSPACE_BYTES
        for kb in (0, 2048):
            for per_row in (stream.prefill_row_bytes, stream.workspace_per_row):  # select fp32 / int64
                r, c = stream.plan(8192, ctx, K, kb, 8, stream.WORKSPACE_BYTES, per_row=per_row)
                assert r * per_row(c, K, kb, 8) <= stream.WORKSPACE_BYTES
        r, c = stream.plan(8192, 16384, K, 0, 8, stream.WORKSPACE_BYTES, 1, 16384)  # candidate-only
        assert r * stream.workspace_per_row(c, K, 0, 8) <= stream.WORKSPACE_BYTES


@requires_cuda
def test_decode_is_graph_capturable() -> None:
    name = "dk-graph"
    gen, cache, _c, _s, bt = paged_inputs(name, 2, [1200, 700])
    q8 = codes((2, 1, H, D), gen).cuda()
    w = (torch.randn(2, H, generator=gen) * 2.0**-6).cuda()
    context = torch.tensor([1200, 700], dtype=torch.int32, device="cuda")
    dev_cache, btd = cache_to_dev(cache), bt.cuda()
    eager = torch.empty((2, K), dtype=torch.int32, device="cuda")
    stream.indexer_topk_decode(q8, w, dev_cache, context, btd, 1536, eager)
    out = torch.full((2, K), -7, dtype=torch.int32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        stream.indexer_topk_decode(q8, w, dev_cache, context, btd, 1536, out)
        with torch.cuda.graph(graph, stream=side):
            stream.indexer_topk_decode(q8, w, dev_cache, context, btd, 1536, out)
    torch.cuda.current_stream().wait_stream(side)
    out.fill_(-7)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
