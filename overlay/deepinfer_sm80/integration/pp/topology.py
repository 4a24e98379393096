"""DeepSeek-V4.1 KV-sharing topology read from the model config (docs/PIPELINE.md §1).

No vLLM, no torch: the plan is pure arithmetic on config fields, so it runs in CI, in `make validate`
and at engine start-up alike. Field names are the checkpoint's `config.json` names (V4.1 nests them
under `text_config`; both layouts are accepted).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Bytes of one stored state on SM8x (V4 record; SM100's 528 B MXFP8 record is not used below 10.0).
CKV_RECORD_BYTES = 584  # 448 e4m3 + 64 bf16 RoPE + 7 UE8M0 + pad
CKV_DATA_BYTES = 576
CKV_SCALE_BYTES = 8
CKV_PAGE_ALIGNMENT = 576
IKV_DATA_BYTES = 128  # indexer K: 128 e4m3 ...
IKV_SCALE_BYTES = 4  # ... + one fp32 scale, planar
IKV_RECORD_BYTES = IKV_DATA_BYTES + IKV_SCALE_BYTES
INDEX_BUFFER_DTYPE_BYTES = 4  # topk_indices_buffer / candidate_block_buffer are int32
TOKEN_ID_BYTES = 4  # model runner V2's input_ids are int32 (v1/worker/gpu/input_batch.py)
HIDDEN_DTYPE_BYTES = 2  # bf16 residual streams in IntermediateTensors
PRE_MIX_DTYPE_BYTES = 4  # fp32 pre-mix
DEFAULT_BLOCK_TOKENS = 128  # compressed / indexer caches use 128-token blocks off SM90


@dataclass(frozen=True)
class Topology:
    """Which layer reads which source. Layer ids are backbone ids (DSpark layers live on the drafter)."""

    num_layers: int
    ratios: tuple[int, ...]  # per backbone layer: 0 SWA-only, 1 or 2 compressed
    kv_sources: tuple[int, ...]
    index_sources: tuple[int, ...]
    candidate_source: int  # -1: no candidate filtering
    candidate_blocks: int
    index_topk: int
    index_head_dim: int
    hidden_size: int
    hc_mult: int
    engram_layers: tuple[int, ...] = ()  # layers that inject Engram rows; they hash the step's token ids

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | Any) -> Topology:
        """From a config.json dict (flat or with `text_config`) or an HF config object."""
        get = _getter(config)
        n = int(get("num_hidden_layers"))
        ratios = tuple(int(r) for r in (get("compress_ratios", None) or [0] * n))
        if len(ratios) < n:
            raise ValueError(f"compress_ratios has {len(ratios)} entries, the model has {n} layers")
        bad = sorted({r for r in ratios if r not in (0, 1, 2)})
        if bad:
            raise ValueError(f"compress_ratios holds {bad}; DeepSeek-V4.1 accepts only 0, 1, 2")
        kv = tuple(sorted(int(s) for s in get("kv_source_layer_ids", ()) or ()))
        idx = tuple(sorted(int(s) for s in get("index_source_layer_ids", ()) or ()))
        cand_blocks = int(get("candidate_topk_blocks", 0) or 0)
        cand = int(get("candidate_source_layer_id", -1)) if cand_blocks > 0 else -1
        topo = cls(
            num_layers=n,
            ratios=ratios[:n],
            kv_sources=kv,
            index_sources=idx,
            candidate_source=cand,
            candidate_blocks=cand_blocks,
            index_topk=int(get("index_topk")),
            index_head_dim=int(get("index_head_dim", 128)),
            hidden_size=int(get("hidden_size")),
            hc_mult=int(get("hc_mult", 1)),
            engram_layers=tuple(sorted(int(x) for x in get("engram_layer_ids", ()) or ())),
        )
        topo._check()
        return topo

    @classmethod
    def from_file(cls, path: str | Path) -> Topology:
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        try:
            return cls.from_config(json.loads(p.read_text()))
        except FileNotFoundError:
            raise ValueError(f"no model config at {p}") from None

    def _check(self) -> None:
        for layer, r in enumerate(self.ratios):
            if r == 0:
                continue
            if not [s for s in self.kv_sources if s <= layer] or not [
                s for s in self.index_sources if s <= layer
            ]:
                raise ValueError(
                    f"layer {layer} is compressed (ratio {r}) but no kv/index source is at or below it"
                )
        if not set(self.kv_sources) <= set(self.index_sources):
            raise ValueError("every kv source must also be an index source (it owns the indexer K cache)")

    # ---------------------------------------------------------------- per-layer relations
    def kv_source(self, layer: int) -> int | None:
        """The layer whose compressed-KV (and indexer-K) cache `layer` reads; None for SWA-only."""
        if self.ratios[layer] == 0:
            return None
        return max(s for s in self.kv_sources if s <= layer)

    def index_source(self, layer: int) -> int | None:
        """The indexer whose top-k `layer` attends with (itself for index sources)."""
        if self.ratios[layer] == 0:
            return None
        return max(s for s in self.index_sources if s <= layer)

    def is_kv_source(self, layer: int) -> bool:
        return layer in self.kv_sources

    def is_index_source(self, layer: int) -> bool:
        return layer in self.index_sources

    def uses_candidates(self, layer: int) -> bool:
        """Index sources above the candidate source mask their scores with its candidate blocks."""
        return self.is_index_source(layer) and 0 <= self.candidate_source < layer

    def reads(self, layer: int) -> list[tuple[str, int]]:
        """(kind, producer) pairs `layer` reads that another layer produced (docs/PIPELINE.md §1)."""
        out: list[tuple[str, int]] = []
        src = self.kv_source(layer)
        if src is None:
            return out
        if src != layer:
            out.append(("ckv", src))
            if self.is_index_source(layer):  # a non-owning indexer scores against the source's K
                out.append(("ikv", src))
        if not self.is_index_source(layer):
            idx = self.index_source(layer)
            assert idx is not None
            out.append(("topk", idx))
        if self.uses_candidates(layer):
            out.append(("cand", self.candidate_source))
        return out

    def step_inputs(self, layer: int) -> list[tuple[str, int]]:
        """(kind, producer) pairs `layer` reads from the step's inputs rather than from another layer: an
        Engram layer hashes the step's token ids (`ids`), which only the first stage is given (model
        runner V2 passes input_ids=None to later stages); layer 0's stage holds them."""
        return [("ids", 0)] if layer in self.engram_layers else []

    # ---------------------------------------------------------------- byte counts
    def per_token_wire_bytes(self, kind: str) -> int:
        """Bytes per token of one payload row of `kind` (fixed-shape rows, one per scheduled token)."""
        return {
            "ckv": CKV_RECORD_BYTES,
            "ikv": IKV_RECORD_BYTES,
            "topk": self.index_topk * INDEX_BUFFER_DTYPE_BYTES,
            "cand": self.candidate_blocks * INDEX_BUFFER_DTYPE_BYTES,
            "ids": TOKEN_ID_BYTES,
        }[kind]

    def hidden_wire_bytes(self) -> int:
        """Upstream's own IntermediateTensors per token: hidden_states [hc, H] bf16 + pre_mix [hc] fp32."""
        return self.hc_mult * self.hidden_size * HIDDEN_DTYPE_BYTES + self.hc_mult * PRE_MIX_DTYPE_BYTES

    def cache_bytes_per_token(
        self, kind: str, source: int, block_tokens: int = DEFAULT_BLOCK_TOKENS
    ) -> float:
        """KV memory per context token of one cache, pages included (round_up(states·record, 576))."""
        ratio = self.ratios[source]
        states = block_tokens // ratio
        record = CKV_RECORD_BYTES if kind == "ckv" else IKV_RECORD_BYTES
        page = -(-states * record // CKV_PAGE_ALIGNMENT) * CKV_PAGE_ALIGNMENT
        return page / block_tokens


_REQUIRED: Any = object()


def _getter(config: Mapping[str, Any] | Any) -> Any:
    if isinstance(config, Mapping):
        flat = dict(config)
        flat.update(config.get("text_config") or {})

        def get(key: str, default: Any = _REQUIRED) -> Any:
            if key not in flat and default is _REQUIRED:
                raise ValueError(f"model config has no {key!r}")
            return flat.get(key, default)

        return get

    def get_attr(key: str, default: Any = _REQUIRED) -> Any:
        text = getattr(config, "text_config", None)
        for obj in (config, text):
            if obj is not None and hasattr(obj, key):
                return getattr(obj, key)
        if default is _REQUIRED:
            raise ValueError(f"model config has no {key!r}")
        return default

    return get_attr


def v41_flash_fields() -> dict[str, Any]:
    """DeepSeek-V4.1-Flash's sharing-topology fields as its config.json states them (for tests and docs;
    the engine always reads the checkpoint's own config)."""
    return {
        "num_hidden_layers": 40,
        "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0] * 3,
        "kv_source_layer_ids": [2, 8, 14, 20],
        "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
        "candidate_source_layer_id": 20,
        "candidate_topk_blocks": 2048,
        "index_topk": 512,
        "index_head_dim": 128,
        "hidden_size": 5120,
        "hc_mult": 4,
        "engram_layer_ids": [1, 14],
    }
