"""A replication round trip without vLLM: scheduled steps, writers on the producing stage, replicas after.

Each stage holds a block pool like vLLM's (one block = the pages of every cache of the stage, so pages
share blocks and `stride(0)` exceeds a page), the shared top-k / candidate buffers, and a block table
per request. Producers write real records (the 584-byte V4 encoder for compressed KV, e4m3 + fp32 for
indexer K) at the step's slots; `payload.pack` / `payload.apply` carry them. Every stage also keeps a
second pool whose block ids are a permutation of the first, to show the replica follows the receiver's
own slots rather than copying pool offsets.

The step script covers chunked prefill, mixed prefill + decode, preemption (freed blocks reused by a
new request, then the preempted request recomputed into other blocks) and padded tokens (slot −1).
`check_step` compares every replicated region byte for byte with the producer's.
Used by tests/test_pp_replication.py (gloo, 2 and 3 processes) and the one-GPU round trip.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from deepinfer_sm80.integration.pp.payload import (
    FORMATS,
    StageState,
    apply,
    empty_payload,
    pack,
    received_ids,
)
from deepinfer_sm80.integration.pp.plan import Item, Plan
from deepinfer_sm80.ops.kv_quant_insert import quantize_and_insert_ref
from deepinfer_sm80.ops.pp_records import record_views, scatter_records_ref

BLOCK_TOKENS = 16
NUM_BLOCKS = 24
PAD_TOKENS = 3  # padded rows at the end of every step (CUDA-graph padding): slot −1


@dataclass(frozen=True)
class Chunk:
    req: str
    start: int  # first position scheduled
    count: int


@dataclass(frozen=True)
class Step:
    name: str
    chunks: tuple[Chunk, ...]
    free: tuple[str, ...] = ()  # requests preempted (their blocks freed) before this step


def default_steps() -> tuple[Step, ...]:
    d = lambda r, p: Chunk(r, p, 1)  # a decode token
    return (
        Step("prefill chunk A[0:40] + prefill B[0:23]", (Chunk("A", 0, 40), Chunk("B", 0, 23))),
        Step("prefill chunk A[40:70] + decode B", (Chunk("A", 40, 30), d("B", 23))),
        Step("decode A, B", (d("A", 70), d("B", 24))),
        Step("decode A, B", (d("A", 71), d("B", 25))),
        Step("decode A, B", (d("A", 72), d("B", 26))),
        Step(
            "preempt A; prefill C[0:35] into A's blocks + decode B", (Chunk("C", 0, 35), d("B", 27)), ("A",)
        ),
        Step("decode B, C", (d("B", 28), d("C", 35))),
        Step("recompute A[0:50] + decode B, C", (Chunk("A", 0, 50), d("B", 29), d("C", 36))),
        Step("recompute A[50:73] + decode B", (Chunk("A", 50, 23), d("B", 30))),
        Step("decode A, B, C", (d("A", 73), d("B", 31), d("C", 37))),
    )


class BlockManager:
    """First-free block allocation per request (the scheduler's view; identical on every stage)."""

    def __init__(self, num_blocks: int = NUM_BLOCKS) -> None:
        self.free = list(range(num_blocks))
        self.tables: dict[str, list[int]] = {}

    def release(self, req: str) -> None:
        self.free = sorted(self.free + self.tables.pop(req, []))

    def ensure(self, req: str, tokens: int) -> list[int]:
        table = self.tables.setdefault(req, [])
        while len(table) * BLOCK_TOKENS < tokens:
            table.append(self.free.pop(0))
        return table


@dataclass
class StepTokens:
    positions: torch.Tensor  # [T] int64, padded rows at the end
    reqs: list[str | None]
    tables: dict[str, list[int]]

    @property
    def ids(self) -> torch.Tensor:
        """The step's token ids [T] int32 (the first stage's input_ids): a stable function of request and
        position, distinct across both, 0 on padded rows."""
        out = [0 if r is None else 1 + (p * 7919 + sum(map(ord, r)) * 104729) % 129_279
               for p, r in zip(self.positions.tolist(), self.reqs, strict=True)]  # fmt: skip
        return torch.tensor(out, dtype=torch.int32)


def schedule(steps: tuple[Step, ...]) -> list[StepTokens]:
    bm = BlockManager()
    out = []
    for step in steps:
        for r in step.free:
            bm.release(r)
        pos: list[int] = []
        reqs: list[str | None] = []
        for c in step.chunks:
            bm.ensure(c.req, c.start + c.count)
            pos += range(c.start, c.start + c.count)
            reqs += [c.req] * c.count
        pos += [0] * PAD_TOKENS
        reqs += [None] * PAD_TOKENS
        out.append(StepTokens(torch.tensor(pos), reqs, {k: list(v) for k, v in bm.tables.items()}))
    return out


def slot_mapping(tok: StepTokens, ratio: int, perm: list[int] | None = None) -> torch.Tensor:
    """Per-token state slot of a ratio-`ratio` cache: state p//r written iff (p+1) % r == 0 (−1 otherwise)."""
    spb = BLOCK_TOKENS // ratio
    slots = []
    for p, req in zip(tok.positions.tolist(), tok.reqs, strict=True):
        if req is None or (p + 1) % ratio:
            slots.append(-1)
            continue
        block = tok.tables[req][(p // ratio) // spb]
        if perm is not None:
            block = perm[block]
        slots.append(block * spb + (p // ratio) % spb)
    return torch.tensor(slots, dtype=torch.int64)


def permutation(num_blocks: int = NUM_BLOCKS) -> list[int]:
    g = torch.Generator().manual_seed(zlib.crc32(b"pp-rig-permutation"))
    return torch.randperm(num_blocks, generator=g).tolist()


@dataclass
class Pool:
    """One stage's block pool: every persistent item's pages side by side in each block."""

    plan: Plan
    items: tuple[Item, ...]
    device: torch.device
    offsets: dict[Item, int] = field(default_factory=dict)
    tensor: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        off = 0
        for item in self.items:
            self.offsets[item] = off
            off += self.page_bytes(item) + 64  # a gap, so a stray write lands outside every page
        self.tensor = torch.zeros(NUM_BLOCKS, max(off, 1), dtype=torch.uint8, device=self.device)

    def states_per_block(self, item: Item) -> int:
        return BLOCK_TOKENS // self.plan.topology.ratios[item.producer]

    def page_bytes(self, item: Item) -> int:
        rec = sum(FORMATS[item.kind])
        return -(-self.states_per_block(item) * rec // 576) * 576

    def cache(self, item: Item) -> torch.Tensor:
        """[blocks, states, record] view with the pool's block stride (as vLLM binds a layer's cache)."""
        rec = sum(FORMATS[item.kind])
        t = self.tensor
        return t.as_strided((NUM_BLOCKS, self.states_per_block(item), rec), (t.stride(0), rec, 1),
                            t.storage_offset() + self.offsets[item])  # fmt: skip

    def region(self, item: Item, blocks: list[int]) -> torch.Tensor:
        """The page bytes of `item` in `blocks` [len(blocks), page]."""
        o = self.offsets[item]
        return self.tensor[blocks, o : o + self.page_bytes(item)]


def _persistent_items(plan: Plan, rank: int) -> tuple[Item, ...]:
    """Caches stage `rank` holds that take part in replication: produced here and shipped, or replicas."""
    st = plan.stages[rank]
    own = {i for s in plan.stages for i in s.needs if i.persistent and st.start <= i.producer < st.end}
    return tuple(sorted(own | set(st.replicas)))


class StageRig:
    """One stage: two pools (same block ids as the scheduler, permuted ids), buffers, producers."""

    def __init__(self, plan: Plan, rank: int, device: torch.device | str, max_tokens: int = 128) -> None:
        self.plan, self.rank, self.device = plan, rank, torch.device(device)
        items = _persistent_items(plan, rank)
        self.pools = {"same": Pool(plan, items, self.device), "permuted": Pool(plan, items, self.device)}
        self.perm = permutation()
        t = plan.topology
        self.topk = torch.full((max_tokens, t.index_topk), -7, dtype=torch.int32, device=self.device)
        width = max(t.candidate_blocks, 1)
        self.cand = torch.full((max_tokens, width), -7, dtype=torch.int32, device=self.device)
        self.received_ids: torch.Tensor | None = None  # this step's input ids as received (Engram's `ids`)

    def state(self, pool: str, tok: StepTokens) -> StageState:
        p = self.pools[pool]
        perm = self.perm if pool == "permuted" else None
        ratio = self.plan.topology.ratios
        return StageState(
            cache=p.cache,
            slots=lambda item: slot_mapping(tok, ratio[item.producer], perm).to(self.device),
            topk=self.topk,
            cand=self.cand if self.plan.topology.candidate_blocks else None,
            ids=tok.ids.to(self.device),
        )

    def produce(self, step: int, tok: StepTokens) -> None:
        """Run this stage's producers for one step: cache writers of owned sources, indexer/candidate rows."""
        t = self.plan.topology
        st = self.plan.stages[self.rank]
        n = tok.positions.shape[0]
        for item in _persistent_items(self.plan, self.rank):
            if not st.start <= item.producer < st.end:
                continue
            g = torch.Generator().manual_seed(zlib.crc32(f"{item.key}/{step}".encode()))
            for name, pool in self.pools.items():
                slots = slot_mapping(tok, t.ratios[item.producer], self.perm if name == "permuted" else None)
                cache = pool.cache(item)
                gen = torch.Generator().manual_seed(g.initial_seed())  # same content in both pools
                if item.kind == "ckv":
                    k = (torch.randn(n, 512, generator=gen) * 3).to(torch.bfloat16)
                    quantize_and_insert_ref(k.to(self.device), cache, slots.to(self.device), cache.shape[1])
                else:
                    rows = indexer_records(torch.randn(n, 128, generator=gen)).to(self.device)
                    scatter_records_ref(cache, slots.to(self.device), rows, FORMATS["ikv"])
        g = torch.Generator().manual_seed(zlib.crc32(f"buffers/{self.rank}/{step}".encode()))
        for layer in st.layers:  # an index source overwrites the shared top-k rows; 20 its candidates
            if t.is_index_source(layer):
                self.topk[:n] = torch.randint(-1, 4096, (n, t.index_topk), generator=g, dtype=torch.int32)
            if layer == t.candidate_source:
                self.cand[:n] = torch.randint(
                    -1, 2048, (n, t.candidate_blocks), generator=g, dtype=torch.int32
                )


def indexer_records(k: torch.Tensor) -> torch.Tensor:
    """[T, 132] indexer-K rows from fp32 keys: e = ceil(log2(max(amax,1e-4)/448)), e4m3(k·2^−e), fp32 2^e."""
    amax = k.abs().amax(-1, keepdim=True).clamp_min(1e-4)  # [T, 1]
    frac, exp = torch.frexp(amax.double() / 448.0)
    e = (exp - (frac == 0.5).to(exp.dtype)).double()
    q = (k.double() * torch.exp2(-e)).clamp(-448, 448).float().to(torch.float8_e4m3fn).view(torch.uint8)
    scale = torch.exp2(e).float().view(torch.uint8).reshape(k.shape[0], 4)
    return torch.cat([q, scale], 1)


# ----------------------------------------------------------------------------- one step, one stage
Send = Callable[[int, dict[str, torch.Tensor]], None]
Recv = Callable[[int, dict[str, torch.Tensor]], None]


def stage_step(
    rig: StageRig,
    step: int,
    tok: StepTokens,
    recv: Recv | None,
    send: Send | None,
    get_truth: Callable[[], dict[str, torch.Tensor]] | None = None,
) -> list[str]:
    """Receive + apply (both pools), check against the producers, produce, pack + send.

    Buffer rows are checked right after `apply` (a later index source on this stage overwrites them);
    replicas at the end of the step. Returns the mismatches (empty = byte-identical)."""
    n = tok.positions.shape[0]
    received: dict[str, dict[str, torch.Tensor]] = {}
    for pool in rig.pools:
        incoming = empty_payload(rig.plan, rig.rank, n, rig.device)
        if incoming and recv is not None:
            recv(rig.rank - 1, incoming)
        apply(rig.plan, rig.rank, n, rig.state(pool, tok), incoming)
        received[pool] = incoming
        rig.received_ids = received_ids(rig.plan, rig.rank, n, incoming)
    expected = get_truth() if get_truth is not None else {}
    bad = check_step(rig, tok, expected, persistent=False) if expected else []
    rig.produce(step, tok)
    for pool in rig.pools:
        out = pack(rig.plan, rig.rank, n, rig.state(pool, tok), received[pool])
        if out and send is not None:
            send(rig.rank + 1, out)
    if expected:
        bad += check_step(rig, tok, expected, persistent=True)
    return bad


def truth(rig: StageRig, tok: StepTokens) -> dict[str, torch.Tensor]:
    """What the producers on this stage hold for every item a later stage needs (test traffic)."""
    st = rig.plan.stages[rig.rank]
    out: dict[str, torch.Tensor] = {}
    blocks = sorted({b for tbl in tok.tables.values() for b in tbl})
    n = tok.positions.shape[0]
    for item in {i for s in rig.plan.stages for i in s.needs}:
        if not st.start <= item.producer < st.end:
            continue
        if item.persistent:
            for name, pool in rig.pools.items():
                ids = [rig.perm[b] for b in blocks] if name == "permuted" else blocks
                out[f"{item.key}/{name}"] = pool.region(item, ids).clone()
        elif item.kind == "ids":
            out[item.key] = tok.ids[:n].clone()
        else:
            out[item.key] = (rig.topk if item.kind == "topk" else rig.cand)[:n].clone()
    return out


def check_step(
    rig: StageRig, tok: StepTokens, expected: dict[str, torch.Tensor], *, persistent: bool
) -> list[str]:
    """Mismatches between this stage's replicas (or buffers) and the producers' bytes (empty = identical)."""
    bad = []
    blocks = sorted({b for tbl in tok.tables.values() for b in tbl})
    n = tok.positions.shape[0]
    for item in rig.plan.stages[rig.rank].needs:
        if item.persistent != persistent:
            continue
        if item.persistent:
            for name, pool in rig.pools.items():
                ids = [rig.perm[b] for b in blocks] if name == "permuted" else blocks
                got, want = pool.region(item, ids), expected[f"{item.key}/{name}"].to(rig.device)
                if not torch.equal(got, want):
                    idx = (got != want).nonzero()[0].tolist()
                    g, w = int(got[tuple(idx)]), int(want[tuple(idx)])
                    bad.append(
                        f"{item.key} ({name} ids): first differing byte [{idx[0]}, {idx[1]}]: {g} vs {w}"
                    )
        elif item.kind == "ids":
            got_ids = rig.received_ids
            if got_ids is None or not torch.equal(got_ids.cpu(), expected[item.key]):
                bad.append(f"{item.key}: the received token ids differ from the first stage's")
        else:
            buf = rig.topk if item.kind == "topk" else rig.cand
            if not torch.equal(buf[:n], expected[item.key].to(rig.device)):
                bad.append(f"{item.key}: buffer rows differ from the producer's")
    return bad


def replica_views_ok(rig: StageRig) -> bool:
    """Sanity: the replica views address distinct, in-pool pages (no overlap between items)."""
    for pool in rig.pools.values():
        spans = sorted((pool.offsets[i], pool.offsets[i] + pool.page_bytes(i)) for i in pool.items)
        if any(a[1] > b[0] for a, b in itertools.pairwise(spans)):
            return False
        for i in pool.items:
            record_views(pool.cache(i), FORMATS[i.kind])
    return True


def run_in_process(plan: Plan, device: torch.device | str, steps: tuple[Step, ...] | None = None) -> dict:
    """Every stage in this process, one after another per step (the one-GPU round trip)."""
    toks = schedule(steps or default_steps())
    rigs = [StageRig(plan, r, device) for r in range(len(plan.stages))]
    queues: dict[int, list[dict[str, torch.Tensor]]] = {r: [] for r in range(len(rigs))}

    def send(dst: int, tensors: dict[str, torch.Tensor]) -> None:
        queues[dst].append({k: v.clone() for k, v in tensors.items()})

    def recv(src: int, into: dict[str, torch.Tensor]) -> None:
        got = queues[src + 1].pop(0)
        for k, v in into.items():
            v.copy_(got[k])

    report: dict = {"steps": [], "mismatches": [], "payload_bytes": 0}
    for i, tok in enumerate(toks):
        truths: dict[str, torch.Tensor] = {}
        for rig in rigs:
            bad = stage_step(rig, i, tok, recv, send, lambda t=truths: t)
            report["mismatches"] += [f"step {i} stage {rig.rank}: {b}" for b in bad]
            truths.update(truth(rig, tok))
        report["steps"].append(int(tok.positions.shape[0]))
    report["checked_items"] = sorted({i.key for s in plan.stages for i in s.needs})
    return report
