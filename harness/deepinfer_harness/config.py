"""Typed profile configuration: YAML → nested dataclasses, `--set a.b=value` overrides, validation.

Profiles live in harness/profiles/<name>.yaml (or any path). Unknown keys are errors, and
`__post_init__` rejects configurations that vLLM 0.32.0 would refuse or that would silently
change the measurement (e.g. max_model_len below ISL + OSL, which clamps max_tokens).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deepinfer_harness.cells import ARRIVALS, DEFAULT_WORKLOAD, RAMPS, WORKLOADS, format_rate, id_number_error
from deepinfer_harness.lengths import length_error, max_length
from deepinfer_harness.metric_table import default_deltas
from deepinfer_harness.topology import (
    V41_KV_SHARING_GROUPS,
    illegal_boundaries,
    partition_error,
    split_text,
)

PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles"
VARIANTS = ("A", "B")
SERVER_MODES = ("local", "docker", "url", "level")
PATCH_LEVELS = ("base", "optimized")  # patch 00; patches 00+01 (deepinfer_sm80.bindings.LEVELS)


# the float fields where .inf means something (all at once; Poisson's limit): every other number
# must be finite, or e.g. window_s = .inf passes validation and crashes mid-run
INF_ALLOWED = ("plan.rate.rates", "plan.rate.burstiness", "plan.rate.ramps")  # ramps: its own check
CHAT_TEMPLATE_MARGIN = 64  # tokens the chat template may add around a user message (role markers)


class ConfigError(ValueError):
    pass


def _require(ok: bool, name: str, value: Any, rule: str) -> None:
    """One line naming the field, the value and what is allowed (the schema's range rules)."""
    if not ok:
        raise ConfigError(f"{name} = {value!r}: {rule}")


def _workload(name: str, value: str) -> None:
    _require(value in WORKLOADS, name, value, f"allowed workloads {list(WORKLOADS)}")


def _each_positive(name: str, values: list[int]) -> None:
    for v in values:
        _require(v >= 1, name, values, "every entry must be an integer >= 1")


def _specs(
    name: str, specs: list[dict[str, int]], required: tuple[str, ...], optional: tuple[str, ...]
) -> None:
    """[{isl, c, n}] / [{isl, docs}] lists: known keys only, every value an integer >= 1."""
    for spec in specs:
        _require(isinstance(spec, dict), name, spec, f"each entry must be a mapping with {list(required)}")
        unknown = set(spec) - set(required) - set(optional)
        _require(not unknown, name, spec, f"unknown keys {sorted(unknown)}; allowed {[*required, *optional]}")
        missing = [k for k in required if k not in spec]
        _require(not missing, name, spec, f"missing {missing}")
        for key, v in spec.items():
            ok = isinstance(v, int) and not isinstance(v, bool) and v >= 1
            _require(ok, f"{name}[].{key}", v, "must be an integer >= 1")


@dataclass
class Topology:
    tp: int = 1
    pp: int = 1
    pp_partition: list[int] | None = None
    num_hidden_layers: int | None = None
    kv_sharing_groups: list[list[int]] = field(default_factory=list)
    nodes: int = 1
    ray: bool = False

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "nodes"):
            _require(getattr(self, name) >= 1, f"topology.{name}", getattr(self, name), "must be >= 1")
        if self.pp_partition is not None:
            layers = self.num_hidden_layers or sum(self.pp_partition)
            error = partition_error(self.pp_partition, self.pp, layers, self.groups())
            if error:
                raise ConfigError(error)
        if self.nodes > 1 and not self.ray:
            raise ConfigError("a multi-node server needs ray: true (vLLM launches it over Ray)")

    def groups(self) -> tuple[tuple[int, int], ...]:
        return tuple((int(s), int(e)) for s, e in self.kv_sharing_groups) or V41_KV_SHARING_GROUPS

    def split_groups(self) -> list[tuple[int, int, int]]:
        """(boundary, group start, group end) for every PP cut inside a KV-sharing group: legal only
        on a server that replicates the shared state (patch 00, docs/PIPELINE.md)."""
        return illegal_boundaries(self.pp_partition, self.groups()) if self.pp_partition else []


