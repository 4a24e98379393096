"""The tiny checkpoint's DSpark drafter: a next-token map distilled from the target's own predictions.

vLLM 0.32.0's DSpark (`v1/worker/gpu/spec_decode/dspark/speculator.py`, `_sample_sequential`) drafts
step i as `argmax(base_logits_i + markov_w2 @ markov_w1[prev])`, prev being the anchor (the target's
last token) at step 0 and the previous draft after; the confidence head is read only under adaptive
verification (off by default). The random backbone's base logits predict nothing (measured: 0 of 24
first drafts on held-out greedy continuations), so the Markov head carries the prediction: a map
g(prev) -> the next token.

What predicts this random target: its logits vary slowly along a sequence (the context, not the current
token, dominates the final state), so its greedy continuations repeat: on 16 held-out 12-token prompts
(7 greedy tokens each) the next token equals the current one at 50 % of steps, while a bigram fitted on
teacher-forced data predicts 30 %. The map is therefore copy-first: g(prev) = the next token seen most
often after prev, counted with a prior of COPY_PRIOR pseudo-observations for prev itself (ties: prev).

Distillation (seeded, CPU, the independent oracle of deepinfer_sm80.testing.oracle):
- `Plan.sequences` sequences of `Plan.blocks` x (RANDOM seeded random ids in [2, 1000), then CHAIN ids
  the target picks), the chain filled by Jacobi rounds: round 0 reads random ids, round k > 0 sets each
  chain id to the target's greedy prediction at the position before it in round k - 1 (teacher-forced
  continuations: contexts mix random ids and the target's own choices, as a prompt and its greedy
  continuation do); a sequence is one forward per round (few longer forwards, not many short ones);
- each forward gives one sample (prev id, the target's argmax after it) per chain position of rounds
  >= 1, kept only where the top-1 / top-2 margin exceeds MARGIN (near-ties may flip with summation
  order across CPUs; the map must not).

Encoding (rank r = `dspark_markov_rank`): every id j gets a code c_j in R^r: the F most frequent next
ids (F <= r / 2) the unit vectors e_0..e_{F-1}, every other id a seeded random unit vector in the span
of e_F..e_{r-1}. `markov_head.head[j]` (W2) = c_j and `markov_head.embed[prev]` (W1) = SCALE x
c_{g(prev)}, so the bias `W2 @ W1[prev]` is SCALE on g(prev) and exactly 0 on the frequent ids
otherwise (cross-talk among the others: about SCALE x N(0, 1 / (r - F))), far above the backbone's
base logits (within +-40 on this checkpoint).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RANDOM, CHAIN = 8, 8  # ids per block: seeded random, then target-chosen
MARGIN = 0.25  # keep a sample only when top-1 beats top-2 by this much (logits, bf16 values)
COPY_PRIOR = 2  # pseudo-observations of prev -> prev
SCALE = 256.0  # the Markov bias on g(prev)
LOW, HIGH = 2, 1000  # sampled ids (0 / 1 are BOS / EOS, as in the e2e runner's prompts)
SEED_BASE = 0x5EED_D5  # the distillation's generator: seed + SEED_BASE (apart from the tensors' crc32 seeds)


@dataclass(frozen=True)
class Plan:
    """How much the distillation reads: `sequences` x `rounds` forwards of `blocks` x (RANDOM + CHAIN) ids."""

    seed: int = 0
    sequences: int = 8
    blocks: int = 2
    rounds: int = 3


@dataclass
class Samples:
    prev: list[int] = field(default_factory=list)
    nxt: list[int] = field(default_factory=list)


def sequences(plan: Plan) -> list[list[tuple[int, bool]]]:
    """Per sequence, (id, is_chain) per position: random ids fixed, chain ids random until round 1."""
    import torch

    g = torch.Generator().manual_seed(SEED_BASE + plan.seed)
    out = []
    for _ in range(plan.sequences):
        seq: list[tuple[int, bool]] = []
        for _ in range(plan.blocks):
            seq += [(int(x), False) for x in torch.randint(LOW, HIGH, (RANDOM,), generator=g)]
            seq += [(int(x), True) for x in torch.randint(LOW, HIGH, (CHAIN,), generator=g)]
        out.append(seq)
    return out


def collect(oracle: Any, plan: Plan) -> Samples:
    """Jacobi rounds over the plan's sequences; the kept (prev, next) samples of rounds >= 1."""
    import torch

    s = Samples()
    for seq in sequences(plan):
        ids = torch.tensor([i for i, _ in seq])
        chain = torch.tensor([c for _, c in seq])
        for r in range(plan.rounds):
            top = oracle.logits(ids).topk(2, dim=-1)
            pick, margin = top.indices[:, 0], top.values[:, 0] - top.values[:, 1]
            if r:
                keep = torch.zeros_like(chain)
                keep[:-1] = chain[1:]  # the position before a chain id predicts it
                idx = (keep & (margin > MARGIN)).nonzero().flatten()
                s.prev += ids[idx].tolist()
                s.nxt += pick[idx].tolist()
            nxt = ids.clone()
            nxt[1:] = torch.where(chain[1:], pick[:-1], ids[1:])
            ids = nxt
    return s


