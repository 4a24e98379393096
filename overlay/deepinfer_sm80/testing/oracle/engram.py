"""Engram: n-gram hash lookups gated into the hyper-connection streams (V4.1 semantics, our code).

Per token at position p, for layer slot l and n-gram sizes 2..N (N = engram_max_ngram_size):
the compressed id of the token at p - s (s = 0..N-1) is XOR-folded into a rolling int64,
`rolling ^= v_s * mult[l, s]`, where `v_s` is the pad id once any look-back fell before position 0;
for s >= 1 head h of n-gram size s + 1 reads bucket `rolling % prime + offset` of the layer's table.
The rows (e4m3 x UE8M0 per 32 values, dequantized to bf16) are concatenated, `wkv` maps them to one
key per stream plus a shared value, and stream j becomes
`R[j] + sigmoid(ssqrt(<R[j]*q[j]*k[j], key_j> * rms(R[j])^-1 * rms(key_j)^-1 / sqrt(D))) * value`
with `ssqrt(x) = sign(x) * sqrt(max(|x|, 1e-6))`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .quant import bf16

GATE_CLAMP = 1e-6  # upstream's clamp_value under the signed square root
_MAX_LONG = (1 << 63) - 1


def compressed_token_map(tokenizer_json: Path) -> tuple[list[int], int]:
    """token id -> compressed id (tokens that normalise alike share one), and the compressed size.

    The normalisation is the release's: NFKC, NFD, accents stripped, lower case, runs of whitespace
    to one space, stripped, with a token that is exactly one space kept as " " (a private-use
    sentinel survives the strip); a token whose text holds U+FFFD (a partial UTF-8 byte) is keyed by
    its raw vocabulary string instead.
    """
    from tokenizers import Regex, Tokenizer, normalizers

    keep = "\ue000"  # private use: survives Strip()
    norm = normalizers.Sequence([
        normalizers.NFKC(), normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "), normalizers.Replace(Regex(r"^ $"), keep),
        normalizers.Strip(), normalizers.Replace(keep, " "),
    ])  # fmt: skip
    tok = Tokenizer.from_file(str(tokenizer_json))
    ids: dict[str, int] = {}
    out = []
    for t in range(tok.get_vocab_size(with_added_tokens=True)):
        text = tok.decode([t], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(t)
        else:
            key = norm.normalize_str(text) or text
        out.append(ids.setdefault(key, len(ids)))
    return out, len(ids)


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, int(n**0.5) + 1))


@dataclass(frozen=True)
class EngramLayout:
    """Hash parameters of every Engram layer (bucket primes, offsets, multipliers)."""

    layer_ids: tuple[int, ...]
    max_ngram: int
    n_heads: int
    primes: torch.Tensor  # int64 [L, (N-1)*heads]
    offsets: torch.Tensor  # int64 [L, (N-1)*heads]: cumulative sums of the primes per layer
    mult: torch.Tensor  # int64 [L, N]
    pad_id: int  # compressed id of engram_pad_token_id

    @classmethod
    def from_config(cls, t: dict, token_map: list[int]) -> EngramLayout:
        layers, n, heads = tuple(t["engram_layer_ids"]), t["engram_max_ngram_size"], t["engram_n_heads"]
        cv = t["engram_compressed_vocab_size"]
        if max(token_map) + 1 != cv:
            raise ValueError(f"engram_compressed_vocab_size {cv} != {max(token_map) + 1} from the tokenizer")
        primes, p = [], t["engram_vocab_size"] - 1
        for _ in layers:
            row = []
            for _ in range((n - 1) * heads):
                p += 1
                while not _is_prime(p):
                    p += 1
                row.append(p)
            primes.append(row)
        pr = torch.tensor(primes, dtype=torch.int64)
        offsets = torch.cumsum(pr, dim=1) - pr
        # one odd multiplier per (layer, look-back), from numpy's PCG64 seeded 10007 * layer id, bounded so
        # id * multiplier < 2^63 (the release's hash; the tables were trained with it)
        bound = max(1, (_MAX_LONG // cv) // 2)
        rngs = [np.random.default_rng(10007 * i) for i in layers]
        draws = [g.integers(0, bound, size=(n,), dtype=np.int64) for g in rngs]
        mult = torch.from_numpy(np.stack(draws) * 2 + 1)
        return cls(layers, n, heads, pr, offsets, mult, token_map[t["engram_pad_token_id"]])

    def hashes(self, compressed: torch.Tensor) -> torch.Tensor:
        """compressed ids [T] of one sequence (position = index) -> table rows int64 [T, L, (N-1)*heads]."""
        t = compressed.shape[0]
        pos = torch.arange(t)
        out = torch.empty(t, len(self.layer_ids), (self.max_ngram - 1) * self.n_heads, dtype=torch.int64)
        for li in range(len(self.layer_ids)):
            rolling = torch.zeros(t, dtype=torch.int64)
            blocked = torch.zeros(t, dtype=torch.bool)
            for s in range(self.max_ngram):
                back = pos - s
                blocked |= back < 0
                src = compressed[back.clamp_min(0)].to(torch.int64)
                v = torch.where(blocked, torch.full_like(src, self.pad_id), src)
                rolling ^= v * self.mult[li, s]  # < 2^63 by the multiplier bound: no wrap
                if s:
                    c = slice((s - 1) * self.n_heads, s * self.n_heads)
                    out[:, li, c] = rolling[:, None] % self.primes[li, c] + self.offsets[li, c]
        return out


def engram_rows(table: torch.Tensor, hashes: torch.Tensor) -> torch.Tensor:
    """Dequantized table [rows, dim] (bf16) at hashes [T, C] -> flat fp32 [T, C * dim] (bf16 values)."""
    return table[hashes].reshape(hashes.shape[0], -1).to(torch.float32)


def engram_inject(
    r: torch.Tensor, kv: torch.Tensor, q_w: torch.Tensor, k_w: torch.Tensor, eps: float
) -> torch.Tensor:
    """R [T, hc, D] (bf16 values), kv [T, (hc+1)*D] (bf16 values) -> bf16-rounded new streams."""
    t, hc, d = r.shape
    key, value = kv[:, : hc * d].reshape(t, hc, d), kv[:, hc * d :]
    h_rms = torch.rsqrt((r * r).sum(-1) / d + eps)
    k_rms = torch.rsqrt((key * key).sum(-1) / d + eps)
    dot = (r * q_w * k_w * key).sum(-1) * h_rms * k_rms * d**-0.5
    g = torch.sigmoid(torch.sign(dot) * torch.sqrt(dot.abs().clamp_min(GATE_CLAMP)))
    return bf16(r + g[..., None] * value[:, None, :])