@dataclass
class Server:
    mode: str = "local"  # local | docker | url | level (a local patched CPU tree per arm)
    schedule: str = "sequential"  # sequential: one server at a time; concurrent: both arms up at once
    images: dict[str, str] = field(
        default_factory=lambda: {"A": "deepinfer-sm80:baseline", "B": "deepinfer-sm80:deepinfer"}
    )
    urls: dict[str, str] = field(default_factory=dict)
    # local mode: `vllm serve` through this interpreter; `commands` may give each arm its own
    # install (e.g. two virtualenvs), otherwise both arms run `command` (an A/A unless env differs)
    command: list[str] = field(
        default_factory=lambda: ["{python}", "-m", "vllm.entrypoints.cli.main", "serve"]
    )
    commands: dict[str, list[str]] = field(default_factory=dict)
    host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=lambda: {"A": 8100, "B": 8101})
    env: dict[str, str] = field(default_factory=dict)
    variant_env: dict[str, dict[str, str]] = field(default_factory=dict)
    pass_env: list[str] = field(default_factory=list)  # host variables the server may see (by name)
    docker_args: list[str] = field(default_factory=list)
    health_timeout_s: float = 1800.0
    nice: int = 0  # >0: lower the server's CPU priority, its session autogroup included (Linux)
    # mode level: each arm serves vLLM patched to a DeepInfer level on CPU (issue 20): A base (00),
    # B optimized (00+01), from the scratch trees deepinfer_sm80.testing.e2e prepares
    levels: dict[str, str] = field(default_factory=dict)
    level_work: str | None = None  # where the scratch trees live; None: the e2e module's own default

    def __post_init__(self) -> None:
        if self.mode not in SERVER_MODES:
            raise ConfigError(f"server.mode = {self.mode!r}: allowed {list(SERVER_MODES)}")
        if self.schedule not in ("sequential", "concurrent"):
            raise ConfigError(f"server.schedule must be sequential or concurrent, got {self.schedule!r}")
        if self.mode == "url" and not all(self.urls.get(v) for v in VARIANTS):
            raise ConfigError("server.mode url needs server.urls.A and server.urls.B")
        if self.mode != "url" and not all(v in self.ports for v in VARIANTS):
            raise ConfigError("server.ports needs A and B")
        if self.mode != "url" and self.schedule == "concurrent" and self.ports["A"] == self.ports["B"]:
            raise ConfigError(
                f"server.schedule concurrent runs both arms at once: server.ports.A and B "
                f"must differ (both are {self.ports['A']})"
            )
        if self.mode == "docker" and not all(self.images.get(v) for v in VARIANTS):
            raise ConfigError("server.mode docker needs server.images.A and server.images.B")
        unknown = set(self.commands) - set(VARIANTS)
        if unknown:
            raise ConfigError(f"server.commands: unknown arms {sorted(unknown)} (A or B)")
        if any(not c for c in self.commands.values()) or not self.command:
            raise ConfigError("server.command / server.commands entries must not be empty")
        for v, port in self.ports.items():
            _require(1 <= port <= 65535, f"server.ports.{v}", port, "must be a TCP port 1..65535")
        _require(self.health_timeout_s > 0, "server.health_timeout_s", self.health_timeout_s, "must be > 0")
        _require(0 <= self.nice <= 19, "server.nice", self.nice, "must be 0..19")
        bad = set(self.levels) - set(VARIANTS)
        _require(not bad, "server.levels", self.levels, "keys must be A or B")
        for v, level in self.levels.items():
            _require(level in PATCH_LEVELS, f"server.levels.{v}", level, f"allowed {list(PATCH_LEVELS)}")
        if self.mode == "level":
            _require(
                all(v in self.levels for v in VARIANTS),
                "server.levels",
                self.levels,
                "mode level needs A and B",
            )


@dataclass
class PrefillPlan:
    isls: list[int] = field(default_factory=list)
    n: int = 5
    n_long: int = 3  # ISL >= long_isl
    long_isl: int = 160_000
    concurrent: list[dict[str, int]] = field(default_factory=list)  # [{isl, c, n}]
    workload: str = DEFAULT_WORKLOAD  # prompt text of the prefill cells (workloads.py)

    def __post_init__(self) -> None:
        _workload("plan.prefill.workload", self.workload)
        _each_positive("plan.prefill.isls", self.isls)
        for name in ("n", "n_long", "long_isl"):
            _require(getattr(self, name) >= 1, f"plan.prefill.{name}", getattr(self, name), "must be >= 1")
        _specs("plan.prefill.concurrent", self.concurrent, ("isl", "c"), ("n",))


