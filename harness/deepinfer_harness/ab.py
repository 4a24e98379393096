"""A/B rows from per-run summaries: paired ratio with bootstrap CI, A/A noise floor, MDE, mark.

Pairs are (A rep k, B rep k); A/A and B/B pairs are consecutive reps of one variant (r0/r1,
r2/r3, …), pooled. Numerics (ΔNLL, top-1 agreement, greedy token match) come from the JSONL.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np

from deepinfer_harness.layout import RunLayout
from deepinfer_harness.looplag import percentile
from deepinfer_harness.metrics import METRICS
from deepinfer_harness.records import read_records
from deepinfer_harness.stats import (
    UNDERPOWERED_PAIRS,
    RatioCI,
    bootstrap_ratio,
    log_ratios,
    mark,
    mde,
    noise_floor,
    pairs_needed,
    two_level_ratio,
)

COMPARED_METRICS = {
    "prefill-cold": ["median_ttft_ms", "prefill_tok_s", "client_prefill_tok_s"],
    "ttft": ["median_ttft_ms", "p99_ttft_ms", "frontend_overhead_ms"],
    "decode": ["decode_tok_s", "mean_tpot_ms", "decode_steps_per_s", "mean_tokens_per_chunk",
               "spec_decode_acceptance_length", "ttft_under_load_ms"],
    "nll": ["nll_mean"],
    "greedy": ["mean_tpot_ms"],
}


def metrics_for(kind: str, runs: list[dict[str, Any]]) -> list[str]:
    """The kind's fixed metrics plus per-position acceptance (the acceptance gate) when present."""
    positions = sorted({k for r in runs for k in r if k.startswith("spec_decode_accept_p")})
    return COMPARED_METRICS[kind] + (positions if kind == "decode" else [])


def higher_is_better(metric: str) -> bool:
    base = metric.removeprefix("median_").removeprefix("mean_").removeprefix("p99_")
    known = METRICS.get(base) or METRICS.get(metric)
    return known.higher_is_better if known else not metric.endswith("_ms")


def _by_rep(runs: list[dict[str, Any]], variant: str) -> dict[int, dict[str, Any]]:
    return {r["rep"]: r for r in runs if r["variant"] == variant}


def _aa_pairs(by_rep: dict[int, dict[str, Any]], metric: str) -> tuple[list[float], list[float]]:
    a, b = [], []
    for k in sorted(by_rep):
        if k % 2 == 0 and k + 1 in by_rep:
            a.append(by_rep[k].get(metric))
            b.append(by_rep[k + 1].get(metric))
    return a, b


def _two_level(samples: dict[tuple[str, int], list[float]], left: list[tuple[str, int]],
               right: list[tuple[str, int]], q: float, resamples: int, seed: int) -> RatioCI | None:
    return two_level_ratio([samples.get(k, []) for k in left], [samples.get(k, []) for k in right], q,
                           resamples, seed)


def compare_metric(runs: list[dict[str, Any]], metric: str, comparable: bool, resamples: int,
                   seed: int, delta: float | None = None,
                   samples: dict[tuple[str, int], list[float]] | None = None) -> dict[str, Any] | None:
    """One A/B row; `delta` is the relative change declared in advance for this metric (for power).

    With per-request `samples` ((variant, rep) → values) a `p<q>_` metric uses the two-level
    bootstrap (pairs, then requests within each run) instead of one statistic per run.
    """
    ra, rb = _by_rep(runs, "A"), _by_rep(runs, "B")
    reps = sorted(set(ra) & set(rb))
    a = [ra[k].get(metric) for k in reps]
    b = [rb[k].get(metric) for k in reps]
    if not any(isinstance(r.get(metric), int | float) for r in runs):
        return None
    aa_a, aa_b = _aa_pairs(ra, metric)
    bb_a, bb_b = _aa_pairs(rb, metric)
    q = float(metric[1:metric.index("_")]) if metric.startswith("p") and samples else None
    if q is not None and samples is not None:
        aa_keys = [(v, k) for v, by in (("A", ra), ("B", rb)) for k in sorted(by)
                   if k % 2 == 0 and k + 1 in by]
        ci = _two_level(samples, [("A", k) for k in reps], [("B", k) for k in reps], q, resamples, seed)
        aa = _two_level(samples, aa_keys, [(v, k + 1) for v, k in aa_keys], q, resamples, seed)
    else:
        ci = bootstrap_ratio(a, b, resamples, seed)
        aa = bootstrap_ratio(aa_a + bb_a, aa_b + bb_b, resamples, seed)
    floor = noise_floor(aa)
    valid = all(r["validity"]["valid"] for r in runs) and bool(reps)
    clean = lambda xs: [x for x in xs if isinstance(x, int | float) and math.isfinite(x)]
    row: dict[str, Any] = {
        "cell_id": runs[0]["cell_id"], "metric": metric,
        "a": {"estimate": statistics.fmean(clean(a)) if clean(a) else None, "runs": a},
        "b": {"estimate": statistics.fmean(clean(b)) if clean(b) else None, "runs": b},
        "ratio": ci.ratio if ci else None, "ci_low": ci.ci_low if ci else None,
        "ci_high": ci.ci_high if ci else None, "n_pairs": ci.n_pairs if ci else 0,
        "method": ci.method if ci else "paired_bootstrap_logratio",
        "aa_ratio": aa.ratio if aa else None, "aa_ci": [aa.ci_low, aa.ci_high] if aa else None,
        "noise_floor": floor, "mde": mde(log_ratios(aa_a + bb_a, aa_b + bb_b), len(reps)),
        "underpowered": len(reps) < UNDERPOWERED_PAIRS, "valid": valid, "delta": delta,
        "pairs_needed": _pairs_needed(log_ratios(aa_a + bb_a, aa_b + bb_b), delta),
        "mark": mark(ci, higher_is_better(metric), floor, valid, comparable),
    }
    if metric == "decode_tok_s":
        parts = {}
        counters = all(ra[k].get("spec_decode_acceptance_length") for k in reps)
        al_key = "spec_decode_acceptance_length" if counters else "mean_tokens_per_chunk"
        for name, key in (("step_rate_ratio", "decode_steps_per_s"), ("acceptance_length_ratio", al_key)):
            part = bootstrap_ratio([ra[k].get(key) for k in reps], [rb[k].get(key) for k in reps], 1, seed)
            parts[name] = part.ratio if part else None
        row["components"] = parts
    return row


