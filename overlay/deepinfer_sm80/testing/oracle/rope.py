"""RoPE of V4.1: GPT-J (interleaved pairs) on the last 64 dims, YaRN on compressed layers.

Sliding-window-only layers (ratio 0) rotate with `rope_theta` and no scaling; every layer with a
compressed cache (ratio 1 or 2), its compressor and its indexer with `compress_rope_theta` and YaRN
(`rope_scaling`: factor, beta_fast / beta_slow, original_max_position_embeddings), magnitude scale 1.
The table is fp32 `[positions, 64]` = 32 cosines then 32 sines.
"""

from __future__ import annotations

import math

import torch

ROPE_DIM = 64


def _correction_dim(rotations: float, dim: int, base: float, max_pos: int) -> float:
    return dim * math.log(max_pos / (rotations * 2 * math.pi)) / (2 * math.log(base))


def cos_sin_table(t: dict, compressed: bool) -> torch.Tensor:
    """The cos / sin table a layer of this kind uses (fp32 [max_positions, 64])."""
    dim = ROPE_DIM
    if compressed:
        rs = t["rope_scaling"]
        base, factor, orig = (
            float(t["compress_rope_theta"]),
            float(rs["factor"]),
            int(rs["original_max_position_embeddings"]),
        )
        fast, slow = rs.get("beta_fast", 32), rs.get("beta_slow", 1)
    else:
        base, factor, orig, fast, slow = float(t["rope_theta"]), 1.0, int(t["max_position_embeddings"]), 32, 1
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extra, inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    low = max(math.floor(_correction_dim(fast, dim, base, orig)), 0)
    high = min(math.ceil(_correction_dim(slow, dim, base, orig)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolated (high-frequency) pairs, 0: interpolated
    inv_freq = inter * (1 - keep) + extra * keep
    pos = torch.arange(int(orig * factor), dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def rotate(x: torch.Tensor, table: torch.Tensor, pos: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """GPT-J rotation of the last 64 dims of x [T, ..., D] at positions pos [T] (fp32 math)."""
    cs = table[pos]  # [T, 64]
    c, s = cs[:, :32], cs[:, 32:]
    if inverse:
        s = -s
    shape = [x.shape[0]] + [1] * (x.dim() - 2) + [32]
    c, s = c.reshape(shape), s.reshape(shape)
    r = x[..., -ROPE_DIM:].reshape(*x.shape[:-1], 32, 2)
    e, o = r[..., 0], r[..., 1]
    rot = torch.stack([e * c - o * s, o * c + e * s], dim=-1).reshape(*x.shape[:-1], ROPE_DIM)
    return torch.cat([x[..., :-ROPE_DIM], rot], dim=-1)
