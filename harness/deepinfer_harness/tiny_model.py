"""Build a tiny Llama-style checkpoint and tokenizer locally, with no downloads and no torch.

Weights are seeded random float32 tensors written with `safetensors.numpy`; the tokenizer is a
byte-level BPE trained on the bundled corpus with the `tokenizers` library. The result serves
with vLLM (CPU build) and exists only to exercise the harness end to end.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from deepinfer_harness.prompts import corpus_text

BOS, EOS = "<s>", "</s>"


@dataclass(frozen=True)
class TinyConfig:
    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 64  # the CPU attention backend accepts 32, 64, 80, … 512
    max_position_embeddings: int = 4096
    seed: int = 1234


def _hf_config(cfg: TinyConfig, bos_id: int, eos_id: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
        "dtype": "float32",
    }


def _weights(cfg: TinyConfig) -> dict:
    import numpy as np

    rng = np.random.default_rng(cfg.seed)
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q_out, kv_out = cfg.num_attention_heads * d, cfg.num_key_value_heads * d

    def w(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)

    tensors = {
        "model.embed_tokens.weight": w(cfg.vocab_size, h),
        "model.norm.weight": np.ones(h, np.float32),
        "lm_head.weight": w(cfg.vocab_size, h),
    }
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        tensors |= {
            p + "self_attn.q_proj.weight": w(q_out, h),
            p + "self_attn.k_proj.weight": w(kv_out, h),
            p + "self_attn.v_proj.weight": w(kv_out, h),
            p + "self_attn.o_proj.weight": w(h, q_out),
            p + "mlp.gate_proj.weight": w(i, h),
            p + "mlp.up_proj.weight": w(i, h),
            p + "mlp.down_proj.weight": w(h, i),
            p + "input_layernorm.weight": np.ones(h, np.float32),
            p + "post_attention_layernorm.weight": np.ones(h, np.float32),
        }
    return tensors


def _tokenizer(cfg: TinyConfig, out: Path) -> tuple[int, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([corpus_text()], trainer=trainer)
    assert tok.get_vocab_size() <= cfg.vocab_size, "tokenizer outgrew the embedding table"
    tok.save(str(out / "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "add_bos_token": False,
        "model_max_length": cfg.max_position_embeddings,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=1))
    (out / "special_tokens_map.json").write_text(json.dumps({"bos_token": BOS, "eos_token": EOS}))
    return tok.token_to_id(BOS), tok.token_to_id(EOS)


def build_tiny_model(out: Path, cfg: TinyConfig | None = None) -> Path:
    """Write config.json, model.safetensors and tokenizer files into `out` (idempotent)."""
    from safetensors.numpy import save_file

    cfg = cfg or TinyConfig()
    stamp = out / "tiny_config.json"
    if stamp.exists() and json.loads(stamp.read_text()) == asdict(cfg):
        return out
    out.mkdir(parents=True, exist_ok=True)
    bos_id, eos_id = _tokenizer(cfg, out)
    (out / "config.json").write_text(json.dumps(_hf_config(cfg, bos_id, eos_id), indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": bos_id, "eos_token_id": eos_id}))
    save_file(_weights(cfg), str(out / "model.safetensors"), metadata={"format": "pt"})
    stamp.write_text(json.dumps(asdict(cfg)))
    return out
