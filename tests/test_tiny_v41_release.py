"""The release-structured tiny checkpoint (scripts/tiny_v41_release.py): DeepSeek-V4.1-Flash's 40-layer
structure as `v41_flash_fields()` states it, make_tiny_v41's names and formats, a seeded recipe digest and
a rebuild that writes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tiny_v41_release as R

ROOT = Path(__file__).resolve().parent.parent


def test_structure_is_the_releases() -> None:
    from deepinfer_sm80.integration.pp.topology import Topology, v41_flash_fields

    t = R.release_text_config()
    release = v41_flash_fields()
    kernel_fixed = {"hidden_size"}  # the one field reduced here (the docstring's RELEASE_DIMS)
    for key, value in release.items():
        if key not in kernel_fixed:
            assert t[key] == value, key
    assert t["hidden_size"] == R.RELEASE_DIMS["hidden_size"] < release["hidden_size"]
    assert (t["head_dim"], t["qk_rope_head_dim"], t["index_head_dim"], t["hc_mult"]) == (512, 64, 128, 4)
    assert t["dspark_target_layer_ids"] == [37, 38, 39] and t["num_nextn_predict_layers"] == 3
    assert t["dspark_block_size"] == 5  # DSpark's default K, the reference deployments' width
    topo = Topology.from_config(t)
    assert topo.num_layers == 40
    assert [topo.kv_source(layer) for layer in (3, 7, 8, 13, 14, 19, 20, 39)] == [2, 2, 8, 8, 14, 14, 20, 20]
    assert [topo.index_source(layer) for layer in (21, 24, 27, 36, 39)] == [20, 24, 24, 36, 36]


def test_inventory_places_every_layer_kind() -> None:
    t = R.release_text_config()
    names = {n for n, _, _ in R.mk.inventory(t)}
    assert not any(n.startswith(("layers.0.attn.compressor", "layers.1.attn.compressor")) for n in names)
    for src in (2, 8, 14):  # ratio-2 owners: gated compressor, indexer keys
        assert {f"layers.{src}.attn.compressor.wgate.weight", f"layers.{src}.attn.indexer.wk.weight"} <= names
    assert "layers.20.attn.compressor.wgate.weight" not in names  # ratio 1: no gate
    assert "layers.20.attn.indexer.wk.weight" in names
    for idx in (24, 28, 32, 36):  # index sources reading 20's keys
        assert f"layers.{idx}.attn.indexer.wq_b" in names
        assert f"layers.{idx}.attn.indexer.wk.weight" not in names
    assert "layers.25.attn.indexer.wq_b" not in names and "layers.3.attn.indexer.wq_b" not in names
    engram = {n.split(".")[1] for n in names if ".engram." in n}
    assert engram == {"1", "14"}
    assert "layers.39.ffn.gate.weight" in names and "layers.40.ffn.gate.weight" not in names
    main_proj = dict((n, s) for n, _, s in R.mk.inventory(t))["mtp.0.main_proj"]
    assert main_proj == (t["hidden_size"], 3 * t["hidden_size"])  # over the aux layers 37, 38, 39


def test_recipe_is_seeded() -> None:
    assert R.recipe_digest(0) == R.recipe_digest(0) != R.recipe_digest(1)
    assert R.recipe_digest(0) != R.mk.recipe_digest(0)  # not the 6-layer checkpoint's recipe


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("tiny-v41-release")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "tiny_v41_release.py"), "--out", str(out), "--json",
         "--no-drafter"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads(proc.stdout.strip().splitlines()[-1])


def test_written_checkpoint(built: tuple[Path, dict]) -> None:
    import torch
    from safetensors import safe_open

    out, manifest = built
    assert manifest["recipe"] == R.recipe_digest(0, drafter=False) != R.recipe_digest(0)
    assert manifest["drafter"] is None  # the distillation itself: tests/test_tiny_v41_drafter*.py
    text = json.loads((out / "config.json").read_text())["text_config"]
    assert {k: text[k] for k in R.RELEASE_STRUCTURE} == R.RELEASE_STRUCTURE
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(index) == manifest["tensors"]
    with safe_open(str(out / manifest["shard"]), "pt") as f:
        w, s = f.get_tensor("layers.20.attn.wq_a.weight"), f.get_tensor("layers.20.attn.wq_a.scale")
        e = f.get_tensor("layers.39.ffn.experts.0.w1.weight")
        h, q = text["hidden_size"], text["q_lora_rank"]
        assert (w.dtype, tuple(w.shape)) == (torch.float8_e4m3fn, (q, h))
        assert (s.dtype, tuple(s.shape)) == (torch.float8_e8m0fnu, (q // 32, h // 32))
        assert (e.dtype, tuple(e.shape)) == (torch.int8, (text["moe_intermediate_size"], h // 2))
        # seeded: the bytes are the writer's for this name and seed
        g = R.mk._gen("layers.20.attn.wq_a", 0)
        codes, _ = R.mk.fp8_block_quantize(torch.randn(q, h, generator=g) * 0.02)
        assert torch.equal(codes.view(torch.uint8), w.view(torch.uint8))


def test_rebuild_is_a_noop(built: tuple[Path, dict]) -> None:
    out, manifest = built
    before = (out / manifest["shard"]).stat().st_mtime_ns
    assert R.build(out, drafter=False)["recipe"] == manifest["recipe"]
    assert (out / manifest["shard"]).stat().st_mtime_ns == before


def test_release_engines() -> None:
    from deepinfer_sm80.integration.pp.plan import build_plan
    from deepinfer_sm80.integration.pp.topology import Topology
    from deepinfer_sm80.testing.e2e.release import RELEASE_K, release_engines

    t = R.release_text_config()
    engines = {e.name: e for e in release_engines([2, 3, 4], ["pp_forward"])}
    assert set(engines) == {"release_main", "release_dspark", "release_pp3_14_14_12_dspark",
                            "release_pp3_13_14_13", "release_pp2_20_20", "release_pp8"}  # fmt: skip
    assert RELEASE_K == t["dspark_block_size"] == 5
    topo = Topology.from_config(t)
    for e in engines.values():
        spec = e.engine.get("speculative_config")
        assert spec is None or spec["num_speculative_tokens"] == RELEASE_K
        assert (e.spec_of if spec else e.same_as) in (None, "release_main")
        if e.partition:
            sizes = tuple(int(x) for x in e.partition.split(","))
            assert sum(sizes) == 40 and e.engine["pipeline_parallel_size"] == len(sizes)
            build_plan(topo, sizes)  # the plan calls the cut legal
    assert engines["release_pp3_14_14_12_dspark"].aux_of == "release_dspark"
    assert engines["release_pp8"].partition == "5,5,5,5,5,5,6,4"
    # the reference cut and both single stages also serve four requests in flight (twins case by case)
    for name in ("release_main", "release_dspark", "release_pp3_14_14_12_dspark"):
        assert [c.name for c in engines[name].cases] == ["short", "concurrent"], name
    from deepinfer_sm80.testing.e2e.runner import worker_cases

    cut = engines["release_pp3_14_14_12_dspark"]  # its concurrent case at the DeepInfer level only
    assert [c["name"] for c in worker_cases(cut, "base")] == ["short"]
    assert [c["name"] for c in worker_cases(cut, "optimized")] == ["short", "concurrent"]
    assert [c["name"] for c in worker_cases(engines["release_main"], "base")] == ["short", "concurrent"]
    # the runner's plan is this one for a checkpoint of the release's layer count, in either plan kind
    from deepinfer_sm80.testing.e2e import runner

    for kind in ("ci", "full"):
        planned = runner.plan(kind, engram=True, num_layers=t["num_hidden_layers"])
        assert [e.name for e in planned] == [e.name for e in release_engines(runner._prompt("short", 12), [])]
