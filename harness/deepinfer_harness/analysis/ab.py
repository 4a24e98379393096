"""A/B rows from per-run summaries: paired ratio with bootstrap CI, A/A noise floor, MDE, mark.

Pairs are (A rep k, B rep k) with both runs valid; A/A and B/B pairs are consecutive valid reps
of one variant (r0/r1, r2/r3, …), pooled. Arm means are over valid runs only; invalid and missing
runs are listed on the row and make its mark `!`. Numerics (ΔNLL, top-1 agreement, greedy
token match) come from the JSONL through the one reader.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from deepinfer_harness.analysis.metrics import DEFAULT_PERCENTILES, nll_of
from deepinfer_harness.analysis.reader import RunReader
from deepinfer_harness.analysis.stats import (
    MIN_PAIRS,
    MeanShift,
    NoiseFloor,
    RatioCI,
    aa_noise,
    bootstrap_ratio,
    decide,
    exp_safe,
    expm1_safe,
    log_ratios,
    mde,
    mean_shift,
    pairs_needed,
    percentile,
    percentile_log_ratios,
    two_level_ratio,
    undefined_pair,
)
from deepinfer_harness.layout import RunKey
from deepinfer_harness.metric_table import compared, higher_is_better, parse_key, zero_is_value

Samples = dict[tuple[str, int], list[float]]


@dataclass
class CellRuns:
    """Every run of one cell that exists, and the runs the schedule expected."""

    cell_id: str
    kind: str
    runs: dict[tuple[str, int], dict[str, Any]]  # (variant, rep) → run summary
    expected: list[tuple[str, int]]
    comparable: bool = True

    def valid(self, variant: str) -> dict[int, dict[str, Any]]:
        return {k: r for (v, k), r in self.runs.items() if v == variant and r["validity"]["valid"]}

    @property
    def invalid(self) -> list[str]:
        return [f"{v}.r{k}" for (v, k), r in sorted(self.runs.items()) if not r["validity"]["valid"]]

    @property
    def missing(self) -> list[str]:
        return [f"{v}.r{k}" for v, k in sorted(self.expected) if (v, k) not in self.runs]

    def problems(self) -> str:
        parts = ([f"invalid runs {', '.join(self.invalid)}"] if self.invalid else []) + (
            [f"missing runs {', '.join(self.missing)}"] if self.missing else []
        )
        return "; ".join(parts)

    def ab_reps(self) -> list[int]:
        return sorted(set(self.valid("A")) & set(self.valid("B")))

    def aa_keys(self) -> list[tuple[tuple[str, int], tuple[str, int]]]:
        out = []
        for v in ("A", "B"):
            by = self.valid(v)
            out += [((v, k), (v, k + 1)) for k in sorted(by) if k % 2 == 0 and k + 1 in by]
        return out


def metrics_for(
    kind: str, runs: list[dict[str, Any]], percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
) -> list[str]:
    """The keys compared for one cell kind, as metric_table declares them: the kind's fixed
    aggregates, the selected percentiles of its latencies, goodput when SLOs are set, and
    per-position acceptance (the acceptance gate) when present."""
    return compared(kind, {k for r in runs for k in r}, percentiles)


def _finite(values: list[Any]) -> list[float]:
    return [float(x) for x in values if isinstance(x, int | float) and math.isfinite(x)]


def arm(cell: CellRuns, variant: str, metric: str) -> dict[str, Any]:
    """Mean ± sd over the arm's valid runs (invalid runs are listed, never averaged in)."""
    by = cell.valid(variant)
    values = {k: r.get(metric) for k, r in sorted(by.items())}
    vals = _finite(list(values.values()))
    return {
        "estimate": statistics.fmean(vals) if vals else None,
        "sd": statistics.stdev(vals) if len(vals) > 1 else None,
        "n_valid": len(vals),
        "runs": vals,
        "reps": [k for k, x in values.items() if x in vals],
    }


def _quantile(metric: str) -> float | None:
    return parse_key(metric).quantile


