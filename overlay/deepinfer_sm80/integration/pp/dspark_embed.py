"""DSpark under pipeline parallelism: the drafter's input embedding on the last stage (`dspark_pp_embed`).

Upstream (v1/worker/gpu/spec_decode/eagle/utils.py L61-68) aliases the drafter's `embed_tokens` to the
target's; with PP > 1 the target's embedding exists on the first stage only (a PPMissingLayer on the
drafter's stage, the last), so it raises "needs the target input embedding, but it is unavailable on
this PP stage". The drafter already constructs its own `VocabParallelEmbedding` (nvidia/dspark.py
L96) and skips the checkpoint's non-`mtp.*` tensors; on that stage we keep it and fill it from the
checkpoint's target embedding (`embed.weight`) through the parameter's own weight loader, which
takes this TP rank's vocabulary shard.

Memory per rank on the last stage: vocab/TP × hidden × 2 B (bf16): V4.1 (129280 × 5120) 1,323,827,200
B at TP1, 661,913,600 B (631 MiB) at TP2, 330,956,800 B at TP4, 165,478,400 B at TP8. The module is
allocated by upstream's drafter in every case; what PP adds is that it is not freed in favour of the
target's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

LOG = logging.getLogger("deepinfer_sm80.pp")
# checkpoint names of the target's input embedding (official V4.1 first; the HF-style spellings after)
EMBED_NAMES = ("embed.weight", "model.embed_tokens.weight", "embed_tokens.weight")


def embedding_bytes_per_rank(vocab: int, hidden: int, tp: int, dtype_bytes: int = 2) -> int:
    """Bytes of one TP rank's shard of a VocabParallelEmbedding (vocab padded to 64 per shard set)."""
    padded = -(-vocab // 64) * 64
    return -(-padded // tp) * hidden * dtype_bytes


def _pp_world_size() -> int:
    from vllm.distributed.parallel_state import get_pp_group

    return get_pp_group().world_size


def _target_embedding_missing(target_inner: nn.Module) -> bool:
    from vllm.model_executor.models.utils import PPMissingLayer

    emb = getattr(target_inner, "embed_tokens", None) or getattr(target_inner, "embedding", None)
    return emb is None or isinstance(emb, PPMissingLayer)


WEIGHT_PATTERNS = ["*.safetensors", "*.safetensors.index.json"]


def checkpoint_dir(model: str | Path, download_dir: str | None = None, revision: str | None = None) -> Path:
    """The local directory of the checkpoint `model` names: the path itself, or for a hub id the snapshot
    vLLM's loader already fetched (upstream's `download_weights_from_hf`, which answers from the local
    cache when the files are there and honours HF_HUB_OFFLINE)."""
    if Path(model).is_dir():
        return Path(model)
    from vllm.model_executor.model_loader.weight_utils import download_weights_from_hf

    return Path(download_weights_from_hf(str(model), download_dir, WEIGHT_PATTERNS, revision=revision))


def find_embedding(model_dir: str | Path) -> tuple[Path, str]:
    """(safetensors file, tensor name) of the target embedding in a local checkpoint directory."""
    root = Path(model_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"DSpark on PP: checkpoint directory {root} does not exist")
    index = root / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        for name in EMBED_NAMES:
            if name in weight_map:
                return root / weight_map[name], name
    else:
        from safetensors import safe_open

        for f in sorted(root.glob("*.safetensors")):
            with safe_open(str(f), "pt") as h:
                for name in EMBED_NAMES:
                    if name in h.keys():  # safe_open handles have keys(), not __contains__
                        return f, name
    raise KeyError(f"no target embedding ({' / '.join(EMBED_NAMES)}) in {root}")


def load_target_embedding(embed: nn.Module, model_dir: str | Path) -> int:
    """Fill `embed.weight` (this rank's shard) from the checkpoint; returns the bytes it holds."""
    from safetensors import safe_open

    path, name = find_embedding(model_dir)
    with safe_open(str(path), "pt") as h:
        full = h.get_tensor(name)  # [vocab, hidden]
    param = embed.weight
    loader = getattr(param, "weight_loader", None)
    if loader is None:
        if param.shape != full.shape:
            raise ValueError(f"{name} is {tuple(full.shape)}, the drafter embedding {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(full)
    else:
        loader(param, full)
    return param.numel() * param.element_size()


def wrap_maybe_share_target_embed(upstream: Callable[..., Any]) -> Callable[..., Any]:
    """Binding `dspark_pp_embed`: on a stage without the target embedding, load the drafter's own."""

    def maybe_share_target_embed(
        draft_model: nn.Module, draft_inner: nn.Module, target_inner: nn.Module
    ) -> Any:
        own = getattr(draft_inner, "embed_tokens", None)
        if (
            _pp_world_size() > 1
            and getattr(draft_model, "has_own_embed_tokens", None) is False
            and isinstance(own, nn.Module)
            and hasattr(own, "weight")
            and _target_embedding_missing(target_inner)
        ):
            from vllm.config import get_current_vllm_config

            cfg = get_current_vllm_config()
            mc = cfg.model_config
            root = checkpoint_dir(
                getattr(mc, "model_weights", None) or mc.model, cfg.load_config.download_dir, mc.revision
            )
            held = load_target_embedding(own, root)
            LOG.info(
                "DSpark on PP: drafter embedding loaded from the target checkpoint (%d B on this rank)", held
            )
            return None
        return upstream(draft_model, draft_inner, target_inner)

    return maybe_share_target_embed
