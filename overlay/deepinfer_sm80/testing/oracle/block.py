"""What the forward of the tiny V4.1 checkpoint is built from and leaves behind: a decoder layer (`Block`,
a backbone layer or an MTP stage) and one forward's `Trace`. The target (model.py) and the DSpark drafter
(dspark.py) both build blocks; the drafter reads the target's trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import mhc
from .attention import Attention
from .checkpoint import Checkpoint
from .moe import MoE


class Block:
    """A decoder layer: `name` is 'layers.N' or 'mtp.S' (layer index N, or num_hidden_layers + S)."""

    def __init__(self, ck: Checkpoint, name: str, layer: int, tables: dict[bool, torch.Tensor]) -> None:
        self.ck, self.name, self.layer = ck, name, layer
        backbone = layer < ck.text["num_hidden_layers"]
        self.attn = Attention(ck, name, layer, tables)
        self.moe = MoE(ck, name, backbone)
        self.hc = {p: self._hc(ck, f"{name}.hc_{p}") for p in ("attn", "ffn")}
        self.attn_norm, self.ffn_norm = ck.vec(f"{name}.attn_norm.weight"), ck.vec(f"{name}.ffn_norm.weight")
        self.engram = backbone and layer in ck.text.get("engram_layer_ids", [])

    @staticmethod
    def _hc(ck: Checkpoint, p: str) -> mhc.HcParams:
        return mhc.HcParams(ck.vec(f"{p}_fn"), ck.vec(f"{p}_scale"), ck.vec(f"{p}_base"))


@dataclass
class Trace:
    """What one forward leaves behind: bf16 logits, the final normed hidden state, the aux streams."""

    logits: torch.Tensor  # fp32 holding bf16 values [T, V]
    hidden: torch.Tensor  # [T, H]
    aux: dict[int, torch.Tensor] = field(default_factory=dict)  # layer id -> bf16 [T, H]