@dataclass
class DecodePlan:
    isl: int = 2048
    osl: int = 512
    concurrencies: list[int] = field(default_factory=list)
    warmup_s: float = 30.0
    window_s: float = 120.0
    min_steps: int = 2000
    workloads: list[str] = field(default_factory=lambda: [DEFAULT_WORKLOAD])  # one decode cell per C each

    def __post_init__(self) -> None:
        for w in self.workloads:
            _workload("plan.decode.workloads", w)
        _require(bool(self.workloads), "plan.decode.workloads", self.workloads, "needs at least one workload")
        _require(self.isl >= 1, "plan.decode.isl", self.isl, "must be >= 1")
        _require(self.osl >= 2, "plan.decode.osl", self.osl, "must be >= 2 (TPOT needs two tokens)")
        _each_positive("plan.decode.concurrencies", self.concurrencies)
        _require(self.warmup_s >= 0, "plan.decode.warmup_s", self.warmup_s, "must be >= 0 seconds")
        _require(self.window_s > 0, "plan.decode.window_s", self.window_s, "must be > 0 seconds")
        _require(self.min_steps >= 0, "plan.decode.min_steps", self.min_steps, "must be >= 0")


@dataclass
class GreedyPlan:
    isl: int = 2048
    osl: int = 256
    concurrencies: list[int] = field(default_factory=list)
    n: int = 8
    workload: str = DEFAULT_WORKLOAD

    def __post_init__(self) -> None:
        _workload("plan.greedy.workload", self.workload)
        for name in ("isl", "osl", "n"):
            _require(getattr(self, name) >= 1, f"plan.greedy.{name}", getattr(self, name), "must be >= 1")
        _each_positive("plan.greedy.concurrencies", self.concurrencies)


Length = int | dict[str, float]  # an integer, {mean, std, min, max} or {min, max} (lengths.py)
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")


MAX_SWEEP_POINTS = 50
MAX_DURATION_REQUESTS = 1_000_000  # requests one duration-bounded cell may schedule (arrivals.py)


def _id_numbers(name: str, values: list[float], what: str, allow_inf: bool = False) -> None:
    """Positive, distinct, and written exactly in a cell id (at most 6 significant digits)."""
    for v in values:
        _require(v > 0, name, values, f"every {what} must be > 0")
        error = id_number_error(v, finite=not allow_inf)
        _require(error is None, name, values, f"{error} (a cell id must name it exactly)")
    _require(len(set(values)) == len(values), name, values, "must not repeat")


@dataclass
class Ramp:
    """`vllm bench serve --ramp-up-strategy S --ramp-up-start-rps A --ramp-up-end-rps B`: the
    request rate moves from start_rps to end_rps over the cell's requests (or its duration)."""

    strategy: str  # linear | exponential; all three required (no silent default ramp)
    start_rps: float
    end_rps: float

    def __post_init__(self) -> None:
        name = "plan.rate.ramps[]"
        _require(self.strategy in RAMPS, f"{name}.strategy", self.strategy, f"allowed {list(RAMPS)}")
        for key in ("start_rps", "end_rps"):
            value = getattr(self, key)
            _require(math.isfinite(value) and value > 0, f"{name}.{key}", value, "must be a finite rate > 0")
            error = id_number_error(value)
            _require(error is None, f"{name}.{key}", value, f"{error} (a cell id must name it exactly)")
        _require(
            self.start_rps < self.end_rps,
            f"{name}.end_rps",
            self.end_rps,
            f"must be > start_rps {self.start_rps:g} (a constant rate is plan.rate.rates)",
        )


@dataclass
class RateSweep:
    """GuideLLM's sweep: the all-at-once rate cell (`.inf`, capped by max_concurrency when set)
    measures the most requests/s the server completes; `points` rates evenly below it (k/(points+1)
    of it, k = 1 … points) follow, each a rate cell compared A/B. The first valid probe run in
    schedule order decides the rates, once; the run's manifest records them (resume reads them)."""

    points: int = 0  # 0: no sweep

    def __post_init__(self) -> None:
        _require(
            0 <= self.points <= MAX_SWEEP_POINTS,
            "plan.rate.sweep.points",
            self.points,
            f"must be 0 (no sweep) .. {MAX_SWEEP_POINTS}",
        )


