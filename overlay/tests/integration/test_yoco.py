"""Shared-KV ("YOCO") prefill metadata (integration/yoco.py) through the SM8x layer's own `_forward_prefill`.

What runs: the layer's prefill loop, upstream 0.32.0's `DeepseekSparseSWAMetadata` and its chunk planner,
upstream's `WorkspaceManager` (CPU device) with the `workspace_generation` row applied by the binding
hook, the combiner and the gather the optimized level binds (ours, under TRITON_INTERPRET=1). The sparse
prefill kernel is replaced by a recorder of what it was handed (indices, lens, the gathered compressed
rows): that is the metadata under test. Layers are built as in test_sm8x_attention (attributes set as
DeepseekV4Attention.__init__ sets them); an index source's indexer is modelled by writing the shared
top-k buffer before the source runs, as upstream's indexer does.
"""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
import torch

pytest.importorskip("vllm.models.deepseek_v41.attention")

from deepinfer_sm80 import bindings
from deepinfer_sm80.integration import yoco
from deepinfer_sm80.ops.kv_gather import dequantize_and_gather_k_cache as our_gather
from deepinfer_sm80.ops.topk_swa_combine import combine_topk_swa_indices as our_combine
from deepinfer_sm80.ops.topk_swa_combine import combine_topk_swa_indices_ref
from deepinfer_sm80.testing.compare import assert_bitwise_equal
from deepinfer_sm80.testing.gates import cpu_workspace_only
from deepinfer_sm80.testing.inputs import block_table, generator, page_pool

SWA_BS, C_BLOCK, WINDOW, TOPK, MAX_LEN, MAX_TOKENS = 32, 128, 128, 32, 512, 96
HEADS = 2


@dataclass
class Recorder:
    """Counts combiner and compressed-gather launches; keeps what each sparse prefill call was given."""

    builds: int = 0
    compressed_gathers: int = 0
    real_gather: bool = False  # the rows tests leave the workspace bytes alone (the gather is not theirs)
    # the op's reference (bitwise the kernel, tests/ops/test_topk_swa_combine.py) keeps the interpreter
    # out of most cases; test_rows_built_once_per_key[optimized] runs the Triton kernel
    combiner: Callable[..., Any] = combine_topk_swa_indices_ref
    calls: list[dict[str, torch.Tensor]] = field(default_factory=list)

    def combine(self, *args, **kwargs):
        self.builds += 1
        return self.combiner(*args, **kwargs)

    def gather(self, out, k_cache, seq_lens, gather_lens, block_table, block_size, offset, **kw):
        if gather_lens is None:  # the compressed region (offset 0, whole compressed sequences)
            self.compressed_gathers += 1
        if self.real_gather:
            our_gather(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset, **kw)

    def prefill(self, *, q, kv, indices, topk_length, **_):
        self.calls.append({"indices": indices.clone(), "lens": topk_length.clone(), "kv": kv.clone()})


@pytest.fixture
def harness(monkeypatch) -> Iterator[tuple[types.ModuleType, Recorder, object]]:
    """The SM8x layer module at the optimized level, forced capability 8.0, a real (CPU) workspace."""
    from vllm.v1.worker import workspace as wsmod

    from deepinfer_sm80.integration import attention as sa

    monkeypatch.setenv(bindings.ENV_FORCE_CAPABILITY, "80")
    monkeypatch.delenv(bindings.ENV_DISABLE, raising=False)
    monkeypatch.setitem(sys.modules, bindings.LEVEL_MARKER, types.SimpleNamespace(LEVEL="optimized"))
    # patch 00's hook on vllm/v1/worker/workspace.py, undone at teardown
    monkeypatch.setattr(wsmod.WorkspaceManager, "get_simultaneous", wsmod.WorkspaceManager.get_simultaneous)
    monkeypatch.setitem(vars(wsmod), bindings._ORIGINALS_KEY, {})
    assert bindings.rebind(vars(wsmod), wsmod.__name__) == {
        "workspace_generation": "deepinfer_sm80.integration.yoco:count_get_simultaneous"
    }
    monkeypatch.setattr(torch.accelerator, "empty_cache", lambda: None)  # no accelerator on CPU
    manager = wsmod.WorkspaceManager(torch.device("cpu"))
    rec = Recorder()
    monkeypatch.setattr(sa, "current_workspace_manager", lambda: manager)
    monkeypatch.setattr(sa, "combine_topk_swa_indices", rec.combine)
    monkeypatch.setattr(sa, "dequantize_and_gather_k_cache", rec.gather)
    monkeypatch.setattr(sa.sparse_ops, "rocm_sparse_attn_prefill", rec.prefill)
    yield sa, rec, manager


