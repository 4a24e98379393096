"""Paired log-ratio statistics: bootstrap CI over pairs, the A/A noise floor, MDE and pairs needed.

For pairs (a_i, b_i) of one run statistic, d_i = ln(b_i / a_i) and the estimate is exp(mean d).
The 95 % CI resamples pairs: percentile below 8 pairs, BCa (scipy) from 8 on, and none at all
below MIN_PAIRS (a "CI" from 2 pairs is the range of two numbers, not an interval).

The A/A noise floor comes from the A/A log-ratios themselves (two sessions of one build): their
offset from 0 (session drift) and their spread. floor = |mean| + t(0.975, n−1)·sd/√n is the
largest A/A effect the A/A pairs are consistent with; one A/A pair gives floor = |d|. An A/B
effect inside the floor is never called better or worse. The per-pair noise used for power is
σ = √(mean d²) over A/A pairs, which counts the offset as noise (an A/A pair's true effect is 0).
MDE = exp(max(floor, (z_α + z_β)·σ/√n)) − 1; pairs needed n = ((z_α + z_β)·σ / ln(1 + δ))².
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

Z_ALPHA, Z_POWER = 1.96, 0.84  # two-sided 5 %, 80 % power
BCA_MIN_PAIRS = 8
MIN_PAIRS = 5  # below this: no CI is printed and no better/worse claim is made


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]; NaN for an empty list."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True)
class RatioCI:
    ratio: float
    ci_low: float | None  # None below MIN_PAIRS
    ci_high: float | None
    n_pairs: int
    method: str = "paired_bootstrap_logratio"

    @property
    def has_ci(self) -> bool:
        return self.ci_low is not None and self.ci_high is not None


@dataclass(frozen=True)
class NoiseFloor:
    """What the A/A log-ratios say about session-to-session noise."""

    n_pairs: int
    offset: float  # mean A/A log-ratio: 0 without drift
    spread: float | None  # sd (ddof=1) of the A/A log-ratios; None from one pair
    sigma: float  # √(mean d²): per-pair noise, offset included
    floor: float  # log space: |offset| + t·spread/√n (|d| from one pair)

    @property
    def floor_rel(self) -> float:
        return math.expm1(self.floor)


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


def bootstrap_ratio(
    a: list[float | None],
    b: list[float | None],
    resamples: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
    min_pairs: int = MIN_PAIRS,
) -> RatioCI | None:
    d = log_ratios(a, b)
    if d.size == 0:
        return None
    est = float(np.exp(d.mean()))
    if d.size < min_pairs:
        return RatioCI(est, None, None, int(d.size))
    if np.allclose(d, d[0]):
        return RatioCI(est, est, est, int(d.size))
    if d.size >= BCA_MIN_PAIRS:
        res = sps.bootstrap(
            (d,),
            np.mean,
            n_resamples=resamples,
            confidence_level=level,
            method="BCa",
            random_state=np.random.default_rng(seed),
        )
        lo, hi = res.confidence_interval.low, res.confidence_interval.high
    else:
        rng = np.random.default_rng(seed)
        means = d[rng.integers(0, d.size, size=(resamples, d.size))].mean(axis=1)
        lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return RatioCI(est, float(np.exp(lo)), float(np.exp(hi)), int(d.size))


def aa_noise(d: np.ndarray, level: float = 0.95) -> NoiseFloor | None:
    """Noise floor from A/A log-ratios: offset from 0 plus the t-interval half-width of the mean."""
    d = np.asarray(d, dtype=float)
    if d.size == 0:
        return None
    offset = float(d.mean())
    sigma = float(np.sqrt(np.mean(d**2)))
    if d.size == 1:
        return NoiseFloor(1, offset, None, sigma, abs(offset))
    spread = float(np.std(d, ddof=1))
    t = float(sps.t.ppf((1 + level) / 2, d.size - 1))
    return NoiseFloor(int(d.size), offset, spread, sigma, abs(offset) + t * spread / math.sqrt(d.size))


def mde(noise: NoiseFloor | None, n_pairs: int) -> float | None:
    """Smallest relative effect this run could call: the A/A floor, or (z_α + z_β)·σ/√n if larger."""
    if noise is None or n_pairs < 1:
        return None
    return math.expm1(max(noise.floor, (Z_ALPHA + Z_POWER) * noise.sigma / math.sqrt(n_pairs)))


def pairs_needed(noise: NoiseFloor | None, delta: float | None) -> int | None:
    """n = ((z_α + z_β)·σ / ln(1 + δ))² pairs to detect a relative change δ; None when unknown or
    when the A/A offset alone is ≥ ln(1 + δ) (more pairs cannot separate δ from session drift)."""
    if noise is None or delta is None or delta <= 0:
        return None
    target = math.log1p(delta)
    if abs(noise.offset) >= target:
        return None
    return max(MIN_PAIRS, math.ceil(((Z_ALPHA + Z_POWER) * noise.sigma / target) ** 2))


def decide(
    ci: RatioCI | None,
    higher_is_better: bool,
    noise: NoiseFloor | None,
    *,
    comparable: bool,
    problems: str = "",
    aa_run: bool = False,
) -> tuple[str, str]:
    """(mark, why). asv marks: '-' better, '+' worse, '~' within noise, '!' invalid or missing runs,
    'x' not comparable, '?' no claim possible (too few pairs, or no A/A floor)."""
    if not comparable:
        return "x", "not comparable: parity failed or cell definitions differ"
    if problems:
        return "!", problems
    if ci is None:
        return "!", "no valid pair"
    if ci.n_pairs < MIN_PAIRS or not ci.has_ci:
        return "?", f"{ci.n_pairs} pair{'s' if ci.n_pairs != 1 else ''} < {MIN_PAIRS}: no CI, no claim"
    if noise is None:
        return "?", "no A/A pair: noise floor unknown, no claim"
    effect = abs(math.log(ci.ratio))
    contains_one = ci.ci_low <= 1.0 <= ci.ci_high  # type: ignore[operator]
    within = effect <= noise.floor
    if aa_run:
        why = "A/A run: both arms are the same build, so any difference is noise"
        if not contains_one and not within:
            why += " (CI excludes 1 beyond the A/A floor: session drift is larger than the A/A pairs show)"
        return "~", why
    if contains_one:
        return "~", "95 % CI contains 1"
    if within:
        return "~", f"|effect| {math.expm1(effect):.1%} ≤ A/A noise floor {noise.floor_rel:.1%}"
    better = ci.ratio > 1.0 if higher_is_better else ci.ratio < 1.0
    return ("-" if better else "+"), "95 % CI excludes 1 and |effect| > A/A noise floor"


def percentile_log_ratios(a_samples: list[list[float]], b_samples: list[list[float]], q: float) -> np.ndarray:
    """ln(P_q(b_i) / P_q(a_i)) per pair of runs with requests on both sides."""
    out = [
        math.log(percentile(b, q) / percentile(a, q))
        for a, b in zip(a_samples, b_samples, strict=False)
        if len(a) and len(b) and percentile(a, q) > 0 and percentile(b, q) > 0
    ]
    return np.array(out, dtype=float)


def two_level_ratio(
    a_samples: list[list[float]],
    b_samples: list[list[float]],
    q: float,
    resamples: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
    min_pairs: int = MIN_PAIRS,
) -> RatioCI | None:
    """Latency percentiles: resample pairs, then requests within each run (docs/AB_METHOD.md).

    a_samples[i] / b_samples[i] hold the per-request values of pair i; the statistic is the q-th
    percentile of each run and the estimate exp(mean_i ln(P_q(b_i) / P_q(a_i))).
    """
    pairs = [
        (np.asarray(a, float), np.asarray(b, float))
        for a, b in zip(a_samples, b_samples, strict=False)
        if len(a) and len(b)
    ]
    if not pairs:
        return None
    est = float(np.exp(np.mean([np.log(np.percentile(b, q) / np.percentile(a, q)) for a, b in pairs])))
    if len(pairs) < min_pairs:
        return RatioCI(est, None, None, len(pairs), "two_level_bootstrap")
    rng = np.random.default_rng(seed)

    def inner(x: np.ndarray) -> np.ndarray:  # [resamples] percentile of resampled requests
        return np.percentile(x[rng.integers(0, x.size, size=(resamples, x.size))], q, axis=1)

    d = np.stack([np.log(inner(b) / inner(a)) for a, b in pairs])  # [pairs, resamples]
    chosen = rng.integers(0, len(pairs), size=(resamples, len(pairs)))  # outer level: pairs
    draws = d[chosen, np.arange(resamples)[:, None]].mean(axis=1)
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return RatioCI(est, float(np.exp(lo)), float(np.exp(hi)), len(pairs), "two_level_bootstrap")


@dataclass(frozen=True)
class MeanShift:
    """A signed per-position difference series d_t (one document's NLL_B,t − NLL_A,t): its mean,
    sample SD, SE = SD/√n and z = mean/SE.

    Rounding noise of two kernels moves single positions by tenths of a nat either way (the tiny
    V4.1 run: per-position |ΔNLL| mean 0.15, p99 1.3), so a document's mean moves by about SD/√n
    by noise alone; a systematic error moves every position the same way, so its z grows like √n.
    """

    n: int
    mean: float
    sd: float | None  # None below 2 positions
    se: float | None
    z: float | None  # None below 2 positions; 0 when every d_t is 0; ±inf when all d_t are equal ≠ 0


def mean_shift(d: list[float], mean: float | None = None) -> MeanShift:
    """`mean` may be given when the caller computed it another way (the document NLL difference,
    so the reported value is the one `doc_dnll_abs_max` shows); it defaults to the mean of d."""
    n = len(d)
    if mean is None:
        mean = float(np.mean(d)) if n else float("nan")
    m = mean
    if n < 2:
        return MeanShift(n, m, None, None, None)
    sd = float(np.std(np.asarray(d, dtype=np.float64), ddof=1))
    se = sd / math.sqrt(n)
    if se == 0:
        z = 0.0 if m == 0 else math.copysign(math.inf, m)
    else:
        z = m / se
    return MeanShift(n, m, sd, se, z)