@dataclass
class RatePlan:
    """Open loop (vllm bench serve --request-rate): n requests per cell sent at seeded arrival times,
    whatever the server's state; one cell per rate and arrival process, the sweep up to saturation."""

    rates: list[float] = field(default_factory=list)  # requests/s; .inf = every request at t = 0
    arrivals: list[str] = field(default_factory=lambda: ["poisson"])
    isl: Length = 1024
    osl: Length = 128
    n: int = 100
    warmup: int = 1
    max_concurrency: int | None = None  # a cap on requests in flight (vllm bench --max-concurrency)
    seed: int = 0
    workload: str = DEFAULT_WORKLOAD
    # arrival gamma: one cell per factor (vllm bench serve --burstiness; 1 = its Poisson process)
    burstiness: list[float] = field(default_factory=lambda: [1.0])
    ramps: list[Ramp] = field(default_factory=list)  # one ramp cell each (per arrival)
    # duration-bounded cells next to the count-bounded ones: each finite rate and ramp, per duration
    durations_s: list[float] = field(default_factory=list)
    sweep: RateSweep = field(default_factory=RateSweep)

    @property
    def active(self) -> bool:
        """The plan makes rate cells (fixed rates, ramps or a sweep)."""
        return bool(self.rates or self.ramps or self.sweep.points)

    def __post_init__(self) -> None:
        _workload("plan.rate.workload", self.workload)
        for r in self.rates:
            _require(
                r > 0, "plan.rate.rates", self.rates, "every rate must be > 0 requests/s (.inf: all at once)"
            )
            try:
                format_rate(r)
            except ValueError as exc:
                raise ConfigError(f"plan.rate.rates = {self.rates!r}: {exc}") from exc
        _require(len(set(self.rates)) == len(self.rates), "plan.rate.rates", self.rates, "must not repeat")
        for a in self.arrivals:
            _require(a in ARRIVALS, "plan.rate.arrivals", self.arrivals, f"allowed {list(ARRIVALS)}")
        _require(bool(self.arrivals), "plan.rate.arrivals", self.arrivals, "needs at least one")
        unique = len(set(self.arrivals)) == len(self.arrivals)
        _require(unique, "plan.rate.arrivals", self.arrivals, "must not repeat")
        for name in ("isl", "osl"):
            error = length_error(f"plan.rate.{name}", getattr(self, name))
            if error:
                raise ConfigError(error)
        _require(self.n >= 1, "plan.rate.n", self.n, "must be >= 1")
        _require(self.warmup >= 0, "plan.rate.warmup", self.warmup, "must be >= 0")
        if self.max_concurrency is not None:
            _require(
                self.max_concurrency >= 1, "plan.rate.max_concurrency", self.max_concurrency, "must be >= 1"
            )
        self._check_shapes()

    def _check_shapes(self) -> None:
        """burstiness, ramps, durations_s (sweep checks its own points)."""
        _require(bool(self.burstiness), "plan.rate.burstiness", self.burstiness, "needs at least one")
        _id_numbers("plan.rate.burstiness", self.burstiness, "burstiness (gamma shape)", allow_inf=True)
        _require(
            "gamma" in self.arrivals or self.burstiness == [1.0],
            "plan.rate.burstiness",
            self.burstiness,
            "applies to arrival gamma only (vllm bench serve's gamma process, 1 = its Poisson): "
            "add gamma to plan.rate.arrivals",
        )
        ramps = [(x.strategy, x.start_rps, x.end_rps) for x in self.ramps]
        _require(len(set(ramps)) == len(ramps), "plan.rate.ramps", ramps, "must not repeat")
        _id_numbers("plan.rate.durations_s", self.durations_s, "duration (seconds)")
        bounded = [r for r in self.rates if math.isfinite(r)] + [x.end_rps for x in self.ramps]
        _require(
            not self.durations_s or bool(bounded),
            "plan.rate.durations_s",
            self.durations_s,
            "needs a finite rate or a ramp to bound (.inf sends every request at once; sweep points "
            "are count-bounded: their rate is measured during the run)",
        )
        for d in self.durations_s:
            for r in bounded:
                _require(
                    r * d <= MAX_DURATION_REQUESTS,
                    "plan.rate.durations_s",
                    self.durations_s,
                    f"{r:g} requests/s for {d:g} s is over {MAX_DURATION_REQUESTS} requests in one cell",
                )


