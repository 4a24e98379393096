"""Plan: the cells a profile asks for (with a definition hash each) and the ABBA session schedule.

A session is one server start of one variant (or, with `schedule: concurrent`, one block of
traffic to an already-running arm). Blocks alternate ABBA, BAAB, …; the k-th session of each
variant is its rep k, and pairs are (A rep k, B rep k). Every session runs every cell once in
one fixed shuffled order.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import asdict, dataclass, field

from deepinfer_harness.cells import EXTRA_FIELDS, Cell
from deepinfer_harness.config import Profile
from deepinfer_harness.lengths import nominal
from deepinfer_harness.sharegpt import CONVERSATIONS


@dataclass(frozen=True)
class CellDef:
    cell: Cell
    n: int = 1  # measured requests (prefill/ttft/greedy) or documents (nll)
    warmup: int = 1
    warmup_s: float = 0.0
    window_s: float = 0.0
    min_steps: int = 0
    params: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def id(self) -> str:
        return self.cell.id

    def definition(self) -> dict:
        data = asdict(self)
        for name, default in EXTRA_FIELDS.items():  # unchanged hashes for the original kinds
            if data["cell"][name] == default:
                del data["cell"][name]
        data["cell_id"] = self.id
        return data

    @property
    def conversation_prompts(self) -> bool:
        """Sends whole conversations of the user's ShareGPT file, not windows (sharegpt.py)."""
        return self.params.get("prompts") == CONVERSATIONS

    @property
    def definition_sha256(self) -> str:
        blob = json.dumps(self.definition(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()


@dataclass(frozen=True)
class Session:
    index: int
    variant: str
    rep: int


def build_cells(profile: Profile) -> list[CellDef]:
    p = profile.plan
    cells: list[CellDef] = []
    w = p.prefill.workload
    for isl in p.prefill.isls:
        n = p.prefill.n_long if isl >= p.prefill.long_isl else p.prefill.n
        cells.append(CellDef(Cell("prefill-cold", isl, workload=w), n=n))
    for spec in p.prefill.concurrent:
        cell = Cell("prefill-cold", spec["isl"], 1, spec["c"], w)
        cells.append(CellDef(cell, n=spec.get("n", spec["c"])))
    for isl in p.ttft_isls:
        cells.append(CellDef(Cell("ttft", isl, workload=p.ttft_workload), n=p.ttft_n))
    for d in (p.decode, p.long_decode):
        for workload in d.workloads:
            for c in d.concurrencies:
                cells.append(
                    CellDef(
                        Cell("decode", d.isl, d.osl, c, workload),
                        warmup_s=d.warmup_s,
                        window_s=d.window_s,
                        min_steps=d.min_steps,
                    )
                )
    for spec in p.nll:
        cells.append(CellDef(Cell("nll", spec["isl"], workload=p.nll_workload), n=spec["docs"], warmup=0))
    g = p.greedy
    for c in g.concurrencies:
        cells.append(CellDef(Cell("greedy", g.isl, g.osl, c, g.workload), n=max(g.n, c), warmup=0))
    r = p.rate
    for arrival in r.arrivals:
        for rate in r.rates:
            if math.isinf(rate) and arrival != r.arrivals[0]:
                continue  # all at once: the arrival process makes no difference
            cell = Cell("rate", nominal(r.isl), nominal(r.osl), 1, r.workload, rate, arrival)
            params = {"isl": r.isl, "osl": r.osl, "seed": r.seed, "max_concurrency": r.max_concurrency}
            if r.workload == "sharegpt" and not isinstance(r.isl, int):  # its own lengths: sharegpt.py
                params["prompts"] = CONVERSATIONS
            cells.append(CellDef(cell, n=r.n, warmup=r.warmup, params=params))
    for spec in p.shared_prefix:
        cell = Cell(
            "prefix", spec["isl"], spec["osl"], spec["c"], p.shared_prefix_workload, prefix=spec["prefix"]
        )
        cells.append(CellDef(cell, n=spec["n"]))
    ch = p.chat
    for c in ch.concurrencies:
        cell = Cell("chat", ch.isl, ch.osl, c, ch.workload)
        params: dict = {"thinking": ch.thinking}
        if ch.workload == "sharegpt":  # one conversation per request, its own turns: sharegpt.py
            params["prompts"] = CONVERSATIONS
        cells.append(CellDef(cell, n=max(ch.n, c), params=params))
    ids = [c.id for c in cells]
    duplicates = {i for i in ids if ids.count(i) > 1}
    if duplicates:
        raise ValueError(f"plan has duplicate cells: {sorted(duplicates)}")
    return cells


def session_order(cells: list[CellDef], seed: int) -> list[CellDef]:
    """One fixed shuffled order, used by every session of the run."""
    order = sorted(cells, key=lambda c: c.id)
    random.Random(seed).shuffle(order)
    return order


def abba_schedule(repetitions: int) -> list[Session]:
    sessions, reps = [], {"A": 0, "B": 0}
    for block in range(repetitions):
        for variant in "ABBA" if block % 2 == 0 else "BAAB":
            sessions.append(Session(len(sessions), variant, reps[variant]))
            reps[variant] += 1
    return sessions
