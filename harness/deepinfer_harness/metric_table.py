"""Every metric the harness compares, declared once: its name, which way is better, what it is,
and which aggregates of it each cell kind compares A/B. The compared lists (`compared`), the
percentile rows, goodput rows, the default power δ (`default_deltas`), the runs.csv columns
(`RUN_COLUMNS`) and the parsing of a summary key back to its metric (`parse_key`) all derive from
this table; formulas live in analysis/metrics.py. No heavy imports: the profile schema reads it.

A summary key is `<aggregate>_<name>` (`median_ttft_ms`, `p99.9_e2el_ms`, `mean_tpot_ms`) or the
name alone (`decode_tok_s`); percentiles are named as `vllm bench serve` names them (`p99`, `p99.9`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from deepinfer_harness.cells import KINDS

ALL_BUT_NLL = tuple(k for k in KINDS if k != "nll")  # goodput: an NLL request has no latency target
# the kinds that generate past the first token: speculative decoding drafts only there
GENERATING = ("decode", "greedy", "rate", "prefix", "chat")


@dataclass(frozen=True)
class Metric:
    name: str  # the base name; summary keys add an aggregate prefix (see key)
    higher_is_better: bool
    doc: str
    # cell kind → the aggregates compared A/B, in row order ("" = the name itself)
    compared: dict[str, tuple[str, ...]] = field(default_factory=dict)
    percentiles_in: tuple[str, ...] = ()  # kinds comparing the plan's selected percentiles of it
    # percentiles bootstrapped over requests as well as pairs; ITL stays one statistic per run (a
    # decode run holds 10⁴–10⁵ gaps, and resampling them 10⁴ times would need 10⁹ draws per run)
    per_request: bool = False
    only_when_present: bool = False  # compared where a run has it (goodput: only when plan.slo is set)
    delta: float | None = None  # the default relative change the power analysis is sized for (ab.deltas)
    per_position: bool = False  # a family `<name><i>`, i = 0, 1, … (one row per draft position)
    # kinds among `compared` whose rows appear only where a run has the key (a server that drafts)
    when_present: tuple[str, ...] = ()
    # 0 is a measured value (no draft accepted, no request within the SLO), not a failed measurement:
    # A/B over pairs holding a 0 is the ratio of sums (analysis/stats.py, "Ratios of zero")
    zero_is_value: bool = False

    def key(self, aggregate: str = "") -> str:
        return f"{aggregate}_{self.name}" if aggregate else self.name


# Row order within a kind is this declaration order, then each metric's aggregates in the order given.
METRICS: dict[str, Metric] = {
    m.name: m
    for m in [
        Metric(
            "request_throughput",
            True,
            "completed requests / (last end − first send)",
            compared={"rate": ("",)},
        ),
        Metric(
            "output_throughput", True, "output tokens / (last end − first send)", compared={"rate": ("",)}
        ),
        Metric(
            "decode_tok_s",
            True,
            "cell: in-window tokens (first event of each request excluded) / window",
            compared={"decode": ("",)},
            delta=0.02,
        ),
        Metric(
            "ttft_ms",
            False,
            "τ1 − t0",
            compared={
                "prefill-cold": ("median",),
                "ttft": ("median", "p99"),
                "rate": ("median",),
                "prefix": ("median",),
                "chat": ("median",),
            },
            percentiles_in=("ttft", "rate", "prefix", "chat"),
            per_request=True,
            delta=0.03,
        ),
        Metric(
            "frontend_overhead_ms",
            False,
            "ttft − queue_time_ms − server time_to_first_token_ms",
            compared={"ttft": ("",)},
        ),
        Metric(
            "prefill_tok_s", True, "ISL / server time_to_first_token_ms", compared={"prefill-cold": ("",)}
        ),
        Metric("client_prefill_tok_s", True, "ISL / client TTFT", compared={"prefill-cold": ("",)}),
        Metric(
            "tpot_ms",
            False,
            "(τm − τ1)/(N − 1), N ≥ 2",
            compared={k: ("mean",) for k in ("decode", "greedy", "rate", "prefix", "chat")},
            percentiles_in=("rate", "chat"),
            per_request=True,
        ),
        Metric(
            "decode_steps_per_s",
            True,
            "cell: in-window content events (first excluded) / window",
            compared={"decode": ("",)},
        ),
        Metric(
            "tokens_per_chunk",
            True,
            "in-window tokens / in-window events = acceptance length seen",
            compared={"decode": ("mean",)},
        ),
        Metric(
            "spec_decode_acceptance_length",
            True,
            "1 + Δaccepted tokens / Δdrafts (Prometheus counters)",
            compared={k: ("",) for k in GENERATING},
            when_present=tuple(k for k in GENERATING if k != "decode"),
        ),
        Metric(
            "spec_decode_acceptance_rate",
            True,
            "100 × Δaccepted tokens / Δdraft tokens (%, Prometheus counters)",
            compared={k: ("",) for k in GENERATING},
            only_when_present=True,
            zero_is_value=True,
        ),
        Metric(
            "ttft_under_load_ms", False, "median TTFT of a decode cell's requests", compared={"decode": ("",)}
        ),
        Metric(
            "itl_ms",
            False,
            "τj − τj−1, j ≥ 2: the step latency under speculative decoding",
            compared={"decode": ("median", "p99"), "rate": ("median",), "chat": ("median",)},
            percentiles_in=("decode", "rate", "chat"),
        ),
        Metric(
            "e2el_ms",
            False,
            "τm − t0 (usage event excluded)",
            compared={k: ("median",) for k in ("decode", "greedy", "rate", "prefix", "chat")},
            percentiles_in=("decode", "rate", "prefix", "chat"),
            per_request=True,
        ),
        Metric(
            "prefix_cache_hit_rate",
            True,
            "Δprefix_cache_hits / Δprefix_cache_queries (tokens)",
            compared={"prefix": ("",)},
            zero_is_value=True,
        ),
        Metric(
            "nll_mean",
            False,
            "mean over docs of mean −logprob(actual token), positions 1…n−1",
            compared={"nll": ("",)},
        ),
        Metric(
            "goodput_req_s",
            True,
            "requests meeting every SLO of plan.slo / (last end − first send)",
            compared={k: ("",) for k in ALL_BUT_NLL},
            only_when_present=True,
            zero_is_value=True,
        ),
        Metric(
            "slo_attainment",
            True,
            "share of measured requests meeting every SLO (failed ones do not)",
            compared={k: ("",) for k in ALL_BUT_NLL},
            only_when_present=True,
            zero_is_value=True,
        ),
        Metric(
            "spec_decode_accept_p",
            True,
            "Δaccepted tokens at draft position i / Δdrafts (the acceptance gate per position)",
            compared={k: ("",) for k in GENERATING},
            only_when_present=True,
            per_position=True,
            zero_is_value=True,
        ),
        Metric("itl_per_token_ms", False, "each gap_j/k_j repeated k_j times; a derived view"),
    ]
}


def pkey(q: float) -> str:
    """`p99`, `p99.9`: the percentile's prefix in a summary key (vllm bench serve's names)."""
    return f"p{q:g}"


def compared(kind: str, keys_present: set[str], percentiles: tuple[float, ...]) -> list[str]:
    """The summary keys one cell kind compares A/B, in row order: the fixed aggregates, then the
    selected percentiles (50 is the median row) of its per-request latencies, then the metrics
    compared only where a run has them (goodput; acceptance per draft position)."""
    fixed: list[str] = []
    for m in METRICS.values():
        if not m.only_when_present and kind not in m.when_present:
            fixed += [m.key(a) for a in m.compared.get(kind, ())]
    for m in METRICS.values():
        if kind in m.percentiles_in:
            fixed += [m.key(pkey(q)) for q in percentiles if q != 50 and m.key(pkey(q)) not in fixed]
    present = [
        m.key(a)
        for m in METRICS.values()
        if (m.only_when_present or kind in m.when_present) and not m.per_position
        for a in m.compared.get(kind, ())
        if m.key(a) in keys_present
    ]
    positions = [
        k
        for m in METRICS.values()
        if m.per_position and kind in m.compared
        for k in sorted(k for k in keys_present if _position_family(k) is m)
    ]
    return fixed + present + positions


def _position_family(key: str) -> Metric | None:
    """The per-position family a key like `spec_decode_accept_p3` belongs to, if any."""
    for m in METRICS.values():
        if m.per_position and re.fullmatch(re.escape(m.name) + r"\d+", key):
            return m
    return None


_PERCENTILE = re.compile(r"^p(\d+(?:\.\d+)?)_(.+)$")
_AGGREGATE = re.compile(r"^(median|mean)_(.+)$")


@dataclass(frozen=True)
class ParsedKey:
    metric: Metric | None  # None: not a declared metric
    aggregate: str  # "", "median", "mean" or a percentile prefix ("p99")
    quantile: float | None  # 99.0 for p99_…, else None


def parse_key(key: str) -> ParsedKey:
    """A summary key back to its declared metric and aggregate: the one place prefixes are parsed."""
    m = _PERCENTILE.match(key)
    if m and m.group(2) in METRICS:
        return ParsedKey(METRICS[m.group(2)], f"p{m.group(1)}", float(m.group(1)))
    if m:
        return ParsedKey(None, f"p{m.group(1)}", float(m.group(1)))
    a = _AGGREGATE.match(key)
    if a and a.group(2) in METRICS:
        return ParsedKey(METRICS[a.group(2)], a.group(1), None)
    if key in METRICS:
        return ParsedKey(METRICS[key], "", None)
    return ParsedKey(_position_family(key), "", None)


def zero_is_value(key: str) -> bool:
    """Whether 0 is a measured value of this key's metric (Metric.zero_is_value)."""
    metric = parse_key(key).metric or _position_family(key)
    return bool(metric and metric.zero_is_value)


