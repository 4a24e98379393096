"""Metric formulas (docs/AB_METHOD.md, metrics; the declarations: metric_table.py); integers in ns
inside, ms/s only on output.

t0 = t_send_ns, τ_j = event_times_ns[j] (content events, stamped on read), k_j = tokens in event j,
N = usage.completion_tokens, m = number of content events.
"""

from __future__ import annotations

import itertools
import math
import statistics

from deepinfer_harness.analysis.stats import percentile
from deepinfer_harness.metric_table import pkey
from deepinfer_harness.records import RequestRecord


def ttft_ns(r: RequestRecord) -> int | None:
    return r.event_times_ns[0] - r.t_send_ns if r.event_times_ns else None


def e2el_ns(r: RequestRecord) -> int | None:
    return r.event_times_ns[-1] - r.t_send_ns if r.event_times_ns else None


def tpot_ns(r: RequestRecord) -> float | None:
    n = r.output_tokens
    if not r.event_times_ns or n is None or n < 2:
        return None
    return (r.event_times_ns[-1] - r.event_times_ns[0]) / (n - 1)


def gaps_ns(r: RequestRecord) -> list[int]:
    t = r.event_times_ns
    return [b - a for a, b in itertools.pairwise(t)]


def itl_per_token_ns(r: RequestRecord) -> list[float]:
    out: list[float] = []
    for gap, k in zip(gaps_ns(r), r.tokens_per_chunk[1:], strict=False):
        k = k or 1
        out.extend([gap / k] * k)
    return out


def stream_decode_rates(r: RequestRecord) -> dict[str, float] | None:
    """Per request: decode_tok_s = (N − k1)/(τm − τ1) = step_rate × tokens_per_step (the tokens
    after the first event over the time after it; one event is one engine step)."""
    events, tokens = len(r.event_times_ns), r.output_tokens
    if events < 2 or tokens is None:
        return None
    span_s = (r.event_times_ns[-1] - r.event_times_ns[0]) / 1e9
    first_event_tokens = r.tokens_per_chunk[0] or 1
    if span_s <= 0:
        return None
    return {
        "decode_tok_s": (tokens - first_event_tokens) / span_s,
        "step_rate": (events - 1) / span_s,
        "tokens_per_step": (tokens - first_event_tokens) / (events - 1),
    }


def server_ttft_ms(r: RequestRecord) -> float | None:
    return (r.server_metrics or {}).get("time_to_first_token_ms")


def frontend_overhead_ms(r: RequestRecord) -> float | None:
    server, t = r.server_metrics or {}, ttft_ns(r)
    if t is None or "time_to_first_token_ms" not in server or "queue_time_ms" not in server:
        return None
    return t / 1e6 - server["queue_time_ms"] - server["time_to_first_token_ms"]


def window_counts(records: list[RequestRecord], t_open_ns: int, t_close_ns: int) -> tuple[int, int]:
    """(tokens, events) of content events inside [t_open, t_close], each request's first event excluded."""
    tokens = events = 0
    for r in records:
        for t, k in zip(r.event_times_ns[1:], r.tokens_per_chunk[1:], strict=False):
            if t_open_ns <= t <= t_close_ns:
                tokens += k or 1
                events += 1
    return tokens, events


def inflight_fraction(records: list[RequestRecord], target: int, t_open_ns: int, t_close_ns: int) -> float:
    """Share of the window during which exactly `target` requests were in flight."""
    edges: list[tuple[int, int]] = []
    for r in records:
        lo, hi = max(r.t_send_ns, t_open_ns), min(r.t_end_ns, t_close_ns)
        if lo < hi:
            edges += [(lo, 1), (hi, -1)]
    edges.sort()
    level, last, at_target = 0, t_open_ns, 0
    for t, step in edges:
        if level >= target:
            at_target += t - last
        level, last = level + step, t
    if level >= target:
        at_target += t_close_ns - last
    span = t_close_ns - t_open_ns
    return at_target / span if span > 0 else 0.0


DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)


def describe_ms(
    name: str, values_ns: list[float], percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
) -> dict[str, float]:
    """vLLM bench summary names for one latency metric, in ms; `percentiles` as the profile selects
    (plan.percentiles, like vllm bench serve --metric-percentiles)."""
    ms = [v / 1e6 for v in values_ns]
    if not ms:
        return {}
    return {
        f"mean_{name}_ms": statistics.fmean(ms),
        f"median_{name}_ms": statistics.median(ms),
        f"std_{name}_ms": statistics.pstdev(ms) if len(ms) > 1 else 0.0,
        **{f"{pkey(q)}_{name}_ms": percentile(ms, q) for q in percentiles},
    }


def nll_of(lp: list[float | None]) -> float:
    """Document NLL = mean −logprob; NaN if any position is missing or non-finite."""
    if not lp or any(x is None or not math.isfinite(x) for x in lp):
        return float("nan")
    return -statistics.fmean(lp)