# ----------------------------------------------------------------------------- a batch and its layers
@dataclass
class Batch:
    dec_lens: list[int]  # context lengths of the decode requests (one query token each)
    pre: list[tuple[int, int]]  # (seq_len, query_len) of the prefill requests
    replay_start: list[int] | None = None  # per prefill request: first position its window may read

    @property
    def lens(self) -> list[int]:
        return self.dec_lens + [s for s, _ in self.pre]

    @property
    def positions(self) -> list[int]:
        pos = [n - 1 for n in self.dec_lens]
        for s, q in self.pre:
            pos += list(range(s - q, s))
        return pos


def swa_metadata(batch: Batch, swa_bt: torch.Tensor):
    """Upstream's dataclass, filled as its builder fills the fields the prefill path reads."""
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata

    nd = len(batch.dec_lens)
    qlens = [1] * nd + [q for _, q in batch.pre]
    qsl = torch.tensor([0, *torch.cumsum(torch.tensor(qlens), 0).tolist()], dtype=torch.int32)
    seq = torch.tensor([s for s, _ in batch.pre], dtype=torch.int32)
    ql = torch.tensor([q for _, q in batch.pre], dtype=torch.int32)
    # upstream's prefill-metadata kernel: q + min(max(prefix - replay_start, 0), window - 1)
    start = torch.tensor(batch.replay_start or [0] * len(batch.pre), dtype=torch.int32)
    gather = ql + torch.clamp(seq - ql - start, min=0).clamp(max=WINDOW - 1)
    t = len(batch.positions)
    return DeepseekSparseSWAMetadata(
        block_table=swa_bt,
        slot_mapping=torch.zeros(t, dtype=torch.int64),
        block_size=SWA_BS,
        seq_lens=torch.tensor(batch.lens, dtype=torch.int32),
        query_start_loc=qsl.clone(),
        query_start_loc_cpu=qsl,
        is_valid_token=torch.ones(t, dtype=torch.bool),
        num_decodes=nd,
        num_prefills=len(batch.pre),
        num_decode_tokens=nd,
        num_prefill_tokens=int(ql.sum()),
        prefill_seq_lens=seq.clone(),
        prefill_seq_lens_cpu=seq,
        prefill_gather_lens=gather,
        prefill_query_lens_cpu=ql,
        prefill_window_size=WINDOW,
        prefill_max_model_len=MAX_LEN,
        prefill_max_num_batched_tokens=MAX_TOKENS,
    )


@dataclass
class Model:
    """V4.1's sharing topology on a few layers: ratio-0 (0, 1, 40, 41), ratio-2 source 2 (2-4),
    ratio-1 kv + index source 20 (20-22) and index source 24 on kv source 20 (24, 25)."""

    sa: types.ModuleType
    batch: Batch
    topk: torch.Tensor  # the model-wide top-k buffer every layer holds
    layers: dict[int, object] = field(default_factory=dict)
    compressed: dict[int, torch.Tensor] = field(default_factory=dict)  # kv source -> pool
    cmeta: dict[int, object] = field(default_factory=dict)
    swa_bt: torch.Tensor | None = None

    RATIO: ClassVar[dict[int, int]] = {
        0: 0,
        1: 0,
        40: 0,
        41: 0,
        2: 2,
        3: 2,
        4: 2,
        20: 1,
        21: 1,
        22: 1,
        24: 1,
        25: 1,
    }
    INDEX_SOURCE: ClassVar[dict[int, int]] = {2: 2, 3: 2, 4: 2, 20: 20, 21: 20, 22: 20, 24: 24, 25: 24}
    KV_SOURCE: ClassVar[dict[int, int]] = {2: 2, 3: 2, 4: 2, 20: 20, 21: 20, 22: 20, 24: 20, 25: 20}


