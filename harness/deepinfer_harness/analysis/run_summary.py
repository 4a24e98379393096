"""One run (cell × variant × rep) → summary dict: a pure function of its files (JSONL, cell.json, .prom).

Summary keys follow vLLM bench names plus the harness additions (harness/README.md); `validity` holds every
violated rule, so an invalid run is reported (mark `!`), never dropped.
"""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Any

from deepinfer_harness import SCHEMA_VERSION
from deepinfer_harness.analysis.metrics import (
    DEFAULT_PERCENTILES,
    describe_ms,
    e2el_ns,
    finite,
    frontend_overhead_ms,
    gaps_ns,
    inflight_fraction,
    itl_per_token_ns,
    nll_of,
    per_s,
    server_ttft_ms,
    server_value,
    tpot_ns,
    ttft_ns,
    window_counts,
)
from deepinfer_harness.analysis.reader import RunReader
from deepinfer_harness.analysis.validity import check_run
from deepinfer_harness.cells import Cell, parse_cell
from deepinfer_harness.layout import RunKey, write_json
from deepinfer_harness.prometheus import (
    SPEC_ACCEPTED,
    SPEC_ACCEPTED_PER_POS,
    SPEC_DRAFT_TOKENS,
    SPEC_DRAFTS,
    Snapshot,
    delta,
)
from deepinfer_harness.records import RequestRecord
from deepinfer_harness.strict_json import numbers


def spec_decode(counter_deltas: dict[str, float]) -> dict[str, Any]:
    """Speculative-decoding accounting from the run's counter deltas: a draft is one proposal of K
    tokens, accepted tokens are the drafted tokens the verifier kept, so each engine step emits
    1 + accepted tokens and acceptance length = 1 + accepted / drafts."""
    drafts = counter_deltas.get(SPEC_DRAFTS, 0.0)
    if drafts <= 0:
        return {}
    accepted = counter_deltas.get(SPEC_ACCEPTED, 0.0)
    draft_tokens = counter_deltas.get(SPEC_DRAFT_TOKENS, 0.0)
    accepted_by_position = sorted(
        (int(name.split("position=")[1].rstrip("}")), value)
        for name, value in counter_deltas.items()
        if name.startswith(SPEC_ACCEPTED_PER_POS + "{")
    )
    # share of drafts whose token at this position was kept (the verifier stops at the first miss)
    per_position = [value / drafts for _, value in accepted_by_position]
    # share kept at this position among drafts kept up to the one before it
    conditional = (
        [
            per_position[0],
            *[
                (here / before if before else float("nan"))
                for before, here in itertools.pairwise(per_position)
            ],
        ]
        if per_position
        else []
    )
    positions = {f"spec_decode_accept_p{i}": v for i, v in enumerate(per_position)}  # scalars: A/B-able
    return positions | {
        "spec_decode_num_drafts": drafts,
        "spec_decode_draft_tokens": draft_tokens,
        "spec_decode_accepted_tokens": accepted,
        "spec_decode_acceptance_rate": 100 * accepted / draft_tokens if draft_tokens else None,
        "spec_decode_acceptance_length": 1 + accepted / drafts,
        "spec_decode_per_position_acceptance_rates": per_position,
        "spec_decode_conditional_acceptance_rates": conditional,
    }


