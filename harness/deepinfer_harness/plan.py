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
from dataclasses import asdict, dataclass, field, replace

from deepinfer_harness.arrivals import schedule
from deepinfer_harness.cells import EXTRA_FIELDS, POISSON_PROCESS, Cell
from deepinfer_harness.config import Profile, RatePlan
from deepinfer_harness.lengths import nominal, stable_seed
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
        if self.cell.arrival == "poisson" and not math.isinf(self.cell.rate):
            # vLLM's process since the harness named it so: a run recorded with the former
            # `poisson` (now `poisson0`) has another sha, and its resume refuses (manifest.py);
            # all at once (rate inf) sends the same with either, and keeps its sha
            data["cell"]["process"] = POISSON_PROCESS
        data["cell_id"] = self.id
        return data

    @property
    def sweep_probe(self) -> str | None:
        """A sweep point's all-at-once probe cell (its measured throughput T), else None."""
        return self.params.get("sweep_probe")

    @property
    def sweep_sync(self) -> str | None:
        """A sweep point's synchronous anchor cell (its measured rate S), else None (a point of
        the former anchor, k/N of T, has none)."""
        return self.params.get("sweep_sync")

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
    cells += rate_cells(p.rate)
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


def rate_cells(r: RatePlan) -> list[CellDef]:
    """The open-loop cells: per arrival process (and, for gamma, per burstiness) one count-bounded
    cell per rate, one per ramp, one duration-bounded cell per finite rate or ramp and duration,
    and the sweep's points; rate inf (all at once) once, for the first process."""
    params: dict = {"isl": r.isl, "osl": r.osl, "seed": r.seed, "max_concurrency": r.max_concurrency}
    if r.workload == "sharegpt" and not isinstance(r.isl, int):  # its own lengths: sharegpt.py
        params["prompts"] = CONVERSATIONS
    processes = [
        {"arrival": a, "burstiness": b if a == "gamma" else 0.0}
        for a in r.arrivals
        for b in (r.burstiness if a == "gamma" else [0.0])
    ]
    # all at once: the arrival process makes no difference, so rate inf is the first process's
    base = Cell("rate", nominal(r.isl), nominal(r.osl), 1, r.workload, math.inf, **processes[0])
    probe = base
    synchronous = replace(base, synchronous=True)  # GuideLLM's first anchor: one at a time
    out: list[CellDef] = []
    for process in processes:
        for rate in r.rates:
            if math.isinf(rate) and process != processes[0]:
                continue
            out.append(CellDef(replace(base, rate=rate, **process), n=r.n, warmup=r.warmup, params=params))
        shapes = [{"rate": x, "ramp": "", "ramp_end": 0.0} for x in r.rates if math.isfinite(x)]
        ramps = [{"rate": x.start_rps, "ramp": x.strategy, "ramp_end": x.end_rps} for x in r.ramps]
        for ramp in ramps:
            out.append(CellDef(replace(base, **process, **ramp), n=r.n, warmup=r.warmup, params=params))
        for d in r.durations_s:
            for shape in shapes + ramps:
                cell = replace(base, **process, **shape, duration_s=d)
                n = len(schedule(cell, 0, rate_seed(r.seed, cell)))  # the seeded schedule's own count
                if n == 0:
                    raise ValueError(f"{cell.id} schedules no request in {d:g} s: lengthen the duration")
                out.append(CellDef(cell, n=n, warmup=r.warmup, params=params))
        if r.sweep.points:
            of = r.sweep.points + 1
            for k in range(1, of):
                cell = replace(base, rate=0.0, **process, sweep_k=k, sweep_of=of, sweep_between=True)
                # the cells whose measured rates place the point: S (synchronous) and T (all at once)
                sweep = params | {"sweep_probe": probe.id, "sweep_sync": synchronous.id}
                out.append(CellDef(cell, n=r.n, warmup=r.warmup, params=sweep))
    if r.sweep.points and probe.id not in {c.id for c in out}:
        out.append(CellDef(probe, n=r.n, warmup=r.warmup, params=params))
    if r.sweep.points:
        out.append(CellDef(synchronous, n=r.n, warmup=r.warmup, params=params))
    return out


def rate_seed(seed: int, cell: Cell) -> int:
    """The arrival schedule's seed of a rate cell (lengths take the ones before it: run_rate)."""
    return stable_seed(seed, cell.id) + 2


def session_order(cells: list[CellDef], seed: int) -> list[CellDef]:
    """One fixed shuffled order, used by every session of the run; sweep points go last, after
    the probe that sets their rates (a plan without a sweep keeps its order unchanged)."""
    order = sorted(cells, key=lambda c: c.id)
    random.Random(seed).shuffle(order)
    return [c for c in order if not c.cell.is_sweep_point] + [c for c in order if c.cell.is_sweep_point]


def abba_schedule(repetitions: int) -> list[Session]:
    sessions, reps = [], {"A": 0, "B": 0}
    for block in range(repetitions):
        for variant in "ABBA" if block % 2 == 0 else "BAAB":
            sessions.append(Session(len(sessions), variant, reps[variant]))
            reps[variant] += 1
    return sessions
