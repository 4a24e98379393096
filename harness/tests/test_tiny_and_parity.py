import json

from safetensors.numpy import load_file
from tokenizers import Tokenizer

from deepinfer_harness.parity import certificate
from deepinfer_harness.prompts import CANARY, TokenCorpus
from deepinfer_harness.tiny_model import TinyConfig, build_tiny_model


def test_tiny_model_is_consistent_and_idempotent(tmp_path):
    out = build_tiny_model(tmp_path / "tiny")
    cfg = json.loads((out / "config.json").read_text())
    weights = load_file(str(out / "model.safetensors"))
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    t = TinyConfig()
    assert cfg["vocab_size"] == t.vocab_size >= tok.get_vocab_size()
    assert weights["model.embed_tokens.weight"].shape == (t.vocab_size, t.hidden_size)
    assert weights["model.layers.1.self_attn.q_proj.weight"].shape == (
        t.num_attention_heads * t.head_dim,
        t.hidden_size,
    )
    assert tok.decode(tok.encode(CANARY).ids) == CANARY
    assert cfg["eos_token_id"] == tok.token_to_id("</s>")
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    build_tiny_model(out)
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp


def test_prompts_are_windows_and_round_trip(tmp_path):
    corpus = TokenCorpus(
        ids=list(range(100)), canary_ids=[1, 2], text_sha256="t", workload="code", source="s"
    )
    assert corpus.prompt(25, 0) == list(range(25)) and corpus.prompt(25, 1) == list(range(25, 50))
    assert corpus.prompt(64, 3) != corpus.prompt(64, 4)
    corpus.save(tmp_path / "c.json")
    assert TokenCorpus.load(tmp_path / "c.json") == corpus


def session(variant, rep, **kw):
    base = {
        "variant": variant,
        "rep": rep,
        "vllm_version": "0.32.0",
        "served_model": "m",
        "serve_args": ["--model", "m", "--port", "8000"],
        "server_info_sha256": "h",
        "env": {"VLLM_X": "1"},
        "gpus": [{"name": "A100", "driver_version": "595"}],
        "patches_sha256": "p0",
        "image_digest": "d0",
    }
    return base | kw


def test_parity_certificate():
    same = {
        "0": session("A", 0),
        "1": session(
            "B", 0, serve_args=["--model", "m", "--port", "8001"], patches_sha256="p1", image_digest="d1"
        ),
    }
    assert certificate(same, set())["status"] == "ok"  # port, patches, image may differ
    env = {"0": session("A", 0), "1": session("B", 0, env={"VLLM_X": "2"})}
    cert = certificate(env, set())
    assert cert["status"] == "fail" and "VLLM_X" in cert["diffs"][0]
    assert certificate(env, {"VLLM_X"})["status"] == "ok"  # a declared per-arm setting
    gpu = {"0": session("A", 0), "1": session("B", 0, gpus=[{"name": "A800", "driver_version": "595"}])}
    assert certificate(gpu, set())["status"] == "fail"
    assert certificate({"0": session("A", 0)}, set())["status"] == "incomplete"


def test_server_config_hash_ignores_per_start_noise_and_names_what_differs():
    from deepinfer_harness.run.provenance import field_hashes, scrub

    one = {"instance_id": 1, "model_config": {"hf": "<Cfg object at 0x7f00aa>", "seed": 0}, "x": 1}
    two = {"instance_id": 2, "model_config": {"hf": "<Cfg object at 0x7f11bb>", "seed": 0}, "x": 1}
    assert scrub(one) == scrub(two)  # instance id and object addresses differ on every start
    three = {"model_config": {"hf": "<Cfg object at 0x1>", "seed": 7}, "x": 1}
    fa, fb = field_hashes(scrub(one)), field_hashes(scrub(three))
    assert sorted(k for k in fa if fa[k] != fb.get(k)) == ["model_config.seed"]
    sessions = {
        "0": session("A", 0, server_info_fields=fa),
        "1": session("B", 0, server_info_sha256="other", server_info_fields=fb),
    }
    cert = certificate(sessions, set())
    assert cert["status"] == "fail" and "(fields model_config.seed)" in cert["diffs"][0]