@dataclass
class ChatPlan:
    """Chat-template prompts through /v1/chat/completions. V4.1's template turns thinking on when
    the request leaves it unset, so a chat cell must pin it: `thinking: false` or `true`."""

    isl: int = 1024
    osl: int = 128
    concurrencies: list[int] = field(default_factory=list)
    n: int = 8
    thinking: bool | None = None
    workload: str = DEFAULT_WORKLOAD

    def __post_init__(self) -> None:
        _workload("plan.chat.workload", self.workload)
        for name in ("isl", "osl", "n"):
            _require(getattr(self, name) >= 1, f"plan.chat.{name}", getattr(self, name), "must be >= 1")
        _each_positive("plan.chat.concurrencies", self.concurrencies)
        _require(
            self.thinking is not None or not self.concurrencies,
            "plan.chat.thinking",
            self.thinking,
            "must be pinned to true or false (V4.1's template thinks when it is unset)",
        )


@dataclass
class Plan:
    prefill: PrefillPlan = field(default_factory=PrefillPlan)
    ttft_isls: list[int] = field(default_factory=list)
    ttft_n: int = 30
    ttft_workload: str = DEFAULT_WORKLOAD
    decode: DecodePlan = field(default_factory=DecodePlan)
    # long generation (the seed's third workload): decode cells with a long output, same rules
    long_decode: DecodePlan = field(default_factory=DecodePlan)
    nll: list[dict[str, int]] = field(default_factory=list)  # [{isl, docs}]
    nll_workload: str = DEFAULT_WORKLOAD
    greedy: GreedyPlan = field(default_factory=GreedyPlan)
    rate: RatePlan = field(default_factory=RatePlan)
    # [{prefix, isl, osl, n, c}]: n prompts of isl tokens whose first `prefix` tokens are shared
    shared_prefix: list[dict[str, int]] = field(default_factory=list)
    shared_prefix_workload: str = DEFAULT_WORKLOAD
    chat: ChatPlan = field(default_factory=ChatPlan)
    # latency percentiles every summary reports (p<q>_ttft_ms, …) and the A/B compares
    percentiles: list[float] = field(default_factory=lambda: [50.0, 90.0, 99.0])
    # goodput: a request counts when it meets every SLO set here (ms); reported per run and compared
    slo: dict[str, float] = field(default_factory=dict)
    order_seed: int = 20261129

    def __post_init__(self) -> None:
        _workload("plan.ttft_workload", self.ttft_workload)
        _workload("plan.shared_prefix_workload", self.shared_prefix_workload)
        _specs("plan.shared_prefix", self.shared_prefix, ("prefix", "isl", "osl", "n", "c"), ())
        for spec in self.shared_prefix:
            _require(spec["prefix"] < spec["isl"], "plan.shared_prefix[].prefix", spec, "must be < isl")
        _require(bool(self.percentiles), "plan.percentiles", self.percentiles, "needs at least one")
        for q in self.percentiles:
            _require(0 < q < 100, "plan.percentiles", self.percentiles, "every entry must be in (0, 100)")
        _require(
            len(set(self.percentiles)) == len(self.percentiles),
            "plan.percentiles",
            self.percentiles,
            "must not repeat",
        )
        for k, v in self.slo.items():
            _require(k in SLO_KEYS, f"plan.slo.{k}", v, f"unknown SLO; allowed {list(SLO_KEYS)}")
            _require(v > 0, f"plan.slo.{k}", v, "must be > 0 ms")
        _workload("plan.nll_workload", self.nll_workload)
        _each_positive("plan.ttft_isls", self.ttft_isls)
        _require(self.ttft_n >= 1, "plan.ttft_n", self.ttft_n, "must be >= 1")
        _specs("plan.nll", self.nll, ("isl", "docs"), ())


