"""Engram across pipeline stages and the KV-layout agreement (issue 37, docs/PIPELINE.md).

Engram layers hash the step's token ids, which model runner V2 gives only the first stage: the plan ships
them (`pp_ids_0`) to every later stage that holds an Engram layer, and an Engram layer that opens a stage
gets its injection at the entry (row `pp_engram_entry`). A stage without an indexer-K cache reports more
KV-cache layouts than the others; the workers' lists are agreed before upstream resolves one (row
`pp_kv_layout`). The engine proof is `make e2e-cpu` (cuts 1,5 and 1,1,4 in CI; every PP2/PP3 cut in the
evidence plan); these tests pin the arithmetic and the wrappers on their own.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from deepinfer_sm80.integration.pp import payload
from deepinfer_sm80.integration.pp import plan as P
from deepinfer_sm80.integration.pp.engram_entry import wrap_decoder_forward
from deepinfer_sm80.integration.pp.kv_layout import LayoutDisagreement, agree, wrap_resolve_kv_cache_layout
from deepinfer_sm80.integration.pp.topology import Topology, v41_flash_fields

TOPO = Topology.from_config(v41_flash_fields())


def keys(items: tuple[P.Item, ...]) -> set[str]:
    return {i.key for i in items}


def test_release_engram_layers_are_read_from_the_config() -> None:
    assert TOPO.engram_layers == (1, 14)
    assert TOPO.step_inputs(14) == [("ids", 0)] and TOPO.step_inputs(15) == []
    assert TOPO.per_token_wire_bytes("ids") == 4  # model runner V2's int32 input_ids


@pytest.mark.parametrize(
    ("partition", "ids_on"),
    [
        ((14, 14, 12), {1}),  # layer 14 opens stage 1
        ((13, 14, 13), {1}),  # layer 14 inside stage 1
        ((20, 20), set()),  # both Engram layers on stage 0: nothing new crosses
        ((1, 39), {1}),  # layer 1 opens stage 1; stage 1 also holds 14
        ((1, 13, 26), {1, 2}),  # 14 opens stage 2 and stage 1 holds 1: ids reach both
        ((5, 5, 5, 5, 5, 5, 5, 5), {2}),  # PP8 5x8: 14 on stage 2, relayed by stage 1
    ],
)
def test_every_stage_holding_an_engram_layer_gets_the_ids(
    partition: tuple[int, ...], ids_on: set[int]
) -> None:
    plan = P.build_plan(TOPO, partition)
    got = {s.rank for s in plan.stages if "pp_ids_0" in keys(s.needs)}
    assert got == ids_on
    for s in plan.stages:  # relayed by every stage between stage 0 and the last that needs them
        last = max(ids_on, default=-1)
        assert ("pp_ids_0" in keys(s.sends)) == (s.rank < last)
        assert ("pp_ids_0" in keys(s.receives)) == (0 < s.rank <= last)
    assert plan.crosses == bool(ids_on) or plan.needs_replication


def test_ids_are_not_replication() -> None:
    """1,39 shares no KV across the cut (layer 1 is SWA-only) but Engram's ids cross: the plan still runs
    the payload (crosses) while a replication-off deployment is not refused for it."""
    plan = P.build_plan(TOPO, (2, 38), replication=False)
    assert not plan.needs_replication and plan.crosses
    assert keys(plan.stages[1].needs) == {"pp_ids_0"}
    assert 2 in P.legal_cuts(TOPO)  # ids never make a cut illegal


def test_ids_row_round_trips_through_the_payload() -> None:
    """Stage 0 packs its input ids as int32 rows; the receiver reads them back as input_ids (a view)."""
    tiny = Topology.from_config(v41_flash_fields() | {"num_hidden_layers": 40})
    plan = P.build_plan(tiny, (1, 1, 38))
    ids = torch.tensor([7, 1000, 129279, 3], dtype=torch.int32)
    state = payload.StageState(cache=lambda i: torch.empty(0), slots=lambda i: torch.empty(0), ids=ids)
    sent = payload.pack(plan, 0, 4, state)
    assert sent["pp_ids_0"].dtype == torch.int32 and sent["pp_ids_0"].shape == (4, 1)
    buf = payload.empty_payload(plan, 1, 8, "cpu")
    buf["pp_ids_0"][:4].copy_(sent["pp_ids_0"])
    got = payload.received_ids(plan, 1, 4, buf)
    assert got is not None and torch.equal(got, ids)
    assert got.data_ptr() == buf["pp_ids_0"].data_ptr()  # a view of the receive buffer (graphs read it)
    bare = payload.StageState(lambda i: torch.empty(0), lambda i: torch.empty(0))
    relayed = payload.pack(plan, 1, 4, bare, buf)
    assert torch.equal(relayed["pp_ids_0"], sent["pp_ids_0"])
    assert payload.received_ids(plan, 0, 4, {}) is None  # the first stage needs none
    with pytest.raises(ValueError, match="token ids"):
        payload.pack(plan, 0, 4, bare)


class _Engram:
    layer_hash_index = 1

    def __call__(self, x: torch.Tensor, hashes: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return x + hashes[:, None, None].to(x.dtype)  # [T, hc, H] + per-token hash


class _Layer:
    def __init__(self, engram: bool) -> None:
        self.engram = _Engram() if engram else None


def _upstream(self: _Layer, x: torch.Tensor, positions, input_ids, pre_mix, post_mix, res_mix, residual,
              engram_hashes, engram_mask, **kw):  # fmt: skip
    return x, residual, kw


@pytest.mark.parametrize("engram", [False, True])
@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("carried", [False, True])
def test_engram_is_injected_at_a_stage_entry_only(engram: bool, dims: int, carried: bool) -> None:
    """Injected exactly when a 3-D stream enters with no residual at an Engram layer with hashes; every
    other call reaches upstream with its arguments untouched."""
    forward = wrap_decoder_forward(_upstream)
    x = torch.zeros((3, 4, 8) if dims == 3 else (3, 8))
    residual = torch.ones(3, 4, 8) if carried else None
    hashes = torch.tensor([[0, 5], [0, 6], [0, 7]])
    out, res, kw = forward(_Layer(engram), x, None, None, None, None, None, residual, hashes, None,
                           capture_previous_aux=True)  # fmt: skip
    injected = engram and dims == 3 and not carried
    want = x + torch.tensor([5.0, 6.0, 7.0])[:, None, None] if injected else x
    assert torch.equal(out, want) and res is residual and kw == {"capture_previous_aux": True}
    out, *_ = forward(_Layer(engram), x, None, None, residual=residual, engram_hashes=None)
    assert torch.equal(out, x)  # no hashes (profile run): upstream's call as it came


ORDER = ["LBNHC", "LBHNC", "BLNHC", "BLHNC", "BHLNC", "LHBNC"]


def test_layouts_agree_on_what_every_stage_supports() -> None:
    indexer_stage = ["BLHNC", "BLNHC"]
    plain_stage = ["LBNHC", "LBHNC", "BLNHC", "BLHNC"]
    assert agree([indexer_stage, plain_stage, indexer_stage], ORDER) == ["BLHNC", "BLNHC"]
    assert agree([plain_stage, plain_stage], ORDER) == plain_stage
    assert agree([["BLNHC", "BLHNC"], ["BLHNC", "BLNHC"]], ORDER) == ["BLNHC", "BLHNC"]  # tie: enum order
    with pytest.raises(LayoutDisagreement, match="worker 0: LBNHC; worker 1: BLHNC"):
        agree([["LBNHC"], ["BLHNC"]], ORDER)


def test_layout_wrapper_hands_upstream_one_agreed_list() -> None:
    seen: list[list[list[str]]] = []

    def upstream(cfg: object, supported: list[list[str]], specs: object = None) -> str:
        seen.append(supported)
        return "resolved"

    resolve = wrap_resolve_kv_cache_layout(upstream)
    same = [["BLHNC", "BLNHC"], ["BLHNC", "BLNHC"]]
    assert resolve(None, same, ()) == "resolved" and seen[-1] is same  # agreeing workers: untouched
    pytest.importorskip("vllm.v1.attention.backends.utils")
    resolve(None, [["BLHNC", "BLNHC"], ["LBNHC", "LBHNC", "BLNHC", "BLHNC"]], ())
    assert seen[-1] == [["BLHNC", "BLNHC"], ["BLHNC", "BLNHC"]]


def test_every_cut_lists_each_pp2_and_pp3_partition_once() -> None:
    from deepinfer_sm80.testing.e2e.engines import every_cut

    cuts = every_cut(6)
    assert len(cuts) == len(set(cuts)) == 5 + 10  # C(5,1) + C(5,2)
    for p in cuts:
        sizes = [int(x) for x in p.split(",")]
        assert sum(sizes) == 6 and min(sizes) >= 1 and len(sizes) in (2, 3)
    want = {
        ",".join(map(str, c)) for n in (2, 3) for c in itertools.product(range(1, 6), repeat=n) if sum(c) == 6
    }
    assert set(cuts) == want


def test_stage_rows_require_each_row_on_the_stage_holding_its_layer() -> None:
    """The tiny checkpoint: kv sources 1 and 3, Engram 1 and 2. At 1,5 stage 0 (layer 0, SWA only) owns
    no cache and no Engram layer; stage 1 must look Engram up itself, wherever else it is called."""
    from deepinfer_sm80.testing.e2e.engines import stage_rows

    tiny = Topology.from_config(
        {
            "num_hidden_layers": 6, "compress_ratios": [0, 2, 2, 1, 1, 1], "kv_source_layer_ids": [1, 3],
            "index_source_layer_ids": [1, 3, 5], "candidate_source_layer_id": 3, "candidate_topk_blocks": 4,
            "index_topk": 16, "hidden_size": 64, "engram_layer_ids": [1, 2],
        }
    )  # fmt: skip
    rows = {rank: set(r) for rank, _, r in stage_rows(tiny, "1,5", engram=True)}
    assert "engram_lookup" not in rows[0] and "compress_insert" not in rows[0]
    assert {"engram_lookup", "compress_insert", "indexer_k_store", "pp_forward"} <= rows[1]
    rows = {rank: set(r) for rank, _, r in stage_rows(tiny, "2,1,3", engram=True)}
    assert "engram_lookup" in rows[1] and "compress_insert" not in rows[1]  # layer 2 reads 1's cache
    assert "engram_lookup" not in rows[2] and "compress_insert" in rows[2]


def test_a_stage_that_skips_its_engram_layer_fails_even_if_another_stage_looks_it_up() -> None:
    """The failure the issue found: row counts merged over stages hid a stage that never looked Engram up."""
    from deepinfer_sm80.testing.e2e.engines import pp_engine
    from deepinfer_sm80.testing.e2e.runner import stage_targets

    tiny = Topology.from_config(
        {
            "num_hidden_layers": 6, "compress_ratios": [0, 2, 2, 1, 1, 1], "kv_source_layer_ids": [1, 3],
            "index_source_layer_ids": [1, 3, 5], "candidate_source_layer_id": 3, "candidate_topk_blocks": 4,
            "index_topk": 16, "hidden_size": 64, "engram_layer_ids": [1, 2],
        }
    )  # fmt: skip
    engine = pp_engine("e", "2,4", True, [5, 6], [], "", ("optimized",))
    every = {"pp_forward": 4, "sparse_mla_prefill": 1, "sparse_mla_decode": 3}
    stage0 = every | {"compress_insert": 4, "indexer_k_store": 4, "engram_lookup": 8}  # layer 1
    stage1 = every | {"compress_insert": 4, "indexer_k_store": 4}  # holds Engram layer 2, never looked up
    out = {"stage_rows": {"0": stage0, "1": stage1}}
    missed = [t["name"] for t in stage_targets("optimized", engine, out, tiny) if not t["met"]]
    assert missed == ["e/optimized/stage1:layers2-5/row:engram_lookup"]
    out["stage_rows"]["1"]["engram_lookup"] = 4
    assert all(t["met"] for t in stage_targets("optimized", engine, out, tiny))


def _release_cuts() -> list[tuple[int, ...]]:
    """Every PP2 and PP3 cut of the release's 40 layers (39 + 741), and 400 PP4-PP8 cuts drawn with a fixed
    seed (the plan calls every one legal: replication serves any cut)."""
    import random

    n = TOPO.num_layers
    out = []
    for pp in (2, 3):
        for cuts in itertools.combinations(range(1, n), pp - 1):
            edges = (0, *cuts, n)
            out.append(tuple(edges[i + 1] - edges[i] for i in range(pp)))
    rng = random.Random(37)
    for _ in range(400):
        cuts = sorted(rng.sample(range(1, n), rng.randint(3, 7)))
        edges = (0, *cuts, n)
        out.append(tuple(edges[i + 1] - edges[i] for i in range(len(edges) - 1)))
    return out


def test_every_release_cut_gives_each_stage_what_its_layers_read() -> None:
    """Over every PP2 / PP3 cut of V4.1-Flash and a seeded sample of deeper ones, stated from the model's
    facts rather than the plan's loop: a layer reading another layer's compressed KV, indexer K, top-k or
    candidates on an earlier stage, and an Engram layer on any stage but the first, find that item in
    their stage's needs; whatever a stage needs it receives, and a stage receives exactly what the one
    before it sends (the relay never drops an item between the producer's stage and the reader's)."""
    engram = set(TOPO.engram_layers)
    assert engram == {1, 14}
    for partition in _release_cuts():
        plan = P.build_plan(TOPO, partition)
        stage_of = {layer: s.rank for s in plan.stages for layer in s.layers}
        for s in plan.stages:
            need = keys(s.needs)
            for layer in s.layers:
                src = TOPO.kv_source(layer)
                if src is not None and src != layer and stage_of[src] < s.rank:
                    assert f"pp_ckv_{src}" in need, (partition, layer)
                idx = TOPO.index_source(layer)
                if idx is not None and idx != layer and stage_of[idx] < s.rank:
                    assert f"pp_topk_{idx}" in need, (partition, layer)
                if layer in engram and s.rank > 0:
                    assert "pp_ids_0" in need, (partition, layer)
            assert need <= keys(s.receives), partition
            if s.rank:
                assert keys(s.receives) == keys(plan.stages[s.rank - 1].sends), partition
        assert not plan.stages[0].receives and not plan.stages[-1].sends
