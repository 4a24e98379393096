"""Cell validity rules (harness/README.md, validity): any violation marks the run invalid; nothing is dropped.

Rules checked here: failed/truncated/clamped requests, idle gate, foreign traffic (the server's
generation/prompt/success counter deltas must equal what the client counted), restarts, a shared
prefix the cache never served,
preemptions in a decode window, coldness, host load (the client's event-loop lag against the cell's
own timing scale), leftover JIT in the first request,
in-flight share of the decode window, prompt-logprob hard failures, server death. GPU clock and
throttle rules need nvidia-smi facts and are listed under `not_checked` when absent.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from deepinfer_harness.analysis.metrics import ttft_ns
from deepinfer_harness.cells import Cell
from deepinfer_harness.prometheus import Snapshot, delta, restart_evidence
from deepinfer_harness.records import RequestRecord

PLP_FLOOR = -9999.0  # vLLM clamps -inf prompt logprobs to this value
DECODE_COUNT_SLACK = 1  # per worker: a request may finish on the server just before a scrape


def _request_violations(cell: Cell, records: list[RequestRecord]) -> list[str]:
    out = []
    for r in records:
        tag = f"{r.phase} #{r.index}"
        if not r.ok:
            out.append(f"{tag}: {r.error}")
            continue
        if r.finish_reason != "length":
            out.append(f"{tag}: finish_reason={r.finish_reason}")
        if r.output_tokens != r.max_tokens:
            out.append(
                f"{tag}: completion_tokens={r.output_tokens} != max_tokens={r.max_tokens} (silent clamp?)"
            )
        if r.prompt_tokens != r.prompt_len:
            out.append(f"{tag}: prompt_tokens={r.prompt_tokens} != ISL {r.prompt_len}")
        ks = [k for k in r.tokens_per_chunk if k is not None]
        if len(ks) == len(r.tokens_per_chunk) and ks and sum(ks) != r.output_tokens:
            out.append(f"{tag}: Σ tokens per chunk {sum(ks)} != completion_tokens {r.output_tokens}")
        if cell.kind in ("prefill-cold", "ttft") and r.cached_tokens != 0:
            out.append(f"{tag}: cached_tokens={r.cached_tokens} (not cold)")
        if r.prompt_logprobs is not None:
            lp = r.prompt_logprobs["lp"]
            if r.prompt_logprobs["n"] != r.prompt_len:
                out.append(f"{tag}: {r.prompt_logprobs['n']} prompt logprobs for {r.prompt_len} tokens")
            bad = sum(1 for x in lp if x is None or not math.isfinite(x) or x <= PLP_FLOOR)
            if bad:
                out.append(f"{tag}: {bad} prompt logprobs null/NaN/-inf")
    return out


def _delta_violations(cell: Cell, measured: list[RequestRecord], d: dict[str, float]) -> list[str]:
    out = []
    success = sum(v for k, v in d.items() if k.startswith("vllm:request_success_total"))
    sent_prompt = sum(r.prompt_tokens or r.prompt_len for r in measured)
    if cell.kind == "decode":
        slack = DECODE_COUNT_SLACK * cell.concurrency
        if d.get("vllm:num_preemptions_total", 0) > 0:
            out.append(f"{d['vllm:num_preemptions_total']:g} preemptions inside the decode window")
        if success > len(measured) + slack:
            out.append(f"foreign traffic: Δrequest_success={success:g} > {len(measured)} requests")
        return out
    if success != len(measured):
        out.append(f"Δrequest_success_total={success:g} != {len(measured)} completed (foreign traffic?)")
    generated = sum(r.output_tokens or 0 for r in measured)
    if "vllm:generation_tokens_total" in d or generated:  # the server's count must be the client's
        if d.get("vllm:generation_tokens_total", 0) != generated:
            out.append(
                f"Δgeneration_tokens_total={d.get('vllm:generation_tokens_total', 0):g} != {generated} "
                "tokens the client received"
            )
    if d.get("vllm:prompt_tokens_total", 0) != sent_prompt:
        out.append(f"Δprompt_tokens_total={d.get('vllm:prompt_tokens_total', 0):g} != {sent_prompt} sent")
    if cell.kind == "prefix" and len(measured) > 1 and not d.get("vllm:prefix_cache_hits_total", 0):
        out.append(
            "shared prefix never read from the cache: Δprefix_cache_hits_total=0 over "
            f"{len(measured)} requests (is --no-enable-prefix-caching set?)"
        )
    if cell.kind in ("prefill-cold", "ttft"):
        by = "vllm:prompt_tokens_by_source_total{source=%s}"
        for source in ("local_cache_hit", "external_kv_transfer"):
            if d.get(by % source, 0):
                out.append(f"coldness: Δ{by % source}={d[by % source]:g}")
        if d.get("vllm:prompt_tokens_cached_total", 0):
            out.append(f"coldness: Δprompt_tokens_cached_total={d['vllm:prompt_tokens_cached_total']:g}")
        if d.get(by % "local_compute", 0) != sent_prompt:
            out.append(f"coldness: Δlocal_compute={d.get(by % 'local_compute', 0):g} != {sent_prompt}")
    return out


THERMAL_POWER_BITS = 0x04 | 0x08 | 0x20 | 0x40 | 0x80  # SW power cap, HW slowdown, SW/HW thermal, power brake
IDLE_BIT = 0x01
CLOCK_FLOOR = 0.97  # SM clock vs application clock [unverified threshold]


def _mhz(text: str | None) -> float | None:
    try:
        return float(str(text).split()[0])
    except (ValueError, IndexError):
        return None


def gpu_violations(samples: list[list[dict[str, str]]]) -> list[str]:
    """Rule 7 from nvidia-smi samples taken during the cell (field names [unverified])."""
    out = []
    for i, sample in enumerate(samples):
        for g, gpu in enumerate(sample):
            try:
                reasons = int(gpu.get("clocks_throttle_reasons.active", "0x0"), 16)
            except ValueError:
                reasons = 0
            if reasons & THERMAL_POWER_BITS:
                out.append(f"gpu{g} sample {i}: throttle reasons {reasons:#x}")
            sm, app = _mhz(gpu.get("clocks.sm")), _mhz(gpu.get("clocks.applications.graphics"))
            if sm and app and not reasons & IDLE_BIT and sm < CLOCK_FLOOR * app:
                out.append(f"gpu{g} sample {i}: SM clock {sm:.0f} MHz < {CLOCK_FLOOR:.0%} of {app:.0f} MHz")
    return out


# The finest client-side timing each kind's metrics rest on: a late event loop shifts each timestamp by
# its lag, so what a cell tolerates is a share of this, not one number for every cell.
TIMING_SCALE = {"prefill-cold": ("ttft",), "ttft": ("ttft",), "nll": ("e2el",)}
STREAM_SCALE = ("itl", "tpot", "ttft", "e2el")


def _positive(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) and value > 0 else None


def timing_scale(cell: Cell, summary: dict[str, Any]) -> str | None:
    """The metric (ttft, itl, tpot, e2el) whose median the cell measured first among its kind's."""
    for name in TIMING_SCALE.get(cell.kind, STREAM_SCALE):
        if _positive(summary.get(f"median_{name}_ms")):
            return name
    return None