def compare_metric(
    cell: CellRuns,
    metric: str,
    resamples: int,
    seed: int,
    delta: float | None = None,
    samples: Samples | None = None,
    aa_run: bool = False,
    lag_rule: bool = True,
) -> dict[str, Any] | None:
    """One A/B row; `delta` is the relative change declared in advance for this metric (for power).
    With `lag_rule`, a time metric's verdict is checked against the client's own stalls
    (host_load_bound).

    With per-request `samples` ((variant, rep) → values) a `p<q>_` metric uses the two-level
    bootstrap (pairs, then requests within each run) instead of one statistic per run.
    """
    if not any(isinstance(r.get(metric), int | float) for r in cell.runs.values()):
        return None
    reps, aa_keys = cell.ab_reps(), cell.aa_keys()
    va, vb = cell.valid("A"), cell.valid("B")
    q = _quantile(metric)
    two_level = q is not None and samples is not None
    per_request: Samples = samples or {}
    if two_level:
        sa = {k: per_request.get(("A", k), []) for k in reps}
        sb = {k: per_request.get(("B", k), []) for k in reps}
        values = {k: (_run_percentile(sa[k], q), _run_percentile(sb[k], q)) for k in reps}
    else:
        values = {k: (va[k].get(metric), vb[k].get(metric)) for k in reps}
    # a pair whose B/A is undefined (a 0, inf or NaN on one side, or a missing value) is left out
    # and named on the row; the others decide
    zeros = zero_is_value(metric)
    undefined = {k: why for k, (x, y) in values.items() if (why := undefined_pair(x, y, zeros))}
    left_out = _left_out_text(undefined)
    kept = [k for k in reps if k not in undefined]
    ci: RatioCI | None
    if two_level:
        assert q is not None
        ci = two_level_ratio([sa[k] for k in kept], [sb[k] for k in kept], q, resamples, seed)
        aa_d = percentile_log_ratios(
            [per_request.get(x, []) for x, _ in aa_keys], [per_request.get(y, []) for _, y in aa_keys], q
        )
    else:
        ci = bootstrap_ratio([values[k][0] for k in kept], [values[k][1] for k in kept], resamples, seed)
        aa_d = log_ratios(
            [_value(cell, x, metric) for x, _ in aa_keys], [_value(cell, y, metric) for _, y in aa_keys]
        )
    noise = aa_noise(aa_d)
    mark, why = decide(
        ci,
        higher_is_better(metric),
        noise,
        comparable=cell.comparable,
        problems=cell.problems(),
        aa_run=aa_run,
        left_out=left_out,
    )
    n_pairs = ci.n_pairs if ci else 0
    row: dict[str, Any] = {
        "cell_id": cell.cell_id,
        "metric": metric,
        "a": arm(cell, "A", metric),
        "b": arm(cell, "B", metric),
        "ratio": ci.ratio if ci else None,
        "ci_low": ci.ci_low if ci else None,
        "ci_high": ci.ci_high if ci else None,
        "n_pairs": n_pairs,
        "pairs_left_out": left_out or None,
        "min_pairs": MIN_PAIRS,
        "method": ci.method if ci else "paired_bootstrap_logratio",
        "aa": _noise_dict(noise),
        "aa_ratio": exp_safe(noise.offset) if noise else None,
        "noise_floor": noise.floor_rel if noise else None,
        "mde": mde(noise, n_pairs),
        "delta": delta,
        "pairs_needed": pairs_needed(noise, delta),
        "underpowered": n_pairs < MIN_PAIRS,
        "valid": not cell.invalid and not cell.missing,
        "invalid_runs": cell.invalid,
        "missing_runs": cell.missing,
        "mark": mark,
        "why": why,
    }
    if metric == "decode_tok_s":
        row["components"] = _components(cell, reps, seed)
    if lag_rule and not aa_run and metric.endswith("_ms") and ci is not None:
        _judge_host_load(row, ci, [values[k] for k in kept], [_lags(cell, k, q) for k in kept])
    return row


def _lags(cell: CellRuns, rep: int, q: float | None) -> tuple[float, float] | None:
    """(A's, B's) client event-loop lag in ms for one pair: the p99 lag for a p90-or-higher
    statistic, the median lag otherwise (a timestamp is late by the lag at that moment)."""
    stat = "loop_lag_p99_ms" if q is not None and q >= 90 else "loop_lag_p50_ms"
    out = []
    for variant in ("A", "B"):
        lag = (cell.runs.get((variant, rep)) or {}).get("loop_lag") or {}
        value = lag.get(stat)
        if not isinstance(value, int | float) or not math.isfinite(value):
            return None
        out.append(float(value))
    return out[0], out[1]