@dataclass
class AB:
    repetitions: int = 2  # ABBA blocks; each block gives two (A, B) pairs
    aa: bool = False  # both arms are the same build on purpose: nothing is marked better or worse
    bootstrap_resamples: int = 10_000
    seed: int = 0
    deltas: dict[str, float] = field(default_factory=default_deltas)  # declared per metric (metric_table)
    # the numeric parity certificate's tolerances, declared before the run (docs/AB_METHOD.md):
    # nll_doc_abs = largest |NLL_B − NLL_A| per document (nats/token), nll_doc_z = largest
    # per-document |z| = |mean of NLL_B,t − NLL_A,t| / (its SD/√positions), greedy_match = least
    # share of prompts whose greedy tokens are identical; every declared one must hold; unset:
    # reported, not decided
    numerics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _require(self.repetitions >= 1, "ab.repetitions", self.repetitions, "must be >= 1")
        _require(
            self.bootstrap_resamples >= 100,
            "ab.bootstrap_resamples",
            self.bootstrap_resamples,
            "must be >= 100",
        )
        for k, v in self.deltas.items():
            _require(0 < v < 1, f"ab.deltas.{k}", v, "must be a relative change in (0, 1), e.g. 0.02")
        allowed = ("nll_doc_abs", "nll_doc_z", "greedy_match")
        for k, v in self.numerics.items():
            _require(k in allowed, f"ab.numerics.{k}", v, f"unknown tolerance; allowed {list(allowed)}")
            _require(
                math.isfinite(v),
                f"ab.numerics.{k}",
                v,
                "must be finite (an infinite tolerance decides nothing)",
            )
            _require(v >= 0, f"ab.numerics.{k}", v, "must be >= 0")
        _require(
            self.numerics.get("greedy_match", 0) <= 1,
            "ab.numerics.greedy_match",
            self.numerics.get("greedy_match"),
            "must be in [0, 1]",
        )


@dataclass
class Validity:
    # Host load: a number turns on the per-row rule (analysis/ab.py host_load_bound: could an arm-sided
    # client lag change this A/B verdict?), null turns it off; the value is what runs recorded before
    # issue 42 were judged with. The *_ms caps are absolute, invalidate a run, and are off by default.
    loop_lag_share: float | None = 0.05
    loop_lag_p99_ms: float | None = None
    loop_lag_max_ms: float | None = None
    first_request_factor: float = 3.0
    inflight_fraction: float = 0.95
    reset_prefix_cache: bool = False

    def __post_init__(self) -> None:
        for name in ("loop_lag_share", "loop_lag_p99_ms", "loop_lag_max_ms"):
            value = getattr(self, name)
            if value is not None:
                _require(value > 0, f"validity.{name}", value, "must be > 0 (null turns the rule off)")
        _require(self.first_request_factor > 0, "validity.first_request_factor", self.first_request_factor,
                 "must be > 0")  # fmt: skip
        _require(
            0 < self.inflight_fraction <= 1,
            "validity.inflight_fraction",
            self.inflight_fraction,
            "must be in (0, 1]",
        )