@dataclass
class NextMap:
    """g(prev): `moves` holds the ids whose fitted next token is not themselves; every other id copies."""

    moves: dict[int, int]
    frequent: list[int]  # the most frequent next ids, most frequent first (their codes are e_0, e_1, ...)

    def predict(self, prev: int) -> int:
        return self.moves.get(prev, prev)

    def digest(self) -> str:
        blob = json.dumps({"moves": sorted(self.moves.items()), "frequent": self.frequent})
        return hashlib.sha256(blob.encode()).hexdigest()


def fit(s: Samples, rank: int) -> NextMap:
    """g(prev) = argmax_j count(prev -> j) + COPY_PRIOR [j = prev], ties to prev, then to the lower id."""
    counts: dict[int, Counter[int]] = {}
    for p, n in zip(s.prev, s.nxt, strict=True):
        counts.setdefault(p, Counter())[n] += 1
    moves = {}
    for p, c in sorted(counts.items()):
        best = min(c, key=lambda j: (-c[j], j))
        if c[best] > c[p] + COPY_PRIOR:
            moves[p] = best
    freq = Counter(s.nxt)
    frequent = [t for t, _ in sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))][: rank // 2]
    return NextMap(moves, frequent)


def accuracy(m: NextMap, s: Samples) -> float:
    """The share of samples whose next token g predicts."""
    return sum(m.predict(p) == n for p, n in zip(s.prev, s.nxt, strict=True)) / max(len(s.prev), 1)


def codes(m: NextMap, vocab: int, rank: int, seed: int) -> Any:
    """[vocab, rank] fp32 unit codes: e_k for the k-th frequent id, seeded random in the rest's span."""
    import torch

    f = len(m.frequent)
    g = torch.Generator().manual_seed(SEED_BASE + seed + 1)
    c = torch.zeros(vocab, rank)
    c[:, f:] = torch.randn(vocab, rank - f, generator=g)
    c[m.frequent] = 0
    c[m.frequent, range(f)] = 1
    return c / c.norm(dim=1, keepdim=True)


def markov_tensors(m: NextMap, vocab: int, rank: int, seed: int) -> tuple[Any, Any]:
    """(markov_head.embed [vocab, rank], markov_head.head [vocab, rank]), bf16 (module docstring)."""
    import torch

    c = codes(m, vocab, rank, seed)
    g = torch.tensor([m.predict(p) for p in range(vocab)])
    return (SCALE * c[g]).to(torch.bfloat16), c.to(torch.bfloat16)


def distil(ckpt: Path, plan: Plan) -> tuple[NextMap, Samples, dict[str, Any]]:
    """Collect and fit on the checkpoint in `ckpt` (its target tensors written)."""
    from deepinfer_sm80.testing.oracle import V41Oracle

    oracle = V41Oracle.load(ckpt)
    samples = collect(oracle, plan)
    m = fit(samples, int(oracle.t["dspark_markov_rank"]))
    return m, samples, oracle.t


def install(ckpt: Path, shard: str, seed: int, plan: Plan | None = None) -> dict[str, Any]:
    """Distil the map on `ckpt` and write its Markov tensors into the shard in place; what was fitted."""
    plan = plan or Plan(seed=seed)
    m, samples, t = distil(ckpt, plan)
    last = f"mtp.{t['num_nextn_predict_layers'] - 1}.markov_head"
    w1, w2 = markov_tensors(m, t["vocab_size"], t["dspark_markov_rank"], seed)
    patch_tensors(ckpt / shard, {f"{last}.embed.weight": w1, f"{last}.head.weight": w2})
    return {
        "map": m.digest(),
        "samples": len(samples.prev),
        "moves": len(m.moves),
        "frequent": len(m.frequent),
        "fit": round(accuracy(m, samples), 4),
        "copy_fit": round(accuracy(NextMap({}, []), samples), 4),  # g = identity
    }


def patch_tensors(shard: Path, values: dict[str, Any]) -> None:
    """Overwrite tensors of a safetensors file in place: same name, dtype and shape, new bytes."""
    import json
    import struct

    import torch

    with shard.open("r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        for name, v in values.items():
            meta = header[name]
            raw = v.contiguous().view(torch.uint8).numpy().tobytes()
            start, end = meta["data_offsets"]
            if list(v.shape) != meta["shape"] or len(raw) != end - start:
                raise ValueError(f"{name}: {tuple(v.shape)} does not fit {meta['shape']} ({meta['dtype']})")
            f.seek(8 + n + start)
            f.write(raw)
