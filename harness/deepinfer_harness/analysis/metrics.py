"""Metric formulas (docs/AB_METHOD.md, metrics; the declarations: metric_table.py); integers in ns
inside, ms/s only on output.

t0 = t_send_ns, τ_j = event_times_ns[j] (content events, stamped on read), k_j = tokens in event j,
N = usage.completion_tokens, m = number of content events.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable
from typing import Any

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


def finite(values: Iterable[Any]) -> list[float]:
    """The finite numbers among `values` (a None, a string, NaN or ±inf is no measurement)."""
    return [v for v in values if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)]


def server_value(r: RequestRecord, key: str) -> float | None:
    """A number from the server's per-request `metrics` object; None unless it is a finite number
    (the server's JSON may hold anything: null, NaN, a string)."""
    metrics = r.server_metrics if isinstance(r.server_metrics, dict) else {}
    values = finite([metrics.get(key)])
    return values[0] if values else None


def server_ttft_ms(r: RequestRecord) -> float | None:
    return server_value(r, "time_to_first_token_ms")


def frontend_overhead_ms(r: RequestRecord) -> float | None:
    t, queue, server = ttft_ns(r), server_value(r, "queue_time_ms"), server_ttft_ms(r)
    if t is None or queue is None or server is None:
        return None
    return t / 1e6 - queue - server


def per_s(amount: float, span_s: float | None) -> float | None:
    """`amount` per second over `span_s`; None unless the span is a positive finite number (a span
    of 0, e.g. a TTFT of 0 ms, has no rate)."""
    if not isinstance(span_s, int | float) or not math.isfinite(span_s) or span_s <= 0:
        return None
    return amount / span_s


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
    (plan.percentiles, like vllm bench serve --metric-percentiles); non-finite values are no
    measurement and are left out."""
    ms = [v / 1e6 for v in finite(values_ns)]
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