@dataclass
class Profile:
    name: str
    description: str = ""
    model: str | None = None  # None: build the tiny local model
    # config.json model_type values this profile serves; empty: any (preflight checks it)
    model_types: list[str] = field(default_factory=list)
    served_model_name: str | None = None
    labels: dict[str, str] = field(default_factory=lambda: {"A": "baseline", "B": "deepinfer"})
    topology: Topology = field(default_factory=Topology)
    server: Server = field(default_factory=Server)
    max_model_len: int = 4096
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    speculative: dict[str, Any] | None = None
    serve_flags: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    plan: Plan = field(default_factory=Plan)
    ab: AB = field(default_factory=AB)
    validity: Validity = field(default_factory=Validity)
    read_timeout_s: float = 3600.0
    corpus_file: str | None = None  # ShareGPT JSON/JSONL for workload sharegpt (--corpus FILE)

    def __post_init__(self) -> None:
        _require(self.max_model_len >= 1, "max_model_len", self.max_model_len, "must be >= 1")
        _require(self.read_timeout_s > 0, "read_timeout_s", self.read_timeout_s, "must be > 0")
        bad_labels = set(self.labels) - set(VARIANTS)
        _require(not bad_labels, "labels", self.labels, "keys must be A or B")
        if "DEEPINFER_SM80_PP_REPLICATION" in (self.env | self.server.env) and self.topology.split_groups():
            if (self.env | self.server.env)["DEEPINFER_SM80_PP_REPLICATION"] == "0":
                raise ConfigError(_no_replication(self.topology))
        p = self.plan
        needs = [
            *p.prefill.isls,
            *(c["isl"] for c in p.prefill.concurrent),
            *p.ttft_isls,
            *(d["isl"] for d in p.nll),
        ]
        needs = [x + 1 for x in needs]
        if p.decode.concurrencies:
            needs.append(p.decode.isl + p.decode.osl)
        if p.long_decode.concurrencies:
            needs.append(p.long_decode.isl + p.long_decode.osl)
        if p.greedy.concurrencies:
            needs.append(p.greedy.isl + p.greedy.osl)
        if p.rate.active:
            needs.append(max_length(p.rate.isl) + max_length(p.rate.osl))
        needs += [s["isl"] + s["osl"] for s in p.shared_prefix]
        if p.chat.concurrencies:  # the template adds a few tokens around the message
            needs.append(p.chat.isl + p.chat.osl + CHAT_TEMPLATE_MARGIN)
        if needs and max(needs) > self.max_model_len:
            raise ConfigError(
                f"max_model_len {self.max_model_len} < largest ISL+OSL {max(needs)}: "
                "vLLM would silently clamp max_tokens"
            )
        used = {w for value in workload_settings(p).values() for w in value}
        if "sharegpt" in used and not self.corpus_file:
            raise ConfigError("workload sharegpt needs a corpus file: --corpus FILE (ShareGPT JSON or JSONL)")
        if self.speculative and self.speculative.get("num_speculative_tokens_per_batch_size"):
            raise ConfigError("leave num_speculative_tokens_per_batch_size unset (it changes tokens/step)")
        flags = self.serve_flags
        decode_c = [*p.decode.concurrencies, *p.long_decode.concurrencies]
        decode_c += [s["c"] for s in p.shared_prefix] + p.chat.concurrencies
        if p.rate.active and p.rate.max_concurrency:
            decode_c.append(p.rate.max_concurrency)
        if "--max-num-seqs" in flags and decode_c:
            at = flags.index("--max-num-seqs") + 1
            raw = flags[at] if at < len(flags) else None
            _require(str(raw).isdigit(), "serve_flags --max-num-seqs", raw, "needs an integer value")
            max_seqs = int(str(raw))
            if max(decode_c) > max_seqs:
                raise ConfigError(
                    f"decode C={max(decode_c)} > --max-num-seqs {max_seqs}: "
                    "requests would queue and the window would not hold C in flight"
                )
        if "--disable-log-stats" in self.serve_flags:
            raise ConfigError("--disable-log-stats removes the Prometheus counters the harness needs")


def _no_replication(topo: Topology) -> str:
    cuts = split_text(topo.pp_partition or [], topo.groups())
    return (
        f"topology.pp_partition = {topo.pp_partition}: {cuts}, and DEEPINFER_SM80_PP_REPLICATION=0 turns "
        "off the replication that serves it; drop that variable or pick a partition without such a cut"
    )


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(hint)[0])}"
    if origin is dict:
        k, v = typing.get_args(hint)
        return f"a mapping of {_type_name(k)} to {_type_name(v)}"
    return {int: "integer", float: "number", str: "string", bool: "true/false", type(None): "null"}.get(
        hint, getattr(hint, "__name__", str(hint))
    )