def host_load_bound(values: list[tuple[Any, Any]], lags: list[tuple[float, float] | None]) -> float | None:
    """How far the client's stalls can bias this row's log B/A. A run's statistic is off by about
    its lag, relatively lag/statistic. Lag that varies from run to run only spreads the pairs, and
    the bootstrap CI over pairs already holds that spread; what can move the verdict is a lag
    that differs between the arms systematically (ABBA order cancels one common to both): the mean
    over pairs of lag_B/B − lag_A/A, in absolute value. None when a pair has no lag recorded."""
    shifts = []
    for (a, b), lag in zip(values, lags, strict=False):
        if lag is None or not (positive_number(a) and positive_number(b)):
            return None
        shifts.append(lag[1] / b - lag[0] / a)
    return abs(statistics.fmean(shifts)) if shifts else None


def positive_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _judge_host_load(
    row: dict[str, Any], ci: RatioCI, values: list[tuple[Any, Any]], lags: list[tuple[float, float] | None]
) -> None:
    """Could the client's own stalls have changed this verdict? A claim (- or +) could be undone
    when its CI, widened by the bound on each side, reaches 1; a "no difference" (~ from a CI that
    contains 1) could hide one when the CI, shifted by the bound, leaves 1 behind. Only then is the
    row marked `!`; otherwise the bound is recorded and the verdict stands."""
    bound = host_load_bound(values, lags)
    row["host_load_bound"] = expm1_safe(bound) if bound is not None else None
    if bound is None or bound == 0 or not ci.has_ci or row["mark"] not in "-+~":
        return
    assert ci.ci_low is not None and ci.ci_high is not None
    lo, hi = ci.ci_low * math.exp(-bound), ci.ci_high * math.exp(bound)
    wide = lo <= 1.0 <= hi
    if row["mark"] in "-+":
        changes = wide
    else:
        contains = ci.ci_low <= 1.0 <= ci.ci_high
        changes = contains and (ci.ci_low * math.exp(bound) > 1.0 or ci.ci_high * math.exp(-bound) < 1.0)
    if changes:
        row["why"] = (
            f"host load: the client's own stalls could move B/A by up to {expm1_safe(bound):.1%}, "
            f"enough to change this verdict ({row['mark']}: {row['why']})"
        )
        row["mark"] = "!"


def _left_out_text(undefined: dict[int, str]) -> str:
    """`B = 0 in r0, r2; A missing in r1`: the pairs without a defined B/A, grouped by why."""
    by: dict[str, list[int]] = {}
    for rep, why in undefined.items():
        by.setdefault(why, []).append(rep)
    return "; ".join(f"{why} in {', '.join(f'r{k}' for k in reps)}" for why, reps in by.items())


def _run_percentile(values: list[float], q: float) -> float | None:
    """One run's percentile of its per-request values (None: no request)."""
    return percentile(values, q) if values else None


def _value(cell: CellRuns, key: tuple[str, int], metric: str) -> Any:
    return cell.runs[key].get(metric)


def _noise_dict(noise: NoiseFloor | None) -> dict[str, Any] | None:
    if noise is None:
        return None
    return {
        "n_pairs": noise.n_pairs,
        "offset_log": noise.offset,
        "spread_log": noise.spread,
        "sigma_log": noise.sigma,
        "floor_log": noise.floor,
        "floor": noise.floor_rel,
    }


def _components(cell: CellRuns, reps: list[int], seed: int) -> dict[str, float | None]:
    """decode tok/s = step rate × acceptance length: both ratios, so a kernel gain is told apart
    from acceptance drift (AL from the counters when every pair has them, else tokens per chunk)."""
    va, vb = cell.valid("A"), cell.valid("B")
    counters = all(va[k].get("spec_decode_acceptance_length") for k in reps)
    al_key = "spec_decode_acceptance_length" if counters else "mean_tokens_per_chunk"
    parts: dict[str, float | None] = {}
    for name, key in (("step_rate_ratio", "decode_steps_per_s"), ("acceptance_length_ratio", al_key)):
        part = bootstrap_ratio(
            [va[k].get(key) for k in reps], [vb[k].get(key) for k in reps], 1, seed, min_pairs=10**9
        )  # estimate only
        parts[name] = part.ratio if part else None
    return parts


def _doc_dict(index: int, shift: MeanShift) -> dict[str, Any]:
    return {
        "index": index,
        "positions": shift.n,
        "dnll_mean": shift.mean,  # signed NLL_B − NLL_A, nats/token
        "dnll_sd": shift.sd,  # per-position SD of NLL_B,t − NLL_A,t
        "se": shift.se,
        "z": shift.z,
    }