def _throughput(measured: list[RequestRecord]) -> dict[str, Any]:
    ok = [r for r in measured if r.ok]
    if not ok:
        return {"completed": 0, "failed": len(measured)}
    t0 = min(r.t_send_ns for r in measured)
    t1 = max(r.t_end_ns for r in measured)
    duration = max((t1 - t0) / 1e9, 1e-9)
    inp = sum(r.prompt_tokens or 0 for r in ok)
    out = sum(r.output_tokens or 0 for r in ok)
    per_second: dict[int, int] = {}
    for r in ok:
        for t, k in zip(r.event_times_ns, r.tokens_per_chunk, strict=False):
            per_second[(t - t0) // 1_000_000_000] = per_second.get((t - t0) // 1_000_000_000, 0) + (k or 1)
    edges = sorted([(r.t_send_ns, 1) for r in measured] + [(r.t_end_ns, -1) for r in measured])
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return {
        "duration": duration,
        "completed": len(ok),
        "failed": len(measured) - len(ok),
        "total_input_tokens": inp,
        "total_output_tokens": out,
        "request_throughput": len(ok) / duration,
        "output_throughput": out / duration,
        "total_token_throughput": (inp + out) / duration,
        "max_output_tokens_per_s": max(per_second.values(), default=0),
        "max_concurrent_requests": peak,
    }


def _latency(ok: list[RequestRecord], qs: tuple[float, ...] = DEFAULT_PERCENTILES) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out |= describe_ms("ttft", [v for r in ok if (v := ttft_ns(r)) is not None], qs)
    out |= describe_ms("tpot", [v for r in ok if (v := tpot_ns(r)) is not None], qs)
    out |= describe_ms("itl", [g for r in ok for g in gaps_ns(r)], qs)
    out |= describe_ms("e2el", [v for r in ok if (v := e2el_ns(r)) is not None], qs)
    per_token = describe_ms("itl_per_token", [g for r in ok for g in itl_per_token_ns(r)])
    out |= {k: v for k, v in per_token.items() if k.startswith(("p50_", "p99_"))}
    server = [v for r in ok if (v := server_ttft_ms(r)) is not None]
    queue = [v for r in ok if (v := server_value(r, "queue_time_ms")) is not None]
    overhead = [v for r in ok if (v := frontend_overhead_ms(r)) is not None]
    if server:
        out["server_ttft_ms"] = statistics.median(server)
    if queue:
        out["queue_time_ms"] = statistics.median(queue)
    if overhead:
        out["frontend_overhead_ms"] = statistics.median(overhead)
    return out


def _spec_steps_check(ok: list[RequestRecord]) -> dict[str, Any]:
    """Per-request spec-decode summaries pooled, and content events vs engine steps: events − 1
    below num_spec_steps means vLLM merged steps into one event (its stream consumer lagged)."""
    spec = [
        (r, (r.server_metrics if isinstance(r.server_metrics, dict) else {}).get("speculative_decoding"))
        for r in ok
    ]
    spec = [(r, s) for r, s in spec if isinstance(s, dict) and finite([s.get("num_spec_steps")])]
    if not spec:
        return {}
    steps = sum(finite(s["num_spec_steps"] for _, s in spec))
    accepted = sum(finite(s.get("num_accepted_draft_tokens", 0) for _, s in spec))
    if steps <= 0:
        return {}
    events = sum(len(r.event_times_ns) - 1 for r, _ in spec)
    return {"request_acceptance_length": 1 + accepted / steps, "events_per_spec_step": events / steps}


def _nll(ok: list[RequestRecord]) -> dict[str, Any]:
    docs = [nll_of(r.prompt_logprobs["lp"]) for r in ok if r.prompt_logprobs]
    ranks = [x for r in ok if r.prompt_logprobs for x in r.prompt_logprobs["rank"]]
    finite = [d for d in docs if math.isfinite(d)]
    if not docs:
        return {}
    mean = statistics.fmean(finite) if len(finite) == len(docs) else float("nan")
    return {
        "nll_mean": mean,
        "ppl": math.exp(mean) if math.isfinite(mean) else float("nan"),
        "doc_nll": docs,
        "top1_accuracy": sum(1 for x in ranks if x == 1) / len(ranks) if ranks else None,
    }


def goodput(measured: list[RequestRecord], slo: dict[str, float], duration_s: float) -> dict[str, Any]:
    """Requests that met every SLO set (ttft_ms, tpot_ms, e2el_ms; vllm bench serve --goodput):
    a failed request meets none; a request without a TPOT (one token) is judged on the others."""
    if not slo or not measured:
        return {}
    judge = {"ttft_ms": ttft_ns, "tpot_ms": tpot_ns, "e2el_ms": e2el_ns}
    good = 0
    for r in measured:
        if not r.ok:
            continue
        values = {k: judge[k](r) for k in slo}
        if all(v / 1e6 <= slo[k] if v is not None else k == "tpot_ms" for k, v in values.items()):
            good += 1
    return {
        "slo": dict(slo),
        "slo_met_requests": good,
        "slo_attainment": good / len(measured),
        "goodput_req_s": good / duration_s if duration_s > 0 else None,
    }


def rate_attainment(
    schedule_s: float | None, median_e2el_ms: float | None, duration_s: float | None
) -> float | None:
    """How well an open-loop run kept up: (schedule span + median E2EL) / (first send → last end).
    A server that keeps up finishes about one typical request after the last arrival (≈ 1); one
    that falls behind builds a queue, and the run outlasts the schedule by it (→ below 1). Not
    defined at rate inf (no schedule) or without a latency."""
    if not schedule_s or median_e2el_ms is None or not duration_s:
        return None
    return (schedule_s + median_e2el_ms / 1e3) / duration_s


def offered_rate(cell: Cell, arrivals: dict[str, Any]) -> float | None:
    """The rate a rate cell offered: its id's, a sweep point's recorded one (cell.json), none for
    a ramp (its rate moves: ramp_start_rps → ramp_end_rps) or a synchronous cell (it offers one
    request at a time: its achieved rate is what it measures)."""
    if cell.is_sweep_point:
        value = arrivals.get("offered_rate")
        return float(value) if isinstance(value, int | float) else None
    return None if cell.ramp or cell.synchronous else cell.rate


def load_shape(cell: Cell, arrivals: dict[str, Any], measured: int) -> dict[str, Any]:
    """The open-loop shape beyond rate and process, where the cell has one: the gamma process's
    burstiness, a ramp, a duration bound (and how many requests it sent), a sweep point."""
    out: dict[str, Any] = {}
    if cell.arrival == "gamma":
        out["burstiness"] = cell.burstiness  # inf: constant gaps ("inf" in JSON)
    if cell.ramp:
        out |= {"ramp": cell.ramp, "ramp_start_rps": cell.rate, "ramp_end_rps": cell.ramp_end}
    if cell.duration_s:
        sent = arrivals.get("sent", measured)
        out |= {
            "duration_bound_s": cell.duration_s,
            "sent_requests": sent,
            "sent_after_duration": arrivals.get("sent_after_duration"),
            # the rate actually sent: the seeded schedule's count in [0, D) over D, which a
            # Poisson or gamma draw puts near, not at, the cell's nominal rate (charted at this)
            "sent_rate": sent / cell.duration_s if isinstance(sent, int) else None,
        }
    if cell.is_sweep_point:
        sweep = arrivals.get("sweep") or {}
        out |= {"sweep_point": f"{cell.sweep_k}/{cell.sweep_of}", "sweep_probe": sweep.get("probe")}
        if sweep.get("sync"):
            out["sweep_sync"] = sweep["sync"]
    if cell.synchronous:
        out["synchronous"] = True
    return out


def ramp_timeline(measured: list[RequestRecord], arrivals: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A ramp run over time, bin by bin (the run's recorded bins of its schedule, continued until
    the last request ends): the offered rate (scheduled arrivals / bin), the rate sent and the
    rate completed (requests ending in the bin, errors left out), and the median TTFT and E2EL of
    the requests sent in the bin. None without the recorded bins (a run recorded before them)."""
    timeline, t0 = arrivals.get("timeline"), arrivals.get("t0_ns")
    if not isinstance(timeline, dict) or not isinstance(t0, int) or not measured:
        return None
    width, scheduled = float(timeline["bin_s"]), list(timeline["scheduled"])
    ends = [(r.t_end_ns - t0) / 1e9 for r in measured if r.ok and r.t_end_ns]
    n_bins = max(len(scheduled), math.ceil(max(ends, default=0.0) / width) if width > 0 else 0)
    sent: list[list[RequestRecord]] = [[] for _ in range(n_bins)]
    done = [0] * n_bins
    for r in measured:
        sent[min(max(int((r.t_send_ns - t0) / 1e9 / width), 0), n_bins - 1)].append(r)
    for t in ends:
        done[min(max(int(t / width), 0), n_bins - 1)] += 1
    out = []
    for b in range(n_bins):
        ok = [r for r in sent[b] if r.ok]
        ttft = [x for r in ok if (x := r.ttft) is not None]
        e2el = [x for r in ok if (x := r.latency) is not None]
        out.append(
            {
                "t_start_s": b * width,
                "t_end_s": (b + 1) * width,
                "offered_rps": (scheduled[b] if b < len(scheduled) else 0) / width,
                "sent_rps": len(sent[b]) / width,
                "completed_rps": done[b] / width,
                "median_ttft_ms": 1e3 * statistics.median(ttft) if ttft else None,
                "median_e2el_ms": 1e3 * statistics.median(e2el) if e2el else None,
            }
        )
    return out


def realized_lengths(ok: list[RequestRecord]) -> dict[str, Any]:
    """Mean, sd, min and max of the prompt and output lengths the server reported (a length
    distribution's realized shape; fixed-length cells show sd 0)."""
    out: dict[str, Any] = {}
    for name, values in (
        ("isl", finite(r.prompt_tokens for r in ok)),
        ("osl", finite(r.output_tokens for r in ok)),
    ):
        if values:
            out |= {
                f"{name}_mean": statistics.fmean(values),
                f"{name}_std": statistics.pstdev(values) if len(values) > 1 else 0.0,
                f"{name}_min": min(values),
                f"{name}_max": max(values),
            }
    return out


def prefix_cache(d: dict[str, float], ok: list[RequestRecord]) -> dict[str, Any]:
    """The server's prefix-cache counters (vLLM 0.32.0 v1/metrics/loggers.py: prefix_cache_queries
    and _hits in tokens, the KV connector's external_prefix_cache_*, prompt_tokens_cached_by_source)
    in every row, so a warm cache is visible wherever it inflates a number."""
    queries, hits = d.get("vllm:prefix_cache_queries_total"), d.get("vllm:prefix_cache_hits_total")
    cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    return {
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        "prefix_cache_hit_rate": hits / queries if queries and hits is not None else None,
        "external_prefix_cache_queries": d.get("vllm:external_prefix_cache_queries_total"),
        "external_prefix_cache_hits": d.get("vllm:external_prefix_cache_hits_total"),
        "prompt_tokens_cached_device": d.get("vllm:prompt_tokens_cached_by_source_total{source=device}"),
        "client_cached_tokens": sum(cached) if cached else None,
    }


def summarize_run(
    records: list[RequestRecord],
    facts: dict[str, Any],
    before: Snapshot,
    after: Snapshot,
    cell_id: str,
    limits: dict[str, Any],
) -> dict[str, Any]:
    """`limits`: the validity thresholds, plus optional `percentiles` and `slo` (plan fields)."""
    cell = parse_cell(cell_id)
    d = delta(before, after)
    measured = [r for r in records if r.phase == "measure"]
    window = facts.get("window")
    if not (
        window and isinstance(window.get("t_open_ns"), int) and isinstance(window.get("t_close_ns"), int)
    ):
        window = None  # never opened (the cell failed before): "decode window never opened"
    if cell.kind == "decode" and window:
        t_open, t_close = window["t_open_ns"], window["t_close_ns"]
        measured = [r for r in records if r.t_end_ns >= t_open and r.t_send_ns <= t_close]
    ok = [r for r in measured if r.ok]
    out: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "cell_id": cell_id,
        "kind": cell.kind,
        "isl": cell.isl,
        "osl": cell.osl,
        "concurrency": cell.concurrency,
    }
    qs = tuple(limits.get("percentiles") or DEFAULT_PERCENTILES)
    out |= _throughput(measured) | _latency(ok, qs) | spec_decode(d) | realized_lengths(ok)
    if cell.kind != "nll":
        out |= goodput(measured, limits.get("slo") or {}, out.get("duration", 0.0))
    if cell.kind == "rate":
        arrivals = facts.get("arrivals", {})
        span_s = arrivals.get("schedule_s")
        out |= {
            "offered_rate": offered_rate(cell, arrivals),  # inf: every request at once ("inf" in JSON)
            "rate_unit": "requests/s",
            "arrival": cell.arrival,
            "schedule_s": span_s,
            # the rate the seeded schedule actually offered (a Poisson draw is not exactly R)
            "realized_rate": per_s(len(measured) - 1, span_s),
            "send_late_ms_max": arrivals.get("send_late_ms_max"),
            "rate_attainment": rate_attainment(span_s, out.get("median_e2el_ms"), out.get("duration")),
        } | load_shape(cell, arrivals, len(measured))
        if cell.ramp:
            out["timeline"] = ramp_timeline(measured, arrivals)
    if cell.kind in ("prefill-cold", "ttft") and "server_ttft_ms" in out:
        out["prefill_tok_s"] = per_s(cell.isl, out["server_ttft_ms"] / 1e3)
    if cell.kind in ("prefill-cold", "ttft") and "median_ttft_ms" in out:
        out["client_prefill_tok_s"] = per_s(cell.isl, out["median_ttft_ms"] / 1e3)
    if cell.kind == "decode" and window:
        span_s = (t_close - t_open) / 1e9
        tokens, events = window_counts(records, t_open, t_close)
        out |= {
            "window_s": span_s,
            "decode_tok_s": per_s(tokens, span_s),
            "decode_steps_per_s": per_s(events, span_s),
            "mean_tokens_per_chunk": tokens / events if events else None,
            "inflight_fraction": inflight_fraction(records, cell.concurrency, t_open, t_close),
            "window_request_steps": events,
            "ttft_under_load_ms": out.get("median_ttft_ms"),
        }
    if cell.kind in ("decode", "greedy", "rate", "prefix", "chat"):
        out |= _spec_steps_check(ok)
    if cell.kind == "nll":
        out |= _nll(ok)
    # prefix-cache counters in every row: a warm cache inflates throughput (cold cells must show 0)
    out |= prefix_cache(d, ok)
    out["server_generation_tokens"] = d.get("vllm:generation_tokens_total")
    out["system_fingerprint"] = next((r.system_fingerprint for r in ok if r.system_fingerprint), None)
    out["metrics_delta"] = {k: v for k, v in d.items() if v and "_bucket" not in k}
    out["loop_lag"] = facts.get("loop_lag", {})
    out["validity"] = check_run(cell, records, measured, facts, before, after, out, limits)
    return out


def limits_of(profile: dict[str, Any]) -> dict[str, Any]:
    """The validity thresholds plus the summary options the plan selects (percentiles, SLOs), from
    the profile as the manifest stores it; a run written before those options gets the defaults."""
    plan = profile.get("plan", {})
    # a limit of .inf is written "inf" in the manifest (strict_json): a number again here
    return numbers(profile["validity"] | {k: plan[k] for k in ("percentiles", "slo") if k in plan})


def write_summary(reader: RunReader, key: RunKey, limits: dict[str, Any]) -> dict[str, Any]:
    """The one writer of a run's `<variant>.r<k>.summary.json`: the run stage calls it when a cell
    ends (the file marks the run finished, valid or not, for resume), the report when it re-derives
    the run from its files; both get the same bytes from the same files."""
    summary = summary_of(reader, key, limits)
    write_json(reader.layout.run_file(key, "summary.json"), summary)
    return summary


def summary_of(reader: RunReader, key: RunKey, limits: dict[str, Any]) -> dict[str, Any]:
    """The summary of one run, recomputed from its files."""
    facts = reader.facts(key)
    summary = summarize_run(
        reader.records(key),
        facts,
        reader.snapshot(key, "before"),
        reader.snapshot(key, "after"),
        key.cell_id,
        limits,
    )
    summary |= {
        "variant": key.variant,
        "rep": key.rep,
        "session": facts.get("session"),
        "definition_sha256": facts.get("definition_sha256"),
    }
    return summary