def _pairs_needed(aa_log_ratios: np.ndarray, delta: float | None) -> int | None:
    if delta is None or aa_log_ratios.size < 2:
        return None
    return pairs_needed(float(np.std(aa_log_ratios, ddof=1)), delta)


def _nll_pair(layout: RunLayout, cell_id: str, a: tuple[str, int], b: tuple[str, int]) -> dict[str, Any]:
    def load(v: tuple[str, int]) -> dict:
        recs = read_records(layout.run_file(cell_id, v[0], v[1], "jsonl"))
        return {r.index: r for r in recs if r.prompt_logprobs}

    ra, rb = load(a), load(b)
    diffs, agree, total = [], 0, 0
    for i in sorted(set(ra) & set(rb)):
        pa, pb = ra[i].prompt_logprobs, rb[i].prompt_logprobs
        for la, lb, ta, tb in zip(pa["lp"], pb["lp"], pa["top1"], pb["top1"], strict=False):
            if la is not None and lb is not None:
                diffs.append(abs(la - lb))
            agree += int(ta is not None and ta == tb)
            total += 1
    if not diffs:
        return {}
    return {"pair": f"{a[0]}.r{a[1]}~{b[0]}.r{b[1]}", "dnll_abs_mean": statistics.fmean(diffs),
            "dnll_abs_p99": percentile(diffs, 99), "dnll_abs_max": max(diffs),
            "top1_agreement": agree / total if total else None}


def _greedy_pair(layout: RunLayout, cell_id: str, a: tuple[str, int], b: tuple[str, int]) -> dict[str, Any]:
    ra = {r.index: r.output_token_ids for r in read_records(layout.run_file(cell_id, a[0], a[1], "jsonl"))}
    rb = {r.index: r.output_token_ids for r in read_records(layout.run_file(cell_id, b[0], b[1], "jsonl"))}
    common = [i for i in sorted(set(ra) & set(rb)) if ra[i] is not None and rb[i] is not None]
    if not common:
        return {}
    firsts = []
    for i in common:
        x, y = ra[i], rb[i]
        firsts.append(next((j for j, (p, q) in enumerate(zip(x, y, strict=False)) if p != q),
                           None if len(x) == len(y) else min(len(x), len(y))))
    diverged = [f for f in firsts if f is not None]
    return {"pair": f"{a[0]}.r{a[1]}~{b[0]}.r{b[1]}",
            "greedy_exact_match_rate": 1 - len(diverged) / len(common),
            "first_divergence_mean": float(np.mean(diverged)) if diverged else None, "prompts": len(common)}


def numerics(layout: RunLayout, cell_id: str, kind: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    fn = _nll_pair if kind == "nll" else _greedy_pair
    ra, rb = _by_rep(runs, "A"), _by_rep(runs, "B")
    ab = [fn(layout, cell_id, ("A", k), ("B", k)) for k in sorted(set(ra) & set(rb))]
    aa = [fn(layout, cell_id, (v, k), (v, k + 1)) for v, reps in (("A", ra), ("B", rb))
          for k in sorted(reps) if k % 2 == 0 and k + 1 in reps]
    return {"cell_id": cell_id, "kind": kind, "ab": [x for x in ab if x], "aa": [x for x in aa if x]}