def _nll_pair(reader: RunReader, cell_id: str, a: tuple[str, int], b: tuple[str, int]) -> dict[str, Any]:
    def load(v: tuple[str, int]) -> dict:  # measured documents only (the warm-up is not a document)
        return {r.index: r for r in reader.measured_ok(RunKey(cell_id, *v)) if r.prompt_logprobs}

    ra, rb = load(a), load(b)
    diffs, docs, agree, total = [], [], 0, 0
    for i in sorted(set(ra) & set(rb)):
        pa, pb = ra[i].prompt_logprobs, rb[i].prompt_logprobs
        for la, lb, ta, tb in zip(pa["lp"], pb["lp"], pa["top1"], pb["top1"], strict=False):
            if la is not None and lb is not None:
                diffs.append(abs(la - lb))
            agree += int(ta is not None and ta == tb)
            total += 1
        na, nb = nll_of(pa["lp"]), nll_of(pb["lp"])
        if math.isfinite(na) and math.isfinite(nb):
            # d_t = NLL_B,t − NLL_A,t = lp_A,t − lp_B,t; a document with positions of unequal count
            # (never in a valid run: validity checks n = ISL) gets no SE
            d = (
                [la - lb for la, lb in zip(pa["lp"], pb["lp"], strict=True)]
                if len(pa["lp"]) == len(pb["lp"])
                else []
            )
            docs.append(_doc_dict(i, mean_shift(d, nb - na)))
    if not diffs:
        return {}
    by_abs = max(docs, key=lambda x: abs(x["dnll_mean"]), default=None)
    with_z = [x for x in docs if x["z"] is not None]
    by_z = max(with_z, key=lambda x: abs(x["z"]), default=None)
    return {
        "pair": f"{a[0]}.r{a[1]}~{b[0]}.r{b[1]}",
        "dnll_abs_mean": statistics.fmean(diffs),
        "dnll_abs_p99": percentile(diffs, 99),
        "dnll_abs_max": max(diffs),
        "doc_dnll_abs_max": abs(by_abs["dnll_mean"]) if by_abs else None,  # |NLL_B − NLL_A| per document
        "doc_dnll_abs_max_doc": by_abs,
        "doc_dnll_z_abs_max": abs(by_z["z"]) if by_z else None,  # |mean/SE| per document
        "doc_dnll_z_abs_max_doc": by_z,
        "docs": len(docs),
        "documents": docs,
        "top1_agreement": agree / total if total else None,
    }


def _greedy_pair(reader: RunReader, cell_id: str, a: tuple[str, int], b: tuple[str, int]) -> dict[str, Any]:
    ra = {r.index: r.output_token_ids for r in reader.records(RunKey(cell_id, *a))}
    rb = {r.index: r.output_token_ids for r in reader.records(RunKey(cell_id, *b))}
    common = [i for i in sorted(set(ra) & set(rb)) if ra[i] is not None and rb[i] is not None]
    if not common:
        return {}
    firsts = []
    for i in common:
        x, y = ra[i], rb[i]
        firsts.append(
            next(
                (j for j, (p, q) in enumerate(zip(x, y, strict=False)) if p != q),
                None if len(x) == len(y) else min(len(x), len(y)),
            )
        )
    diverged = [f for f in firsts if f is not None]
    return {
        "pair": f"{a[0]}.r{a[1]}~{b[0]}.r{b[1]}",
        "greedy_exact_match_rate": 1 - len(diverged) / len(common),
        "first_divergence_mean": float(np.mean(diverged)) if diverged else None,
        "prompts": len(common),
    }


def numerics(reader: RunReader, cell: CellRuns) -> dict[str, Any]:
    fn = _nll_pair if cell.kind == "nll" else _greedy_pair
    ab = [fn(reader, cell.cell_id, ("A", k), ("B", k)) for k in cell.ab_reps()]
    aa = [fn(reader, cell.cell_id, x, y) for x, y in cell.aa_keys()]
    return {
        "cell_id": cell.cell_id,
        "kind": cell.kind,
        "ab": [x for x in ab if x],
        "aa": [x for x in aa if x],
    }


# The certificate's checks per cell kind: (tolerance key in ab.numerics, metric of a pair, worst
# pair picks max or min, direction, unit, the pair's key naming the document behind the value)
NLL_CHECKS = (
    ("nll_doc_abs", "doc_dnll_abs_max", "<=", "nats/token", "doc_dnll_abs_max_doc"),
    ("nll_doc_z", "doc_dnll_z_abs_max", "<=", "standard errors", "doc_dnll_z_abs_max_doc"),
)
GREEDY_CHECKS = (("greedy_match", "greedy_exact_match_rate", ">=", "fraction", None),)