def higher_is_better(key: str) -> bool:
    """The declared direction; an undeclared key: lower is better for a time (`_ms`), else higher."""
    parsed = parse_key(key)
    return parsed.metric.higher_is_better if parsed.metric else not key.endswith("_ms")


def delta_name(key: str) -> str:
    """The `ab.deltas` name of a compared key: the metric's name for its mean or median, the key
    itself otherwise (a percentile row has its own δ, if any)."""
    parsed = parse_key(key)
    return parsed.metric.name if parsed.metric and parsed.aggregate in ("median", "mean") else key


def per_request_latency(key: str) -> str | None:
    """`p99_e2el_ms` → `e2el` for a percentile of a per-request latency (two-level bootstrap),
    else None."""
    parsed = parse_key(key)
    if parsed.quantile is None or parsed.metric is None or not parsed.metric.per_request:
        return None
    return parsed.metric.name.removesuffix("_ms")


def default_deltas() -> dict[str, float]:
    return {m.name: m.delta for m in METRICS.values() if m.delta is not None}


# runs.csv: one row per run, these columns in this order (the run's identity and counts, then
# metrics through their declared keys)
RUN_COLUMNS = [
    "cell_id",
    "variant",
    "rep",
    "session",
    "completed",
    "failed",
    METRICS["ttft_ms"].key("median"),
    METRICS["tpot_ms"].key("mean"),
    METRICS["decode_tok_s"].key(),
    METRICS["prefill_tok_s"].key(),
    METRICS["nll_mean"].key(),
    "prefix_cache_queries",
    "prefix_cache_hits",
    METRICS["prefix_cache_hit_rate"].key(),
    "server_generation_tokens",
    "isl_mean",
    "isl_std",
    "osl_mean",
    "osl_std",
    "offered_rate",
    METRICS["request_throughput"].key(),
    METRICS["goodput_req_s"].key(),
    METRICS["slo_attainment"].key(),
    "valid",
]
