"""Intervals that are not paired A/B ratios (those are stats.py's): an arm's mean over its valid
runs, and the ratio of two independent sets of runs (another run directory: other sessions, maybe
another machine, so nothing pairs them).

mean_ci: the arithmetic mean of the finite values (the arm estimate ab.py reports) with a Student t
95 % interval of the mean. welch_ratio: exp(mean ln y − mean ln x), the ratio of geometric means
(the same log scale as the paired B/A), with a Welch t interval on the ln values (two sets without
spread give the point itself). Both print an interval only from MIN_RUNS values on each side, the
floor the paired CI keeps (stats.MIN_PAIRS): from two runs a t interval is ±12.7 sd/√2, wider than
anything it could show. Neither claims better or worse: without pairing and without an A/A floor
there is no mark.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from scipy import stats as sps

from deepinfer_harness.analysis.stats import MIN_PAIRS, exp_safe, positive

LEVEL = 0.95
MIN_RUNS = MIN_PAIRS


def finite_values(values: Iterable[Any]) -> list[float]:
    """The finite numbers among `values` (None, strings, bools, NaN and ±inf are no measurement)."""
    return [
        float(v)
        for v in values
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    ]


@dataclass(frozen=True)
class MeanCI:
    mean: float
    low: float | None  # None below MIN_RUNS values
    high: float | None
    n: int

    @property
    def has_ci(self) -> bool:
        return self.low is not None and self.high is not None


def mean_ci(values: Iterable[Any], level: float = LEVEL, min_n: int = MIN_RUNS) -> MeanCI | None:
    """Mean and t interval of the finite values (no interval below `min_n`); None when there is
    no finite value."""
    vals = finite_values(values)
    if not vals:
        return None
    mean = statistics.fmean(vals)
    if len(vals) < max(min_n, 2):
        return MeanCI(mean, None, None, len(vals))
    half = float(sps.t.ppf((1 + level) / 2, len(vals) - 1)) * statistics.stdev(vals) / math.sqrt(len(vals))
    return MeanCI(mean, mean - half, mean + half, len(vals))


@dataclass(frozen=True)
class IndependentRatio:
    ratio: float
    low: float | None  # None below MIN_RUNS values on either side
    high: float | None
    n_ref: int
    n_other: int
    method: str = "ratio_of_geometric_means_welch_t"


def welch_ratio(
    ref: Iterable[Any], other: Iterable[Any], level: float = LEVEL, min_n: int = MIN_RUNS
) -> IndependentRatio | None:
    """other / ref for two independent sets of runs (no interval below `min_n` on either side);
    None unless each has a positive finite value."""
    x = [math.log(v) for v in finite_values(ref) if positive(v)]
    y = [math.log(v) for v in finite_values(other) if positive(v)]
    if not x or not y:
        return None
    d = statistics.fmean(y) - statistics.fmean(x)
    est = exp_safe(d)
    if min(len(x), len(y)) < max(min_n, 2):
        return IndependentRatio(est, None, None, len(x), len(y))
    vx, vy = statistics.variance(x) / len(x), statistics.variance(y) / len(y)
    se = math.sqrt(vx + vy)
    if se == 0:
        return IndependentRatio(est, est, est, len(x), len(y))
    df = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
    half = float(sps.t.ppf((1 + level) / 2, df)) * se
    return IndependentRatio(est, exp_safe(d - half), exp_safe(d + half), len(x), len(y))