def lag_violations(
    cell: Cell, lag: dict[str, Any], summary: dict[str, Any], limits: dict[str, Any]
) -> list[str]:
    """Host load, one line per broken absolute cap (`loop_lag_p99_ms` / `loop_lag_max_ms`, where
    set). The client's lag no longer invalidates a run against its own timings: whether it could
    have changed an A/B verdict is decided per row, from both arms' lags (ab.host_load_bound);
    `loop_lag_share: null` turns that row rule off."""
    out: list[str] = []
    for stat in ("p99", "max"):
        value, cap = lag.get(f"loop_lag_{stat}_ms"), limits.get(f"loop_lag_{stat}_ms")
        if isinstance(value, int | float) and isinstance(cap, int | float) and value > cap:
            out.append(f"host load: client event-loop lag {stat} {value:.1f} ms > the {cap:g} ms cap")
    return out


def check_run(
    cell: Cell,
    records: list[RequestRecord],
    measured: list[RequestRecord],
    facts: dict[str, Any],
    before: Snapshot,
    after: Snapshot,
    summary: dict[str, Any],
    limits: dict[str, float],
) -> dict[str, Any]:
    violations = list(facts.get("violations", []))
    not_checked = ["gpu clocks/throttle (no nvidia-smi samples)"] if not facts.get("gpus") else []
    not_checked.append("A vs B mean SM clock within 1 % (needs both arms; not evaluated)")
    if not records:
        violations.append("no requests recorded")
    violations += _request_violations(cell, records)
    if not before.values or not after.values:
        violations.append("metrics snapshots missing")
    else:
        violations += [f"restart: {e}" for e in restart_evidence(before, after)]
        violations += _delta_violations(cell, [r for r in measured if r.ok], delta(before, after))
    violations += gpu_violations(facts.get("gpus") or [])
    violations += lag_violations(cell, facts.get("loop_lag") or {}, summary, limits)
    if cell.kind in ("prefill-cold", "ttft"):
        ttfts = [t for r in measured if r.ok and (t := ttft_ns(r)) is not None]
        if len(ttfts) >= 3 and ttfts[0] > limits["first_request_factor"] * statistics.median(ttfts):
            violations.append(
                f"first measured TTFT {ttfts[0] / 1e6:.1f} ms > "
                f"{limits['first_request_factor']}× median (leftover JIT?)"
            )
    if cell.kind == "decode":
        share = summary.get("inflight_fraction")
        if share is None:
            violations.append("decode window never opened")
        elif share < limits["inflight_fraction"]:
            violations.append(
                f"in-flight = C for {100 * share:.0f}% of the window < "
                f"{100 * limits['inflight_fraction']:.0f}%"
            )
        steps, wanted = summary.get("window_request_steps", 0), facts.get("min_steps", 0)
        if share is not None and steps < wanted:
            violations.append(f"decode window has {steps} request-steps < {wanted}")
    return {"valid": not violations, "violations": violations, "not_checked": not_checked}
