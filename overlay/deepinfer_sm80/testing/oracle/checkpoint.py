"""Read the tiny V4.1 checkpoint: config.json and the safetensors shards, dequantized here.

Every weight is decoded from its stored bytes by `quant` (never by vLLM's loader): FP8 e4m3 with UE8M0
32 x 32 block scales (`<name>.weight` + `<name>.scale`), MXFP4 experts (int8 pairs of e2m1 + UE8M0 per
32), the Engram tables (e4m3 rows, UE8M0 per 32 values), bf16 and fp32 tensors as stored. A decoded
FP8 / MXFP4 value is an e4m3 / e2m1 value times a power of two, so it is exact in bf16: weights are
held as bf16 (half the memory of fp32, nothing lost) and upcast to fp32 where they are used.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from . import quant


class Checkpoint:
    """Lazy, decoded view of the checkpoint's tensors by their release names."""

    def __init__(self, ckpt_dir: Path) -> None:
        ckpt_dir = Path(ckpt_dir)
        cfg_path = ckpt_dir / "config.json"
        if not cfg_path.is_file():
            raise FileNotFoundError(f"{ckpt_dir}: no config.json")
        cfg = json.loads(cfg_path.read_text())
        if cfg.get("model_type") != "deepseek_v41":
            raise ValueError(f"{cfg_path}: model_type {cfg.get('model_type')!r}, expected 'deepseek_v41'")
        self.dir = ckpt_dir
        self.hf = cfg
        self.text: dict = cfg["text_config"]
        qc = cfg.get("quantization_config", {})
        if qc.get("weight_block_size", [32, 32]) != [32, 32] or qc.get("scale_fmt", "ue8m0") != "ue8m0":
            raise ValueError(f"{cfg_path}: only UE8M0 32 x 32 FP8 blocks are decoded here, got {qc}")
        from safetensors import safe_open

        index = ckpt_dir / "model.safetensors.index.json"
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            shards = [p.name for p in sorted(ckpt_dir.glob("*.safetensors"))]
        self._files = [safe_open(str(ckpt_dir / s), "pt") for s in shards]
        self._where = {k: f for f in self._files for k in f.keys()}
        self._cache: dict[str, torch.Tensor] = {}

    def has(self, name: str) -> bool:
        return name in self._where

    def raw(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise KeyError(f"{self.dir}: tensor {name!r} not in the checkpoint")
        return self._where[name].get_tensor(name)

    def _keep(self, name: str, value: torch.Tensor) -> torch.Tensor:
        self._cache[name] = value
        return value

    def dense(self, name: str) -> torch.Tensor:
        """A linear weight [out, in] by its module name: FP8 (weight + scale) or plain bf16, as bf16."""
        if name in self._cache:
            return self._cache[name]
        w = self.raw(f"{name}.weight")
        if w.dtype == torch.float8_e4m3fn:
            w = quant.fp8_block_dequant(w, self.raw(f"{name}.scale"))
        return self._keep(name, w.to(torch.bfloat16).contiguous())

    def expert(self, name: str) -> torch.Tensor:
        """An MXFP4 expert matrix [out, in] as bf16 (exact)."""
        if name in self._cache:
            return self._cache[name]
        return self._keep(
            name,
            quant.mxfp4_dequant(self.raw(f"{name}.weight"), self.raw(f"{name}.scale")).to(torch.bfloat16),
        )

    def table(self, name: str) -> torch.Tensor:
        """An Engram table [rows, dim]: e4m3 rows with a UE8M0 per 32 values, as bf16 (exact)."""
        if name in self._cache:
            return self._cache[name]
        return self._keep(
            name,
            quant.fp8_row_dequant(self.raw(f"{name}.weight"), self.raw(f"{name}.scale")).to(torch.bfloat16),
        )

    def vec(self, name: str) -> torch.Tensor:
        """A bf16 / fp32 tensor as stored, returned in fp32 (norm weights, hc params, sinks, gates)."""
        if name not in self._cache:
            self._keep(name, self.raw(name).to(torch.float32))
        return self._cache[name]


def linear(x: torch.Tensor, w: torch.Tensor, round_out: bool = True) -> torch.Tensor:
    """x [.., in] (fp32 holding bf16 values) times W [out, in] (bf16): products exact, fp32 accumulation,
    one rounding to bf16 (the engine's W8A16 / W4A16 / bf16 GEMM contract), or fp32 out where the engine
    keeps fp32 (the compressor's and the router's outputs). The rounded case runs as a bf16 GEMM: x holds
    bf16 values, so `x.bfloat16()` is exact, and the library accumulates in fp32 (its order is its own:
    ORACLE.md counts that among the differences)."""
    if round_out and quant.bf16_gemm():
        return (x.to(torch.bfloat16) @ w.T).to(torch.float32)
    y = x @ w.to(torch.float32).T
    return quant.bf16(y) if round_out else y
