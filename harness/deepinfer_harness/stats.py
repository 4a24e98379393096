"""Paired log-ratio statistics: bootstrap CI over pairs, A/A noise floor, minimum detectable effect.

For pairs (a_i, b_i) of one run statistic, d_i = ln(b_i / a_i); the estimate is exp(mean d).
The 95 % CI resamples pairs (10,000 resamples): percentile below 8 pairs, BCa (scipy) from 8 on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

Z_ALPHA, Z_POWER = 1.96, 0.84  # two-sided 5 %, 80 % power
BCA_MIN_PAIRS = 8
UNDERPOWERED_PAIRS = 5


@dataclass(frozen=True)
class RatioCI:
    ratio: float
    ci_low: float
    ci_high: float
    n_pairs: int
    method: str = "paired_bootstrap_logratio"


def log_ratios(a: list[float | None], b: list[float | None]) -> np.ndarray:
    """ln(b/a) per pair; equal values (zeros included, e.g. an acceptance rate of 0) give 0."""
    out = []
    for x, y in zip(a, b, strict=False):
        if not isinstance(x, int | float) or not isinstance(y, int | float):
            continue
        if x == y and math.isfinite(x):
            out.append(0.0)
        elif x > 0 and y > 0 and math.isfinite(x) and math.isfinite(y):
            out.append(math.log(y / x))
    return np.array(out, dtype=float)


def bootstrap_ratio(a: list[float], b: list[float], resamples: int = 10_000, seed: int = 0,
                    level: float = 0.95) -> RatioCI | None:
    d = log_ratios(a, b)
    if d.size == 0:
        return None
    est = float(np.exp(d.mean()))
    if d.size == 1 or np.allclose(d, d[0]):
        return RatioCI(est, est, est, int(d.size))
    if d.size >= BCA_MIN_PAIRS:
        res = sps.bootstrap((d,), np.mean, n_resamples=resamples, confidence_level=level, method="BCa",
                            random_state=np.random.default_rng(seed))
        lo, hi = res.confidence_interval.low, res.confidence_interval.high
    else:
        rng = np.random.default_rng(seed)
        means = d[rng.integers(0, d.size, size=(resamples, d.size))].mean(axis=1)
        lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return RatioCI(est, float(np.exp(lo)), float(np.exp(hi)), int(d.size))


def noise_floor(aa: RatioCI | None) -> float | None:
    """Half-width of the A/A CI in log space (or |ln ratio| for a single pair)."""
    if aa is None:
        return None
    if aa.n_pairs == 1:
        return abs(math.log(aa.ratio))
    return (math.log(aa.ci_high) - math.log(aa.ci_low)) / 2


def mde(aa_log_ratios: np.ndarray, n_pairs: int) -> float | None:
    """Minimum detectable relative effect: (z_α + z_β)·σ_d/√n, with σ_d from A/A log-ratios."""
    if aa_log_ratios.size < 2 or n_pairs < 1:
        return None
    sigma = float(np.std(aa_log_ratios, ddof=1))
    return math.expm1((Z_ALPHA + Z_POWER) * sigma / math.sqrt(n_pairs))


def pairs_needed(sigma_d: float, delta: float) -> int:
    """n = ((z_α + z_β)·σ_d / ln(1 + δ))² pairs to detect a relative change δ."""
    return math.ceil(((Z_ALPHA + Z_POWER) * sigma_d / math.log1p(delta)) ** 2)


def mark(ci: RatioCI | None, higher_is_better: bool, floor: float | None, valid: bool,
         comparable: bool) -> str:
    """asv marks: '-' better, '+' worse, '~' within noise, '!' errors, 'x' not comparable, plus
    '?' underpowered (< 5 pairs): a 2-pair "CI" is the range of two log-ratios, no basis for a claim."""
    if not comparable:
        return "x"
    if not valid or ci is None:
        return "!"
    if ci.n_pairs < UNDERPOWERED_PAIRS:
        return "?"
    if ci.ci_low <= 1.0 <= ci.ci_high or (floor is not None and abs(math.log(ci.ratio)) <= floor):
        return "~"
    better = ci.ratio > 1.0 if higher_is_better else ci.ratio < 1.0
    return "-" if better else "+"


def two_level_ratio(a_samples: list[list[float]], b_samples: list[list[float]], q: float,
                    resamples: int = 10_000, seed: int = 0, level: float = 0.95) -> RatioCI | None:
    """Latency percentiles: resample pairs, then requests within each run (HARNESS.md §4).

    a_samples[i] / b_samples[i] hold the per-request values of pair i; the statistic is the q-th
    percentile of each run and the estimate exp(mean_i ln(P_q(b_i) / P_q(a_i))).
    """
    pairs = [(np.asarray(a, float), np.asarray(b, float)) for a, b in zip(a_samples, b_samples, strict=False)
             if len(a) and len(b)]
    if not pairs:
        return None
    rng = np.random.default_rng(seed)
    est = float(np.exp(np.mean([np.log(np.percentile(b, q) / np.percentile(a, q)) for a, b in pairs])))

    def inner(x: np.ndarray) -> np.ndarray:  # [resamples] percentile of resampled requests
        return np.percentile(x[rng.integers(0, x.size, size=(resamples, x.size))], q, axis=1)

    d = np.stack([np.log(inner(b) / inner(a)) for a, b in pairs])  # [pairs, resamples]
    chosen = rng.integers(0, len(pairs), size=(resamples, len(pairs)))  # outer level: pairs
    draws = d[chosen, np.arange(resamples)[:, None]].mean(axis=1)
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return RatioCI(est, float(np.exp(lo)), float(np.exp(hi)), len(pairs), "two_level_bootstrap")
