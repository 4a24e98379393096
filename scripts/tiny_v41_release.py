"""A tiny-dimension DeepSeek-V4.1 checkpoint with the release's own 40-layer structure (issue 37, item 4).

    python scripts/tiny_v41_release.py --out .cache/tiny-v41-release [--seed 0] [--json] [--no-drafter]

`make_tiny_v41.py` packs every layer kind into 6 layers; this one keeps V4.1-Flash's layer pattern as
its config.json states it (`integration/pp/topology.py` `v41_flash_fields()` holds the same facts):

| layers | kind |
|---|---|
| 0, 1 | sliding-window only (ratio 0); Engram at 1 |
| 2-19 | ratio 2; 2, 8, 14 kv + index sources (each followed by its 5 consumers); Engram at 14 |
| 20-39 | ratio 1; 20 kv + index + candidate source; 24, 28, 32, 36 index sources on 20's indexer K |
| mtp.0-2 | DSpark stages (ratio 0), main_proj over aux layers 37, 38, 39 |

What the kernels fix stays the release's: head_dim 512 (448 NoPE + 64 RoPE, the 584-byte fp8_ds_mla
record), indexer 32 heads x 128, top-k 512, window 128, candidate 2048 blocks of 8, hc_mult 4, 16 heads in
2 o-groups (the per-rank shape of TP4, as in make_tiny_v41). Reduced so that a 40-layer engine runs on a
2-core CPU under the Triton interpreter (RELEASE_DIMS): hidden 512, q_lora 256, o_lora 256; experts,
their intermediate size, the vocabulary (1024, the harness's BPE) and Engram's tables as in
make_tiny_v41. Names and formats are make_tiny_v41's (its inventory and writers are reused): FP8 e4m3 with
32 x 32 UE8M0 blocks, MXFP4 experts, one shard plus the index.

Seeded and digest-checked like make_tiny_v41: the same command writes the same bytes, and running it again
is a no-op (the stamp tiny_v41.json holds the recipe digest, which covers this module's config and
inventory and make_tiny_v41's RECIPE_VERSION).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_v41 as mk  # scripts/ is not a package: its writers, by path

RELEASE_VERSION = 2  # 2: the DSpark drafter distilled from this target (tiny_v41_drafter.py)
RELEASE_LAYERS = 40
# V4.1-Flash's structure (config.json of the release; DSpark's aux layers are its last three layers)
RELEASE_STRUCTURE: dict[str, Any] = {
    "num_hidden_layers": RELEASE_LAYERS,
    "num_nextn_predict_layers": 3,
    "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0] * 3,
    "kv_source_layer_ids": [2, 8, 14, 20],
    "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
    "candidate_source_layer_id": 20,
    "engram_layer_ids": [1, 14],
    "dspark_target_layer_ids": [37, 38, 39],
}
# The reduced dimensions (the module docstring says why each is where it is)
RELEASE_DIMS: dict[str, Any] = {
    "hidden_size": 512,
    "q_lora_rank": 256,
    "o_lora_rank": 256,
}


def release_text_config() -> dict[str, Any]:
    """make_tiny_v41's text config with the release's layer structure and the reduced dimensions."""
    t = mk.text_config()
    t.update(json.loads(json.dumps(RELEASE_STRUCTURE)))  # a deep copy: callers may edit theirs
    t.update(RELEASE_DIMS)
    t["engram_num_embeddings"] = [sum(p) for p in mk.engram_primes(t)]
    return t


def recipe_digest(seed: int, drafter: bool = True) -> str:
    t = release_text_config()
    recipe = {
        "version": [mk.RECIPE_VERSION, RELEASE_VERSION],
        "seed": seed,
        **({} if drafter else {"drafter": False}),  # the default recipe distils the drafter
        "config": mk.hf_config(0, 1, text=t),
        "tensors": list(mk.inventory(t)),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def build(out: Path, seed: int = 0, drafter: bool = True) -> dict[str, Any]:
    """Write the checkpoint into `out` (a no-op when its stamp holds this recipe's digest); its manifest.
    `drafter=False` leaves the Markov head random (the distillation is 40-layer forwards of the oracle,
    minutes of CPU: the build's own test skips it; tiny_v41_drafter's tests prove it on make_tiny_v41)."""
    from safetensors.torch import save_file

    stamp = out / "tiny_v41.json"
    digest = recipe_digest(seed, drafter)
    if stamp.exists():
        manifest = json.loads(stamp.read_text())
        if manifest.get("recipe") == digest and (out / manifest["shard"]).exists():
            return manifest
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    bos, eos = mk._tokenizer(out)
    t = release_text_config()
    t["engram_compressed_vocab_size"] = mk.compressed_vocab_size(out)
    t["engram_pad_token_id"] = eos
    (out / "config.json").write_text(json.dumps(mk.hf_config(bos, eos, text=t), indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": bos, "eos_token_id": eos}))
    shard = "model-00001-of-00001.safetensors"
    data = dict(mk.tensors(t, seed))
    save_file(data, str(out / shard), metadata={"format": "pt"})
    total = sum(v.numel() * v.element_size() for v in data.values())  # type: ignore[attr-defined]
    index = {"metadata": {"total_size": total}, "weight_map": {k: shard for k in sorted(data)}}
    del data
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    # the DSpark Markov head distilled from this target, as make_tiny_v41 does for its own
    fitted = mk.tiny_v41_drafter.install(out, shard, seed) if drafter else None
    manifest = {"recipe": digest, "seed": seed, "structure": "v4.1-flash-40", "shard": shard,
                "tensors": len(index["weight_map"]), "bytes": total, "drafter": fitted}  # fmt: skip
    manifest["build_s"] = round(time.perf_counter() - t0, 1)
    stamp.write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--out", default=".cache/tiny-v41-release", help="output directory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the manifest as JSON")
    ap.add_argument("--no-drafter", action="store_true", help="leave the DSpark Markov head random (tests)")
    args = ap.parse_args(argv)
    try:
        manifest = build(Path(args.out), args.seed, drafter=not args.no_drafter)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    mk.print_manifest(args.out, manifest, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
