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

Ratios of zero. Where 0 is a measured value (an acceptance rate, goodput: Metric.zero_is_value),
A = 0, B > 0 is the most informative pair there is and 0 in both arms says nothing about a ratio;
when any pair holds a 0 the estimate is the ratio of sums ΣB/ΣA over the pairs (0 in both adds
nothing, A = 0 < B moves it up, all zero is 1: the arms are equal), its CI the same statistic over
resampled pairs (percentile): no pair is dropped and none counts as B/A = 1. Where 0 is a failed
measurement (a 0 ms latency), a pair with a 0 on either side, both included, is left out and named
(never counted as B/A = 1). A pair with a negative, an inf, a NaN or a missing value has no ratio
(`undefined_pair`); it is left out and named, and a row left with no pair is `?` with that reason.
Nothing here raises on a value or lets numpy warn.
Every percentile (a run's p<q>, and each resample's in the two-level bootstrap) is
`percentile_rows`: one implementation.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

Z_ALPHA, Z_POWER = 1.96, 0.84  # two-sided 5 %, 80 % power
BCA_MIN_PAIRS = 8
MIN_PAIRS = 5  # below this: no CI is printed and no better/worse claim is made
_LOG_MAX = math.log(np.finfo(float).max)  # exp() of more overflows


def percentile_rows(x: np.ndarray, q: float) -> np.ndarray:
    """The one percentile of the harness: linear interpolation between the closest ranks (numpy's
    default, as `vllm bench serve` computes its percentiles), q in [0, 100], of each row of `x`
    (the last axis); a row holding a NaN gives NaN."""
    x = np.asarray(x, dtype=float)
    if x.shape[-1] == 0:
        return np.full(x.shape[:-1], np.nan)
    return np.asarray(np.percentile(x, q, axis=-1), dtype=float)


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """One sample's percentile (`percentile_rows` of one row); NaN for an empty sample."""
    return float(percentile_rows(np.asarray(values, dtype=float).reshape(1, -1), q)[0])


def exp_safe(x: float) -> float:
    """exp(x) without OverflowError: inf past the largest float."""
    return math.inf if x > _LOG_MAX else math.exp(x)


def expm1_safe(x: float) -> float:
    return math.inf if x > _LOG_MAX else math.expm1(x)


def positive(x: Any) -> bool:
    """A number a log-ratio can use: finite and > 0."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _nonneg(x: Any) -> bool:
    """A number the ratio of sums can use: finite and >= 0 (zeros included)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _sum_ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ΣB/ΣA along the last axis: 1 where both sums are 0, inf where only ΣA is."""
    sa, sb = a.sum(axis=-1), b.sum(axis=-1)
    out = np.ones(np.broadcast(sa, sb).shape)
    np.divide(sb, sa, out=out, where=sa > 0)
    out[(sa == 0) & (sb > 0)] = np.inf
    return out


def zero_pairs(a: list[Any], b: list[Any]) -> bool:
    """Some pair holds a 0 and every pair is two finite non-negative numbers: ratio of sums."""
    pairs = list(zip(a, b, strict=False))
    return bool(pairs) and all(_nonneg(x) and _nonneg(y) for x, y in pairs) and any(0 in p for p in pairs)


def ratio_of_sums(
    a: list[Any], b: list[Any], resamples: int, seed: int, level: float, min_pairs: int
) -> RatioCI:
    """ΣB/ΣA over the pairs, with a percentile CI over resampled pairs (module docstring)."""
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    est = float(_sum_ratio(xa, xb))
    if xa.size < min_pairs:
        return RatioCI(est, None, None, int(xa.size), method="paired_bootstrap_ratio_of_sums")
    idx = np.random.default_rng(seed).integers(0, xa.size, size=(resamples, xa.size))
    boot = _sum_ratio(xa[idx], xb[idx])
    # an order statistic, not an interpolation: resamples may be inf (ΣA = 0), and inf − inf is NaN
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2], method="inverted_cdf")
    return RatioCI(est, float(lo), float(hi), int(xa.size), method="paired_bootstrap_ratio_of_sums")


def _same(x: Any, y: Any) -> bool:
    """Two equal finite numbers (zeros included): their log-ratio is 0 by convention."""
    return isinstance(x, int | float) and isinstance(y, int | float) and math.isfinite(x) and x == y


def undefined_pair(a: Any, b: Any, zero_is_value: bool = False) -> str | None:
    """Why ln(b/a) is undefined for one pair (`A = 0`, `B = inf`, `A missing`), or None when it is
    defined. Equal finite values give 0 (e.g. an acceptance rate of 0 in both arms); a 0, a
    negative, an inf or a NaN on one side has no log-ratio, nor has a missing value."""
    if positive(a) and positive(b):
        return None
    if zero_is_value and ((_nonneg(a) and _nonneg(b)) or _same(a, b)):
        return None
    if not zero_is_value and _same(a, b) and a != 0:
        return None
    parts = []
    for arm, x in (("A", a), ("B", b)):
        if isinstance(x, bool) or not isinstance(x, int | float):
            parts.append(f"{arm} missing")
        elif x == 0 and not zero_is_value and _same(a, b):
            parts.append(f"{arm} = 0")
        elif not positive(x):
            parts.append(f"{arm} = {x:g}")
    return " and ".join(parts)


def log_ratio_array(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """ln(num/den) elementwise: 0 where both are the same finite number, NaN where either side is
    not a finite positive number (never a warning, never ±inf)."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    ok = np.isfinite(num) & np.isfinite(den) & (num > 0) & (den > 0)
    out = np.full(np.broadcast(num, den).shape, np.nan)
    np.log(num / np.where(ok, den, 1.0), out=out, where=ok)
    out[np.isfinite(num) & (num == den)] = 0.0
    return out


