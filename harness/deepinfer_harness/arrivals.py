"""Open-loop arrival schedules: when request i of a rate cell is sent, from a stable seed.

`poisson` is `vllm bench serve --request-rate R` with its default `--burstiness 1` (vLLM 0.32.0
`vllm/benchmarks/serve.py`, `get_request`), re-implemented from its definition, never copied:
request i waits an exponential delay of mean 1/R after request i − 1, and request 0 waits one such
delay after the start too (no request at t = 0); a count-bounded cell without a ramp then has its
cumulative delays rescaled so that the last request is sent at exactly n/R (vLLM's note: the raw
sum misses n/R by 1–2 %, which moves throughput between seeds). It is the gamma process below at
B = 1, and draws the same variates: `poisson` and `gamma` with burstiness 1 send the same schedule.

`gamma` is `vllm bench serve --burstiness B`: request i waits a gamma-distributed delay of shape B
and scale 1/(R·B) — mean 1/R whatever B, coefficient of variation 1/√B — after request i − 1
(request 0 too); B < 1 burstier, B > 1 more even, B = inf the constant 1/R; rescaled to n/R as
`poisson` is. A duration-bounded cell has no n to rescale to: its schedule is the raw draws.

`poisson0` is the harness's own process before `poisson` was made vLLM's (runs recorded with
`poisson` before then read as `poisson0`; harness/README, "Arrival processes"): exponential gaps
of mean 1/R with the first request at t = 0 and no rescaling (`lengths.arrival_offsets_s`, bit for
bit). `constant` sends at i/R: vLLM's `--burstiness inf` gaps, but from t = 0 (vLLM's first
request waits 1/R), unchanged since the harness began.

A ramp (`vllm bench serve --ramp-up-strategy linear|exponential --ramp-up-start-rps S
--ramp-up-end-rps E`) gives request i its own rate: with progress p = i / max(n − 1, 1),
linear R_i = S + (E − S)·p, exponential R_i = S·(E/S)^p; its delay is drawn at R_i, and nothing
is rescaled. A duration-bounded ramp (no n known before the draws) takes p = t / D from the
previous request's send time t instead, so the rate reaches E as the duration ends.

Every draw is one unit variate from numpy's PCG64 (mean 1: Gamma(B, 1)/B, Gamma(1, 1) for
`poisson`, Exp(1) for `poisson0`), divided by the request's rate, so one seed gives the same
schedule on every machine, in both arms and in every session (vLLM draws from numpy's global
legacy generator seeded by --seed: the same process, not the same numbers).
"""

from __future__ import annotations

import math

import numpy as np

from deepinfer_harness.cells import Cell
from deepinfer_harness.lengths import arrival_offsets_s

VLLM_PROCESSES = ("poisson", "gamma")  # request 0 waits one delay; count cells end at n/R
MAX_SCHEDULED = 1_000_000  # requests one duration-bounded cell may schedule (memory, not policy)
_CHUNK = 4096


def ramp_rate(strategy: str, start: float, end: float, progress: float) -> float:
    """The request rate at `progress` in [0, 1] of a ramp from `start` to `end` requests/s."""
    p = min(max(progress, 0.0), 1.0)
    if strategy == "linear":
        return start + (end - start) * p
    if strategy == "exponential":
        return start * (end / start) ** p
    raise ValueError(f"unknown ramp strategy {strategy!r}")


def _unit_draws(rng: np.random.Generator, arrival: str, burstiness: float, size: int) -> np.ndarray:
    """`size` positive variates of mean 1: the delay at rate 1 of the arrival process."""
    if arrival == "constant" or (arrival == "gamma" and math.isinf(burstiness)):
        return np.ones(size)
    if arrival in VLLM_PROCESSES:  # poisson: the gamma process at B = 1, the same variates
        shape = burstiness if arrival == "gamma" else 1.0
        return rng.gamma(shape=shape, scale=1.0 / shape, size=size)
    return rng.standard_exponential(size)  # poisson0


def schedule(cell: Cell, n: int, seed: int, rate: float | None = None) -> list[float]:
    """Send times (s after the cell starts) of a rate cell's measured requests.

    `n` is the count of a count-bounded cell (ignored with `cell.duration_s`); `rate` overrides
    `cell.rate` (a sweep point's rate, measured by the run's probe)."""
    r = cell.rate if rate is None else rate
    if not r > 0:
        raise ValueError(f"{cell.id}: no rate to schedule (a sweep point needs its measured rate)")
    legacy = cell.arrival in ("poisson0", "constant") and not cell.ramp and not cell.duration_s
    if legacy:  # the harness's original processes, bit for bit (runs written before resume alike)
        return arrival_offsets_s(r, cell.arrival, n, seed)
    if math.isinf(r):
        return [0.0] * n
    rng = np.random.default_rng(seed)
    if cell.duration_s:
        return _until(cell, r, rng)
    units = _unit_draws(rng, cell.arrival, cell.burstiness, n)
    rates = [ramp_rate(cell.ramp, r, cell.ramp_end, i / max(n - 1, 1)) if cell.ramp else r for i in range(n)]
    delays = [float(u) / ri for u, ri in zip(units, rates, strict=True)]
    if cell.arrival not in VLLM_PROCESSES:  # poisson0 / constant: the first request at t = 0
        delays = [0.0, *delays[1:]] if delays else []
    offsets = np.cumsum(delays).tolist() if delays else []
    if cell.arrival in VLLM_PROCESSES and not cell.ramp and offsets and offsets[-1] > 0:
        scale = (n / r) / offsets[-1]  # vllm bench serve: the last request at exactly n/R
        offsets = [t * scale for t in offsets]
    return [float(t) for t in offsets]


def _until(cell: Cell, r: float, rng: np.random.Generator) -> list[float]:
    """The send times the process puts in [0, duration_s), drawn in chunks until one falls past."""
    out: list[float] = []
    t = 0.0
    first = True
    while True:
        for u in _unit_draws(rng, cell.arrival, cell.burstiness, _CHUNK):
            rate = ramp_rate(cell.ramp, r, cell.ramp_end, t / cell.duration_s) if cell.ramp else r
            if first and cell.arrival not in VLLM_PROCESSES:
                delay = 0.0  # poisson0 / constant: the first request at t = 0
            else:
                delay = float(u) / rate
            first = False
            t += delay
            if t >= cell.duration_s:
                return out
            out.append(t)
            if len(out) > MAX_SCHEDULED:
                raise ValueError(
                    f"{cell.id}: more than {MAX_SCHEDULED} requests in {cell.duration_s:g} s; "
                    "shorten the duration or lower the rate"
                )


def expected_requests(cell: Cell) -> float:
    """About how many requests a duration-bounded cell schedules (rate × duration, or the ramp's
    mean rate × duration): the profile check bounds it before any draw."""
    if not cell.duration_s:
        return 0.0
    if not cell.ramp:
        return cell.rate * cell.duration_s
    if cell.ramp == "linear":
        return (cell.rate + cell.ramp_end) / 2 * cell.duration_s
    ratio = cell.ramp_end / cell.rate
    return cell.rate * (ratio - 1) / math.log(ratio) * cell.duration_s