def _coerce(hint: Any, value: Any, where: str) -> Any:
    """Check `value` against the field's type hint; the schema is the dataclasses themselves."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where} = {value!r}: expected {_type_name(hint)}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where} = {value!r}: expected {_type_name(hint)}")
        (item,) = typing.get_args(hint)
        return [_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} = {value!r}: expected {_type_name(hint)}")
        kh, vh = typing.get_args(hint)
        return {_coerce(kh, k, f"{where} key"): _coerce(vh, v, f"{where}.{k}") for k, v in value.items()}
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
        if ok and not math.isfinite(value) and not where.startswith(INF_ALLOWED):
            raise ConfigError(f"{where} = {value!r}: must be finite")
    elif hint is str:
        ok = isinstance(value, str | int | float) and not isinstance(value, bool)  # env: "1" or 1
        value = str(value) if ok else value
    else:
        ok = isinstance(value, hint)
    if not ok:
        raise ConfigError(f"{where} = {value!r}: expected {_type_name(hint)}")
    return value


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'profile'}: expected a mapping for {cls.__name__}, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = set(data) - set(names)
    if unknown:
        raise ConfigError(f"{where or 'profile'}: unknown keys {sorted(unknown)}; allowed {names}")
    kwargs = {key: _coerce(hints[key], value, f"{where}.{key}".lstrip(".")) for key, value in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field missing (e.g. name)
        raise ConfigError(f"{where or 'profile'}: {exc}") from exc


def _set_dotted(data: dict, dotted: str, value: Any) -> None:
    *path, last = dotted.split(".")
    node = data
    for i, key in enumerate(path):
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: {'.'.join(path[: i + 1])} is not a mapping")
    node[last] = value


def _refuse_duplicates(node: yaml.Node, what: str, path: str = "") -> None:
    """A key given twice in one mapping: PyYAML keeps the last silently; here it is an error."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
            name = f"{path}.{key}" if path else key
            line = key_node.start_mark.line + 1
            if key in seen and key != "<<":
                raise ConfigError(
                    f"{what}: {name} is given twice (lines {seen[key]} and {line}); one value per key"
                )
            seen[key] = line
            _refuse_duplicates(value_node, what, name)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicates(item, what, f"{path}[{i}]")


def _yaml(text: str, what: str) -> Any:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None:
            _refuse_duplicates(node, what)
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{what}: not valid YAML{where}: {problem}") from exc


def profile_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path
    if path.suffix in (".yaml", ".yml"):
        raise ConfigError(f"profile file {name_or_path} does not exist")
    candidate = PROFILE_DIR / f"{name_or_path}.yaml"
    if not candidate.exists():
        known = sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))
        raise ConfigError(f"no profile {name_or_path!r}; known: {known}")
    return candidate


def load_profile(name_or_path: str, overrides: list[str] | None = None) -> Profile:
    """Load a profile; each override is `dotted.key=yaml_value` (e.g. `plan.decode.window_s=10`).

    Every field is checked against the dataclasses' types and ranges before anything else runs;
    a violation is one ConfigError line naming the field, its value and what is allowed."""
    path = profile_path(name_or_path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"profile {path}: cannot read it: {exc}") from exc
    data = _yaml(text, f"profile {path}")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"profile {path}: the top level must be a mapping, got {type(data).__name__}")
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key=value (e.g. plan.decode.window_s=60)")
        _set_dotted(data, key.strip(), _yaml(raw, f"--set {key.strip()}"))
    name = data.get("name", name_or_path)
    try:
        return _build(Profile, data, "")
    except ConfigError as exc:
        raise ConfigError(f"profile {name}: {exc}") from exc


# every plan field naming the prompt text of some cells (`--corpus` sets each one to sharegpt);
# the ones ending in `workloads` are lists (one cell per workload)
WORKLOAD_FIELDS = (
    "plan.prefill.workload",
    "plan.ttft_workload",
    "plan.nll_workload",
    "plan.greedy.workload",
    "plan.decode.workloads",
    "plan.long_decode.workloads",
    "plan.rate.workload",
    "plan.shared_prefix_workload",
    "plan.chat.workload",
)


def workload_settings(plan: Plan) -> dict[str, list[str]]:
    """WORKLOAD_FIELDS → the workloads each names (a list for every field)."""
    out = {}
    for path in WORKLOAD_FIELDS:
        value: Any = plan
        for part in path.split(".")[1:]:
            value = getattr(value, part)
        out[path] = list(value) if isinstance(value, list) else [value]
    return out


def profile_dict(profile: Profile) -> dict[str, Any]:
    return dataclasses.asdict(profile)


def parse_numerics(text: str) -> dict[str, float]:
    """`report --numerics '{nll_doc_z: 3.0, nll_doc_abs: 0.5}'`: tolerances given after a run,
    checked by the same schema and ranges as a profile's `ab.numerics`."""
    value = _yaml(text, "--numerics")
    try:
        return _build(AB, {"numerics": value}, "ab").numerics
    except ConfigError as exc:
        raise ConfigError(f"--numerics: {exc}") from exc