@dataclass(frozen=True)
class RatioCI:
    ratio: float
    ci_low: float | None  # None below MIN_PAIRS, or where no interval exists (no_ci says why)
    ci_high: float | None
    n_pairs: int
    method: str = "paired_bootstrap_logratio"
    no_ci: str = ""  # why there is no interval although there are enough pairs

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
        return expm1_safe(self.floor)


def log_ratios(a: list[Any], b: list[Any]) -> np.ndarray:
    """ln(b/a) per pair of two positive finite numbers; equal values (zeros included, e.g. an
    acceptance rate of 0) give 0; any other pair has no log-ratio and is skipped."""
    out = []
    for x, y in zip(a, b, strict=False):
        if (positive(x) and positive(y)) or _same(x, y):
            out.append(0.0 if _same(x, y) else math.log(y / x))
    return np.array(out, dtype=float)


def _interval(d: np.ndarray, resamples: int, seed: int, level: float) -> tuple[float, float]:
    """Bootstrap interval of mean(d) in log space: BCa from BCA_MIN_PAIRS, else percentile; a BCa
    that cannot be computed (scipy warns and returns NaN) falls back to the percentile interval."""
    if d.size >= BCA_MIN_PAIRS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scipy's DegenerateDataWarning: handled below
            res = sps.bootstrap(
                (d,),
                np.mean,
                n_resamples=resamples,
                confidence_level=level,
                method="BCa",
                random_state=np.random.default_rng(seed),
            )
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(lo) and math.isfinite(hi):
            return lo, hi
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(resamples, d.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def bootstrap_ratio(
    a: list[Any],
    b: list[Any],
    resamples: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
    min_pairs: int = MIN_PAIRS,
) -> RatioCI | None:
    """Paired bootstrap of exp(mean ln(b/a)) over the pairs with a defined log-ratio; None when
    no pair has one (the caller names the pairs left out: `undefined_pair`). Pairs holding a 0:
    the ratio of sums instead (module docstring)."""
    if zero_pairs(a, b):
        return ratio_of_sums(a, b, resamples, seed, level, min_pairs)
    d = log_ratios(a, b)
    if d.size == 0:
        return None
    est = exp_safe(float(d.mean()))
    if d.size < min_pairs:
        return RatioCI(est, None, None, int(d.size))
    if np.allclose(d, d[0]):
        return RatioCI(est, est, est, int(d.size))
    lo, hi = _interval(d, resamples, seed, level)
    return RatioCI(est, exp_safe(lo), exp_safe(hi), int(d.size))


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
    return expm1_safe(max(noise.floor, (Z_ALPHA + Z_POWER) * noise.sigma / math.sqrt(n_pairs)))


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
    left_out: str = "",
) -> tuple[str, str]:
    """(mark, why). asv marks: '-' better, '+' worse, '~' within noise, '!' invalid or missing runs
    (only that), 'x' not comparable, '?' no claim possible: too few pairs, no A/A floor, or no
    defined ratio (a metric of 0, inf or NaN on one side, or missing). `left_out` names the pairs
    whose ratio is undefined (`undefined_pair`); the rest decide. Never raises on a value."""
    if not comparable:
        return "x", "not comparable: parity failed or cell definitions differ"
    if problems:
        return "!", problems
    note = f"; pairs left out (no defined B/A): {left_out}" if left_out else ""
    if ci is None:
        if left_out:
            return "?", f"no pair with a defined B/A ratio: {left_out}"
        return "?", "no pair with a value in both arms"
    if not positive(ci.ratio):
        return "?", f"B/A ratio {ci.ratio:g} is not a positive finite number: no claim{note}"
    if ci.n_pairs < MIN_PAIRS or not ci.has_ci:
        if ci.n_pairs >= MIN_PAIRS and ci.no_ci:
            return "?", f"{ci.no_ci}{note}"
        return "?", f"{ci.n_pairs} pair{'s' if ci.n_pairs != 1 else ''} < {MIN_PAIRS}: no CI, no claim{note}"
    if noise is None:
        return "?", f"no A/A pair: noise floor unknown, no claim{note}"
    low, high = ci.ci_low, ci.ci_high
    assert low is not None and high is not None
    if not (positive(low) and positive(high)):
        return "?", f"95 % CI {low:g}–{high:g} is not a positive finite interval: no claim{note}"
    effect = abs(math.log(ci.ratio))
    contains_one = low <= 1.0 <= high
    within = effect <= noise.floor
    if aa_run:
        why = "A/A run: both arms are the same build, so any difference is noise"
        if not contains_one and not within:
            why += " (CI excludes 1 beyond the A/A floor: session drift is larger than the A/A pairs show)"
        return "~", why + note
    if contains_one:
        return "~", "95 % CI contains 1" + note
    if within:
        return "~", f"|effect| {expm1_safe(effect):.1%} ≤ A/A noise floor {noise.floor_rel:.1%}{note}"
    better = ci.ratio > 1.0 if higher_is_better else ci.ratio < 1.0
    return ("-" if better else "+"), "95 % CI excludes 1 and |effect| > A/A noise floor" + note