def build_model(sa, name: str, batch: Batch, topk: torch.Tensor | None = None) -> Model:
    """`topk`: the model-wide buffer to keep (a later step of the same model), else a new one."""
    gen = generator(name)
    lens = batch.lens
    swa_blocks = sum(-(-n // SWA_BS) for n in lens) + 2
    swa_bt = block_table(lens, swa_blocks, SWA_BS, gen)
    if topk is None:
        topk = torch.full((MAX_TOKENS, TOPK), -1, dtype=torch.int32)
    model = Model(sa, batch, topk, swa_bt=swa_bt)
    for src, ratio in ((2, 2), (20, 1)):
        states = C_BLOCK // ratio
        blocks = sum(math.ceil(math.ceil(n / ratio) / states) for n in lens) + 2
        model.compressed[src] = page_pool(blocks, states, gen, valid=True)
        bt = block_table([-(-n // ratio) for n in lens], blocks, states, gen)
        model.cmeta[src] = types.SimpleNamespace(block_table=bt, block_size=C_BLOCK)
    for lid, ratio in Model.RATIO.items():
        layer = sa.DeepinferSM8xAttention.__new__(sa.DeepinferSM8xAttention)
        torch.nn.Module.__init__(layer)
        layer.prefix, layer.layer_id = f"model.layers.{lid}.attn", lid
        layer.n_local_heads, layer.head_dim, layer.nope_head_dim, layer.rope_head_dim = HEADS, 512, 448, 64
        layer.scale, layer.attn_sink = 512**-0.5, torch.zeros(HEADS)
        layer.compress_ratio, layer.window_size = ratio, WINDOW
        layer.max_model_len, layer.max_num_batched_tokens = MAX_LEN, MAX_TOKENS
        layer.index_source_layer_id = Model.INDEX_SOURCE.get(lid)
        layer.is_index_source = Model.INDEX_SOURCE.get(lid) == lid
        kv_src = Model.KV_SOURCE.get(lid)
        layer.is_kv_source = kv_src == lid
        layer.compressed_cache_prefix = None if kv_src is None else f"model.layers.{kv_src}.attn"
        layer.topk_indices_buffer = model.topk
        layer.swa_cache_layer = types.SimpleNamespace(
            prefix=f"{layer.prefix}.swa_cache", kv_cache=page_pool(swa_blocks, SWA_BS, gen, valid=True)
        )
        model.layers[lid] = layer
    return model


def publish_topk(model: Model, source: int, salt: str) -> None:
    """The index source's indexer output: local compressed indices < (p + 1) // ratio, -1 padded."""
    gen = generator(f"topk-{source}-{salt}")
    ratio = Model.RATIO[source]
    model.topk.fill_(-1)
    for i, p in enumerate(model.batch.positions):
        avail = (p + 1) // ratio
        n = min(avail, TOPK)
        if n:
            model.topk[i, :n] = torch.randperm(avail, generator=gen)[:n].int()


def run_layer(model: Model, lid: int, swa, salt: str = "a") -> None:
    """One layer's prefill as forward_mqa calls it (decode rows first, prefill rows after)."""
    layer = model.layers[lid]
    if layer.is_index_source:
        publish_topk(model, lid, salt)
    kv_src = Model.KV_SOURCE.get(lid)
    compressed = None if kv_src is None else model.compressed[kv_src]
    cmeta = None if kv_src is None else model.cmeta[kv_src]
    t = len(model.batch.positions)
    q = torch.zeros(t, HEADS, 512, dtype=torch.bfloat16)
    nd = swa.num_decode_tokens
    layer._forward_prefill(q[nd:], compressed, torch.zeros_like(q)[nd:], cmeta, swa)


def rebuild(
    model: Model, lid: int, swa, combiner: Callable[..., Any]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Upstream's per-layer build for every chunk of `lid` (fresh outputs, poisoned first)."""
    layer = model.layers[lid]
    ratio = layer.compress_ratio
    top_k = 0 if ratio == 0 else TOPK
    plan = swa.get_prefill_chunk_plan(
        compress_ratio=ratio, prefill_chunk_size=layer.PREFILL_CHUNK_SIZE, has_compressed=ratio > 0
    )
    nd, n_dec = swa.num_decode_tokens, swa.num_decodes
    qsl_cpu = swa.query_start_loc_cpu
    base = qsl_cpu[n_dec]
    topk = model.topk[nd:][: swa.num_prefill_tokens]
    out = []
    for start, end, chunk_n, chunk_m in plan:
        q0, q1 = int(qsl_cpu[n_dec + start] - base), int(qsl_cpu[n_dec + end] - base)
        width = -(-(top_k + WINDOW) // 128) * 128
        poison = (
            torch.full((q1 - q0, width), -7, dtype=torch.int32),
            torch.full((q1 - q0,), -7, dtype=torch.int32),
        )
        out.append(
            combiner(
                topk[q0:q1], swa.query_start_loc[n_dec + start : n_dec + end + 1],
                swa.prefill_seq_lens[start:end], swa.prefill_gather_lens[start:end],
                WINDOW, ratio, top_k, chunk_m, chunk_n, out=poison,
            )
        )  # fmt: skip
    return out


def run_and_check(model: Model, rec: Recorder, order: list[int], swa, salt: str = "a") -> None:
    """Run `order`; each layer's sparse prefill must have been handed a per-layer rebuild's rows, bitwise."""
    for lid in order:
        first = len(rec.calls)
        run_layer(model, lid, swa, salt)
        want = rebuild(model, lid, swa, rec.combiner)
        got = rec.calls[first:]
        assert len(got) == len(want), f"layer {lid}: {len(got)} prefill calls for {len(want)} chunks"
        for c, (call, (idx, lens)) in enumerate(zip(got, want, strict=True)):
            assert_bitwise_equal(f"layer{lid}-chunk{c}-indices", call["indices"], idx)
            assert_bitwise_equal(f"layer{lid}-chunk{c}-lens", call["lens"], lens)


def n_chunks(model: Model, lid: int, swa) -> int:
    layer = model.layers[lid]
    r = layer.compress_ratio
    return len(swa.get_prefill_chunk_plan(r, layer.PREFILL_CHUNK_SIZE, has_compressed=r > 0))


MIXED = Batch(dec_lens=[5, 300], pre=[(40, 20), (7, 7), (200, 9)])
ORDER = [0, 1, 2, 3, 4, 20, 21, 22, 24, 25, 40, 41]
# keys: ratio 0 | index source 2 | index source 20 | index source 24 (ratio-0 layers 40/41 share layer 0's)
KEY_LAYERS = [0, 2, 20, 24]


# ----------------------------------------------------------------------------- rows
@cpu_workspace_only
@pytest.mark.parametrize("mode", ["optimized", "disabled", "base"])
def test_rows_built_once_per_key(harness, monkeypatch, mode: str) -> None:
    sa, rec, _ = harness
    if mode == "disabled":
        monkeypatch.setenv(bindings.ENV_DISABLE, "yoco_metadata")
    if mode == "base":
        monkeypatch.delitem(sys.modules, bindings.LEVEL_MARKER)
    if mode == "optimized":
        rec.combiner = our_combine  # the kernel the optimized level binds, under the interpreter
    model = build_model(sa, "yoco-once", MIXED)
    swa = swa_metadata(MIXED, model.swa_bt)
    run_and_check(model, rec, ORDER, swa)
    per_layer = sum(n_chunks(model, lid, swa) for lid in ORDER)
    per_key = sum(n_chunks(model, lid, swa) for lid in KEY_LAYERS)
    assert per_key < per_layer
    assert rec.builds == (per_key if mode == "optimized" else per_layer), mode


def test_multi_chunk_steps(harness, monkeypatch) -> None:
    sa, rec, _ = harness
    model = build_model(sa, "yoco-chunks", MIXED)
    for layer in model.layers.values():
        layer.PREFILL_CHUNK_SIZE = 1  # the planner's area bound: 2-3 chunks per layer here
    swa = swa_metadata(MIXED, model.swa_bt)
    assert min(n_chunks(model, lid, swa) for lid in KEY_LAYERS) >= 2
    run_and_check(model, rec, ORDER, swa)
    assert rec.builds == sum(n_chunks(model, lid, swa) for lid in KEY_LAYERS)


def test_steps_replay_and_source_rerun_invalidate(harness) -> None:
    """Mixed step, its decoder-replay batch, a prefill-only step, a step with equal values in new objects,
    and the index source running again on the same metadata: every layer is handed a rebuild's rows."""
    sa, rec, _ = harness
    model = build_model(sa, "yoco-steps", MIXED)
    main = swa_metadata(MIXED, model.swa_bt)
    run_and_check(model, rec, [0, 1, 2, 3, 4], main)
    assert rec.builds == n_chunks(model, 0, main) + n_chunks(model, 2, main)
    # decoder replay: layers 20.. run on a replay batch (own metadata object, window starts)
    replay = swa_metadata(Batch(MIXED.dec_lens, MIXED.pre, replay_start=[30, 0, 150]), model.swa_bt)
    assert not torch.equal(replay.prefill_gather_lens, main.prefill_gather_lens)
    before = rec.builds
    run_and_check(model, rec, [20, 21, 22, 24, 25, 40, 41], replay)
    # index sources 20, 24 and ratio 0 (the replay batch's own metadata)
    assert rec.builds - before == sum(n_chunks(model, lid, replay) for lid in (20, 24, 40))
    # next step: prefill only, other lengths
    step2 = Batch(dec_lens=[], pre=[(64, 64), (130, 2)])
    model2 = build_model(sa, "yoco-steps-2", step2, topk=model.topk)
    swa2 = swa_metadata(step2, model2.swa_bt)
    before = rec.builds
    run_and_check(model2, rec, ORDER, swa2)
    assert rec.builds - before == sum(n_chunks(model2, lid, swa2) for lid in KEY_LAYERS)
    # same values, new metadata object (a new step of the same shape): rebuilt, not trusted
    swa3 = swa_metadata(step2, model2.swa_bt)
    before = rec.builds
    run_and_check(model2, rec, [0, 1], swa3)
    assert rec.builds - before == n_chunks(model2, 0, swa3)
    # the source runs again on the same metadata with fresh top-k: its consumers see the new rows
    before = rec.builds
    run_and_check(model2, rec, [2, 3], swa2, salt="b")
    assert rec.builds - before == n_chunks(model2, 2, swa2)


def test_source_rerun_changes_rows(harness) -> None:
    """The invalidation test above can fail: fresh top-k gives other rows than the cached ones."""
    sa, rec, _ = harness
    model = build_model(sa, "yoco-rerun", MIXED)
    swa = swa_metadata(MIXED, model.swa_bt)
    run_and_check(model, rec, [2, 3], swa, salt="a")
    first = rec.calls[-1]["indices"]
    run_and_check(model, rec, [2, 3], swa, salt="b")
    assert not torch.equal(first, rec.calls[-1]["indices"])
    assert rec.builds == 2


def test_locked_workspace_falls_back_per_layer(harness, caplog) -> None:
    sa, rec, manager = harness
    manager.get_simultaneous(((8 << 20,), torch.uint8))  # scratch sized, as the profile run does
    manager.lock()  # but no dummy run reserved the rows: every layer builds its own, still correct
    yoco._warned.clear()
    model = build_model(sa, "yoco-locked", MIXED)
    swa = swa_metadata(MIXED, model.swa_bt)
    run_and_check(model, rec, [0, 1, 2, 3], swa)
    assert rec.builds == 4
    assert any("yoco_metadata off" in r.message for r in caplog.records)


def test_dummy_run_reserves_rows(harness) -> None:
    sa, rec, manager = harness
    model = build_model(sa, "yoco-reserve", MIXED)
    for lid in (0, 2):
        model.layers[lid]._reserve_workspace(torch.zeros(1, HEADS, 512, dtype=torch.bfloat16))
    manager.lock()
    swa = swa_metadata(MIXED, model.swa_bt)
    run_and_check(model, rec, [0, 1, 2, 3], swa)
    assert rec.builds == 2
    want = yoco.rows_bytes(MAX_TOKENS, 128) + yoco.rows_bytes(MAX_TOKENS, 256)
    held = [r for r in manager._persistent_resources[0].values() if isinstance(r, yoco.SharedRows)]
    assert sum(r.indices.numel() * 4 + r.lens.numel() * 4 for r in held) == want


# ----------------------------------------------------------------------------- compressed gather
def _eager(mode: str = "NONE"):
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import ForwardContext, override_forward_context

    ctx = ForwardContext(
        no_compile_layers={}, attn_metadata={}, slot_mapping={}, cudagraph_runtime_mode=CUDAGraphMode[mode]
    )
    return override_forward_context(ctx)


GATHER_ORDER = [20, 21, 22, 25]  # kv source 20 and three consumers (25 reads index source 24's top-k)


def _kv_rows(rec: Recorder, start: int) -> list[torch.Tensor]:
    return [c["kv"] for c in rec.calls[start:]]


@cpu_workspace_only
def test_gather_reused_only_without_other_workspace_users(harness, monkeypatch) -> None:
    sa, rec, manager = harness
    rec.real_gather = True
    one_chunk = Batch(dec_lens=[3], pre=[(72, 16), (40, 8)])
    model = build_model(sa, "yoco-gather", one_chunk)
    swa = swa_metadata(one_chunk, model.swa_bt)
    layers = [20, 21]
    with _eager():
        run_and_check(model, rec, layers, swa)
    assert rec.compressed_gathers == 1  # the source gathered, 21 read its rows
    reused = _kv_rows(rec, 0)
    # the same layers with the feature off: every layer gathers; the workspace rows read are the same
    monkeypatch.setenv(bindings.ENV_DISABLE, "yoco_metadata")
    start = len(rec.calls)
    with _eager():
        run_and_check(model, rec, layers, swa)
    assert rec.compressed_gathers == 3
    fresh = _kv_rows(rec, start)

    def same_compressed_rows(got: list[torch.Tensor], tag: str) -> None:
        for lid, a, b in zip(layers, got, fresh, strict=True):
            a3, b3 = a.view(2, -1, 512), b.view(2, -1, 512)  # [requests, chunk_M, 512]
            for r, s in enumerate(swa.prefill_seq_lens_cpu.tolist()):  # ratio 1: s compressed rows
                assert_bitwise_equal(f"{tag}-layer{lid}-req{r}", a3[r, :s], b3[r, :s])

    same_compressed_rows(reused, "gather-reused")
    monkeypatch.delenv(bindings.ENV_DISABLE)

    # an MoE between the layers takes the workspace (and writes all of it): no reuse, rows still right
    def moe() -> None:
        size = manager._workspace_size_bytes(manager._current_workspaces[0])
        (scratch,) = manager.get_simultaneous(((size,), torch.uint8))
        scratch.fill_(0xAB)

    before, start = rec.compressed_gathers, len(rec.calls)
    with _eager():
        for lid in layers:
            run_and_check(model, rec, [lid], swa)
            moe()
    assert rec.compressed_gathers - before == 2
    same_compressed_rows(_kv_rows(rec, start), "gather-after-moe")


@pytest.mark.parametrize("case", ["multi-chunk", "piecewise-graph", "no-forward-context", "row-unbound"])
def test_gather_not_reused(harness, monkeypatch, case: str) -> None:
    sa, rec, _ = harness
    from vllm.v1.worker import workspace as wsmod

    one_chunk = Batch(dec_lens=[], pre=[(72, 16), (40, 8)])
    model = build_model(sa, f"yoco-gather-{case}", one_chunk)
    if case == "row-unbound":  # DEEPINFER_SM80_DISABLE=workspace_generation: nothing counts hand-outs
        monkeypatch.setattr(
            wsmod.WorkspaceManager,
            "get_simultaneous",
            wsmod.WorkspaceManager.get_simultaneous.deepinfer_wraps,
        )
    swa = swa_metadata(one_chunk, model.swa_bt)
    if case == "multi-chunk":  # a smaller planner area: one request per chunk
        swa.prefill_max_model_len, swa.prefill_max_num_batched_tokens = 64, 16
        for layer in model.layers.values():
            layer.PREFILL_CHUNK_SIZE = 1
    chunks = n_chunks(model, 20, swa)
    assert chunks == (2 if case == "multi-chunk" else 1)
    if case == "no-forward-context":
        run_and_check(model, rec, [20, 21], swa)
    else:
        with _eager("PIECEWISE" if case == "piecewise-graph" else "NONE"):
            run_and_check(model, rec, [20, 21], swa)
    assert rec.compressed_gathers == 2 * chunks


def test_generation_counts_every_hand_out(harness) -> None:
    _, _, manager = harness
    g = yoco.generation()
    manager.get_simultaneous(((4,), torch.int32))
    manager.get_simultaneous(((4,), torch.int32), ((2,), torch.bfloat16))
    assert yoco.generation() == g + 2
    assert yoco.workspace_counted(manager)


def test_moe_takes_the_workspace_on_cuda():
    """docs/PATCH_01.md's reason the gather reuse never applies in V4.1 serving: on CUDA every MoE call
    of the modular kernel hands itself scratch through get_simultaneous (the CPU branch does not)."""
    import inspect

    from vllm.model_executor.layers.fused_moe import modular_kernel as mk

    source = inspect.getsource(mk)
    cpu_branch = source.index("if current_platform.is_cpu():")
    call = source.index("current_workspace_manager().get_simultaneous(", cpu_branch)
    assert call > cpu_branch
    assert "return workspace13, workspace2, fused_out, False" in source[cpu_branch:call]