def _checks_for(kind: str, tolerances: dict[str, float]) -> tuple[tuple[str, str, str, str, str | None], ...]:
    """Greedy: its one check. NLL: one check per declared NLL tolerance, all of which must hold
    (nll_doc_z the statistical test, nll_doc_abs a gross guard); with none declared, the
    per-document |ΔNLL| is reported undecided (the certificate is then incomplete)."""
    if kind != "nll":
        return GREEDY_CHECKS
    return tuple(c for c in NLL_CHECKS if c[0] in tolerances) or NLL_CHECKS[:1]


def numeric_certificate(numerics_rows: list[dict[str, Any]], tolerances: dict[str, float]) -> dict[str, Any]:
    """The A/B numerics claim: for every NLL cell, every A/B pair's largest per-document |ΔNLL|
    within `nll_doc_abs` (nats/token) and its largest per-document |z| = |mean ΔNLL| / SE within
    `nll_doc_z`, each where declared; for every greedy cell, every A/B pair's exact-match rate at
    least `greedy_match`. Tolerances are declared in the profile before the run (ab.numerics);
    a cell without an A/B pair makes the certificate incomplete, never ok."""
    checks: list[dict[str, Any]] = []
    for num in numerics_rows:
        kind, cell = num["kind"], num["cell_id"]
        for tolerance, key, direction, unit, doc_key in _checks_for(kind, tolerances):
            goal = tolerances.get(tolerance)
            pairs = [p for p in num["ab"] if p.get(key) is not None]
            worst = (max if direction == "<=" else min)(pairs, key=lambda p: p[key], default=None)
            measured = worst[key] if worst else None
            aa = [p[key] for p in num["aa"] if p.get(key) is not None]
            met = None
            if measured is not None and goal is not None:
                met = measured <= goal if direction == "<=" else measured >= goal
            check = {
                "cell_id": cell,
                "kind": kind,
                "metric": key,
                "measured": measured,
                "goal": goal,
                "direction": direction,
                "unit": unit,
                "met": met,
                "ab_pairs": [p["pair"] for p in pairs],
                "aa_values": aa,
            }
            if doc_key is not None:
                check["tolerance"] = tolerance
                check["worst"] = (
                    {"pair": worst["pair"], **worst[doc_key]} if worst and worst.get(doc_key) else None
                )
            checks.append(check)
    if not checks:
        status = "none"
    elif any(c["met"] is False for c in checks):
        status = "fail"
    elif all(c["met"] for c in checks):
        status = "ok"
    else:
        status = "incomplete"  # no A/B pair, or no tolerance declared
    return {"status": status, "tolerances": tolerances, "checks": checks}


def _signed(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:+.{digits}g}"


def worst_document(worst: dict[str, Any] | None) -> str:
    """`doc 1 of A.r0~B.r0: ΔNLL -0.0351 ± 0.0232 (SE, 31 positions), z -1.51`."""
    if not worst:
        return ""
    se = "n/a" if worst["se"] is None else f"{worst['se']:.3g}"
    return (
        f"doc {worst['index']} of {worst['pair']}: ΔNLL {_signed(worst['dnll_mean'])} ± {se} "
        f"(SE, {worst['positions']} positions), z {_signed(worst['z'])}"
    )


def certificate_lines(cert: dict[str, Any]) -> list[str]:
    """One line per check and a verdict line, for the end of a run."""
    lines = []
    for c in cert["checks"]:
        got = "n/a" if c["measured"] is None else f"{c['measured']:.4g}"
        goal = "no tolerance declared" if c["goal"] is None else f"goal {c['direction']} {c['goal']:g}"
        state = {True: "met", False: "NOT MET", None: "not decided"}[c["met"]]
        doc = worst_document(c.get("worst"))
        lines.append(
            f"  numerics {c['cell_id']}: A/B {c['metric']} {got} {c['unit']} ({goal}): {state}"
            + (f" ({doc})" if doc else "")
        )
    after = cert.get("tolerances_declared")
    head = f"numeric parity certificate: {cert['status']}" + (
        f" (tolerances given {after}; the run declared {cert.get('tolerances_of_the_run')})" if after else ""
    )
    return [head, *lines] if lines else []