def percentile_log_ratios(a_samples: list[list[float]], b_samples: list[list[float]], q: float) -> np.ndarray:
    """ln(P_q(b_i) / P_q(a_i)) per pair of runs whose percentiles have a defined log-ratio."""
    out = [
        0.0 if _same(pa, pb) else math.log(pb / pa)
        for a, b in zip(a_samples, b_samples, strict=False)
        if len(a) and len(b)
        for pa, pb in [(percentile(a, q), percentile(b, q))]
        if undefined_pair(pa, pb) is None
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
    percentile of each run and the estimate exp(mean_i ln(P_q(b_i) / P_q(a_i))) over the pairs
    whose percentiles have a defined log-ratio (`undefined_pair`: a percentile of 0 has none). A
    resampled run whose percentile is 0 on one side only (a run mostly of zeros) leaves the
    interval undefined: no CI, and `no_ci` says why.
    """
    pairs = [
        (np.asarray(a, float), np.asarray(b, float))
        for a, b in zip(a_samples, b_samples, strict=False)
        if len(a) and len(b) and undefined_pair(percentile(a, q), percentile(b, q)) is None
    ]
    if not pairs:
        return None
    method = "two_level_bootstrap"
    d0 = log_ratio_array(
        np.array([percentile(b, q) for _, b in pairs]), np.array([percentile(a, q) for a, _ in pairs])
    )
    est = exp_safe(float(d0.mean()))
    if len(pairs) < min_pairs:
        return RatioCI(est, None, None, len(pairs), method)
    rng = np.random.default_rng(seed)

    def inner(x: np.ndarray) -> np.ndarray:  # [resamples] percentile of resampled requests
        return percentile_rows(x[rng.integers(0, x.size, size=(resamples, x.size))], q)

    d = np.stack([log_ratio_array(inner(b), inner(a)) for a, b in pairs])  # [pairs, resamples]
    if not np.isfinite(d).all():
        return RatioCI(
            est,
            None,
            None,
            len(pairs),
            method,
            f"a resampled p{q:g} is 0 in one arm only (a run mostly of zero values): no CI, no claim",
        )
    chosen = rng.integers(0, len(pairs), size=(resamples, len(pairs)))  # outer level: pairs
    draws = d[chosen, np.arange(resamples)[:, None]].mean(axis=1)
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return RatioCI(est, exp_safe(float(lo)), exp_safe(float(hi)), len(pairs), method)


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
