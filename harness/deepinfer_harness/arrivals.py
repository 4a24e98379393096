"""Open-loop arrival schedules: when request i of a rate cell is sent, from a stable seed.

The harness's first two processes are unchanged (`lengths.arrival_offsets_s`): `poisson`
(exponential gaps of mean 1/R, the first request at t = 0) and `constant` (gaps 1/R).

`gamma` is `vllm bench serve --burstiness B` (vLLM 0.32.0 `benchmarks/serve.py`, `get_request`),
re-implemented from its definition: request i waits a gamma-distributed delay of shape B and
scale 1/(R·B) — mean 1/R whatever B, coefficient of variation 1/√B — after request i − 1 (request
0 waits one such delay after the start too); B = 1 is the exponential (a Poisson process), B < 1
burstier, B > 1 more even, B = inf the constant 1/R. Without a ramp, vLLM then rescales the
cumulative delays so that the last request is sent at exactly n/R (its note: the raw sum misses
the target by 1–2 %, which moves throughput between seeds); so does this module, for a
count-bounded cell. A duration-bounded cell has no n to rescale to: its schedule is the raw draws.

A ramp (`vllm bench serve --ramp-up-strategy linear|exponential --ramp-up-start-rps S
--ramp-up-end-rps E`) gives request i its own rate: with progress p = i / max(n − 1, 1),
linear R_i = S + (E − S)·p, exponential R_i = S·(E/S)^p; its delay is drawn at R_i, and nothing
is rescaled. A duration-bounded ramp (no n known before the draws) takes p = t / D from the
previous request's send time t instead, so the rate reaches E as the duration ends.

Every draw is one unit variate from numpy's PCG64 (mean 1: Gamma(B, 1)/B, or Exp(1)), divided by
the request's rate, so one seed gives the same schedule on every machine, in both arms and in
every session.
"""

from __future__ import annotations

import math

import numpy as np

from deepinfer_harness.cells import Cell
from deepinfer_harness.lengths import arrival_offsets_s

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
    if arrival == "gamma":
        return rng.gamma(shape=burstiness, scale=1.0 / burstiness, size=size)
    return rng.standard_exponential(size)


def schedule(cell: Cell, n: int, seed: int, rate: float | None = None) -> list[float]:
    """Send times (s after the cell starts) of a rate cell's measured requests.

    `n` is the count of a count-bounded cell (ignored with `cell.duration_s`); `rate` overrides
    `cell.rate` (a sweep point's rate, measured by the run's probe)."""
    r = cell.rate if rate is None else rate
    if not r > 0:
        raise ValueError(f"{cell.id}: no rate to schedule (a sweep point needs its measured rate)")
    legacy = cell.arrival in ("poisson", "constant") and not cell.ramp and not cell.duration_s
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
    if cell.arrival != "gamma":  # poisson / constant: the first request at t = 0
        delays = [0.0, *delays[1:]] if delays else []
    offsets = np.cumsum(delays).tolist() if delays else []
    if cell.arrival == "gamma" and not cell.ramp and offsets and offsets[-1] > 0:
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
            if first and cell.arrival != "gamma":
                delay = 0.0  # poisson / constant: the first request at t = 0
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
