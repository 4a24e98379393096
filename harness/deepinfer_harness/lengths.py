"""Input/output length distributions (ISL/OSL) for the open-loop cells, drawn from a stable seed.

A length is an integer (every request the same), `{mean, std, min, max}` (normal, rounded and
clipped to [min, max]) or `{min, max}` (uniform integers, both ends included), as `vllm bench
serve`'s random dataset and GuideLLM's synthetic data describe them. Draws come from numpy's
PCG64 seeded with a sha256 of the cell and the profile seed, so both arms and every session send
the same lengths; the realized mean and spread are reported per run (run_summary).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

NORMAL_KEYS = ("max", "mean", "min", "std")
UNIFORM_KEYS = ("max", "min")


def stable_seed(*parts: Any) -> int:
    """A seed that is the same on every machine and Python run (hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


def length_error(name: str, spec: Any) -> str | None:
    """One line naming what is wrong with a length spec, or None."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        return None if spec >= 1 else f"{name} = {spec!r}: must be an integer >= 1"
    if not isinstance(spec, dict):
        return f"{name} = {spec!r}: expected an integer, {{mean, std, min, max}} or {{min, max}}"
    keys = tuple(sorted(spec))
    if keys not in (NORMAL_KEYS, UNIFORM_KEYS):
        return f"{name} = {spec!r}: keys must be {{mean, std, min, max}} (normal) or {{min, max}} (uniform)"
    lo, hi = spec["min"], spec["max"]
    if not (float(lo).is_integer() and float(hi).is_integer() and 1 <= lo <= hi):
        return f"{name} = {spec!r}: min and max must be integers with 1 <= min <= max"
    if keys == NORMAL_KEYS:
        if spec["std"] < 0:
            return f"{name} = {spec!r}: std must be >= 0"
        if not lo <= spec["mean"] <= hi:
            return f"{name} = {spec!r}: mean must lie in [min, max]"
    return None


def max_length(spec: int | dict[str, float]) -> int:
    return spec if isinstance(spec, int) else int(spec["max"])


def nominal(spec: int | dict[str, float]) -> int:
    """The length a cell id names: the integer itself, the normal's mean, the uniform's midpoint."""
    if isinstance(spec, int):
        return spec
    if "mean" in spec:
        return max(1, round(spec["mean"]))
    return max(1, round((spec["min"] + spec["max"]) / 2))


def draw(spec: int | dict[str, float], n: int, seed: int) -> list[int]:
    """n lengths from `spec` (see the module docstring)."""
    if isinstance(spec, int):
        return [spec] * n
    rng = np.random.default_rng(seed)
    lo, hi = int(spec["min"]), int(spec["max"])
    if "mean" in spec:
        values = np.rint(rng.normal(spec["mean"], spec["std"], size=n))
    else:
        values = rng.integers(lo, hi + 1, size=n)
    return [int(v) for v in np.clip(values, lo, hi)]


def arrival_offsets_s(rate: float, arrival: str, n: int, seed: int) -> list[float]:
    """Send time of request i after the cell starts: constant gaps 1/rate, or Poisson arrivals
    (exponential gaps with mean 1/rate, the first request at 0); rate inf sends all at once."""
    if rate == float("inf"):
        return [0.0] * n
    if arrival == "constant":
        return [i / rate for i in range(n)]
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=max(n - 1, 0))
    return [0.0, *np.cumsum(gaps).tolist()]
