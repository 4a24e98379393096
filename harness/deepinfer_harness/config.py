"""Typed profile configuration: YAML → nested pydantic v2 models, `--set a.b=value` overrides, validation.

Profiles live in harness/profiles/<name>.yaml (or any path). The schema is the models below: every
section forbids unknown keys (`extra="forbid"`), every number is typed strictly (no bool for an
integer, no "5" for a number) and finite except where infinity means something (`Rate`: all at
once, a constant gamma process), and the YAML loader refuses a key given twice. Each section's
`check_ranges` then rejects configurations that vLLM 0.32.0 would refuse or that would silently
change the measurement (e.g. max_model_len below ISL + OSL, which clamps max_tokens). Whatever
pydantic refuses is mapped to one ConfigError line naming the field, its value and what is allowed
(`_message`): those lines are the contract the bad-input tests hold word for word.
"""

from __future__ import annotations

import math
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Self

import yaml
from pydantic import (
    AllowInfNan,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    model_validator,
)

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
CHAT_TEMPLATE_MARGIN = 64  # tokens the chat template may add around a user message (role markers)


def _scalar_text(value: Any) -> Any:
    """A string field takes a YAML number too (env: "1" or 1); never a bool."""
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


Int = Annotated[int, Strict()]  # an integer; not a bool, not "5"
Bool = Annotated[bool, Strict()]
Str = Annotated[str, BeforeValidator(_scalar_text), Strict()]
# a number (an integer is taken as one) that must be finite: .inf / .nan in e.g. window_s would pass
# validation and crash or hang mid-run
Float = Annotated[float, Strict(), AllowInfNan(False)]
# the numbers where .inf means something: plan.rate.rates (all at once), plan.rate.burstiness (even
# gaps); plan.rate.ramps' rates are Rate too so that their own check names the field ("finite rate")
Rate = Annotated[float, Strict()]


class ConfigError(ValueError):
    pass


class _SectionError(ConfigError):
    """A section refused while it was built (pydantic builds a nested section through its own
    `__init__`): the message is re-made with the enclosing path once that is known."""

    def __init__(self, cls: type[BaseModel], data: Any, exc: ValidationError) -> None:
        self.cls, self.data, self.exc = cls, data, exc
        super().__init__(_message(cls, data, exc, ""))

    def at(self, where: str) -> str:
        return _message(self.cls, self.data, self.exc, where)


class _Section(BaseModel):
    """One profile section: unknown keys refused, fields typed strictly, then `check_ranges`."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _SectionError(type(self), data, exc) from None

    @model_validator(mode="after")
    def _ranges(self) -> Self:
        self.check_ranges()
        return self

    def check_ranges(self) -> None:
        """The section's range and consistency rules (one ConfigError line each)."""


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


class Topology(_Section):
    tp: Int = 1
    pp: Int = 1
    pp_partition: list[Int] | None = None
    num_hidden_layers: Int | None = None
    kv_sharing_groups: list[list[Int]] = Field(default_factory=list)
    nodes: Int = 1
    ray: Bool = False

    def check_ranges(self) -> None:
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


class Server(_Section):
    mode: Str = "local"  # local | docker | url | level (a local patched CPU tree per arm)
    schedule: Str = "sequential"  # sequential: one server at a time; concurrent: both arms up at once
    images: dict[Str, Str] = Field(
        default_factory=lambda: {"A": "deepinfer-sm80:baseline", "B": "deepinfer-sm80:deepinfer"}
    )
    urls: dict[Str, Str] = Field(default_factory=dict)
    # local mode: `vllm serve` through this interpreter; `commands` may give each arm its own
    # install (e.g. two virtualenvs), otherwise both arms run `command` (an A/A unless env differs)
    command: list[Str] = Field(
        default_factory=lambda: ["{python}", "-m", "vllm.entrypoints.cli.main", "serve"]
    )
    commands: dict[Str, list[Str]] = Field(default_factory=dict)
    host: Str = "127.0.0.1"
    ports: dict[Str, Int] = Field(default_factory=lambda: {"A": 8100, "B": 8101})
    env: dict[Str, Str] = Field(default_factory=dict)
    variant_env: dict[Str, dict[Str, Str]] = Field(default_factory=dict)
    pass_env: list[Str] = Field(default_factory=list)  # host variables the server may see (by name)
    docker_args: list[Str] = Field(default_factory=list)
    # docker run --gpus: all, a count ("4"), or the device indices ([0, 1, 2, 3]) this server may use
    gpus: Str | list[Int] = "all"
    health_timeout_s: Float = 1800.0
    nice: Int = 0  # >0: lower the server's CPU priority, its session autogroup included (Linux)
    # mode level: each arm serves vLLM patched to a DeepInfer level on CPU (issue 20): A base (00),
    # B optimized (00+01), from the scratch trees deepinfer_sm80.testing.e2e prepares
    levels: dict[Str, Str] = Field(default_factory=dict)
    level_work: Str | None = None  # where the scratch trees live; None: the e2e module's own default

    def check_ranges(self) -> None:
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
        self._check_gpus()
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

    def _check_gpus(self) -> None:
        gpus = self.gpus
        if isinstance(gpus, list):
            _require(bool(gpus), "server.gpus", gpus, "needs at least one device index")
            _require(all(g >= 0 for g in gpus), "server.gpus", gpus, "device indices are >= 0")
            _require(len(set(gpus)) == len(gpus), "server.gpus", gpus, "must not repeat")
        else:
            ok = gpus == "all" or (gpus.isdigit() and int(gpus) >= 1)
            _require(ok, "server.gpus", gpus, "allowed all, a count >= 1, or a list of device indices")


class PrefillPlan(_Section):
    isls: list[Int] = Field(default_factory=list)
    n: Int = 5
    n_long: Int = 3  # ISL >= long_isl
    long_isl: Int = 160_000
    concurrent: list[dict[Str, Int]] = Field(default_factory=list)  # [{isl, c, n}]
    workload: Str = DEFAULT_WORKLOAD  # prompt text of the prefill cells (workloads.py)

    def check_ranges(self) -> None:
        _workload("plan.prefill.workload", self.workload)
        _each_positive("plan.prefill.isls", self.isls)
        for name in ("n", "n_long", "long_isl"):
            _require(getattr(self, name) >= 1, f"plan.prefill.{name}", getattr(self, name), "must be >= 1")
        _specs("plan.prefill.concurrent", self.concurrent, ("isl", "c"), ("n",))


class DecodePlan(_Section):
    isl: Int = 2048
    osl: Int = 512
    concurrencies: list[Int] = Field(default_factory=list)
    warmup_s: Float = 30.0
    window_s: Float = 120.0
    min_steps: Int = 2000
    workloads: list[Str] = Field(default_factory=lambda: [DEFAULT_WORKLOAD])  # one decode cell per C each

    def check_ranges(self) -> None:
        for w in self.workloads:
            _workload("plan.decode.workloads", w)
        _require(bool(self.workloads), "plan.decode.workloads", self.workloads, "needs at least one workload")
        _require(self.isl >= 1, "plan.decode.isl", self.isl, "must be >= 1")
        _require(self.osl >= 2, "plan.decode.osl", self.osl, "must be >= 2 (TPOT needs two tokens)")
        _each_positive("plan.decode.concurrencies", self.concurrencies)
        _require(self.warmup_s >= 0, "plan.decode.warmup_s", self.warmup_s, "must be >= 0 seconds")
        _require(self.window_s > 0, "plan.decode.window_s", self.window_s, "must be > 0 seconds")
        _require(self.min_steps >= 0, "plan.decode.min_steps", self.min_steps, "must be >= 0")


class GreedyPlan(_Section):
    isl: Int = 2048
    osl: Int = 256
    concurrencies: list[Int] = Field(default_factory=list)
    n: Int = 8
    workload: Str = DEFAULT_WORKLOAD

    def check_ranges(self) -> None:
        _workload("plan.greedy.workload", self.workload)
        for name in ("isl", "osl", "n"):
            _require(getattr(self, name) >= 1, f"plan.greedy.{name}", getattr(self, name), "must be >= 1")
        _each_positive("plan.greedy.concurrencies", self.concurrencies)


Length = Int | dict[Str, Float]  # an integer, {mean, std, min, max} or {min, max} (lengths.py)
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


class Ramp(_Section):
    """`vllm bench serve --ramp-up-strategy S --ramp-up-start-rps A --ramp-up-end-rps B`: the
    request rate moves from start_rps to end_rps over the cell's requests (or its duration)."""

    strategy: Str  # linear | exponential; all three required (no silent default ramp)
    start_rps: Rate
    end_rps: Rate

    def check_ranges(self) -> None:
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


class RateSweep(_Section):
    """GuideLLM's sweep: a synchronous cell (one request at a time) measures S, the all-at-once
    rate cell (`.inf`, capped by max_concurrency when set) measures T, the most requests/s the
    server completes; `points` rates evenly between them (S + k/(points+1)·(T − S), k = 1 …
    points) follow, each a rate cell compared A/B. The first usable run of each anchor in schedule
    order decides the rates, once; the run's manifest records them (resume reads them)."""

    points: Int = 0  # 0: no sweep

    def check_ranges(self) -> None:
        _require(
            0 <= self.points <= MAX_SWEEP_POINTS,
            "plan.rate.sweep.points",
            self.points,
            f"must be 0 (no sweep) .. {MAX_SWEEP_POINTS}",
        )


class RatePlan(_Section):
    """Open loop (vllm bench serve --request-rate): n requests per cell sent at seeded arrival times,
    whatever the server's state; one cell per rate and arrival process, the sweep up to saturation."""

    rates: list[Rate] = Field(default_factory=list)  # requests/s; .inf = every request at t = 0
    arrivals: list[Str] = Field(default_factory=lambda: ["poisson"])
    isl: Length = 1024
    osl: Length = 128
    n: Int = 100
    warmup: Int = 1
    max_concurrency: Int | None = None  # a cap on requests in flight (vllm bench --max-concurrency)
    seed: Int = 0
    workload: Str = DEFAULT_WORKLOAD
    # arrival gamma: one cell per factor (vllm bench serve --burstiness; 1 = its Poisson process)
    burstiness: list[Rate] = Field(default_factory=lambda: [1.0])
    ramps: list[Ramp] = Field(default_factory=list)  # one ramp cell each (per arrival)
    # duration-bounded cells next to the count-bounded ones: each finite rate and ramp, per duration
    durations_s: list[Float] = Field(default_factory=list)
    sweep: RateSweep = Field(default_factory=RateSweep)

    @property
    def active(self) -> bool:
        """The plan makes rate cells (fixed rates, ramps or a sweep)."""
        return bool(self.rates or self.ramps or self.sweep.points)

    def check_ranges(self) -> None:
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


class ChatPlan(_Section):
    """Chat-template prompts through /v1/chat/completions. V4.1's template turns thinking on when
    the request leaves it unset, so a chat cell must pin it: `thinking: false` or `true`."""

    isl: Int = 1024
    osl: Int = 128
    concurrencies: list[Int] = Field(default_factory=list)
    n: Int = 8
    thinking: Bool | None = None
    workload: Str = DEFAULT_WORKLOAD

    def check_ranges(self) -> None:
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


class Plan(_Section):
    prefill: PrefillPlan = Field(default_factory=PrefillPlan)
    ttft_isls: list[Int] = Field(default_factory=list)
    ttft_n: Int = 30
    ttft_workload: Str = DEFAULT_WORKLOAD
    decode: DecodePlan = Field(default_factory=DecodePlan)
    # long generation (the seed's third workload): decode cells with a long output, same rules
    long_decode: DecodePlan = Field(default_factory=DecodePlan)
    nll: list[dict[Str, Int]] = Field(default_factory=list)  # [{isl, docs}]
    nll_workload: Str = DEFAULT_WORKLOAD
    greedy: GreedyPlan = Field(default_factory=GreedyPlan)
    rate: RatePlan = Field(default_factory=RatePlan)
    # [{prefix, isl, osl, n, c}]: n prompts of isl tokens whose first `prefix` tokens are shared
    shared_prefix: list[dict[Str, Int]] = Field(default_factory=list)
    shared_prefix_workload: Str = DEFAULT_WORKLOAD
    chat: ChatPlan = Field(default_factory=ChatPlan)
    # latency percentiles every summary reports (p<q>_ttft_ms, …) and the A/B compares
    percentiles: list[Float] = Field(default_factory=lambda: [50.0, 90.0, 99.0])
    # goodput: a request counts when it meets every SLO set here (ms); reported per run and compared
    slo: dict[Str, Float] = Field(default_factory=dict)
    order_seed: Int = 20261129

    def check_ranges(self) -> None:
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


class AB(_Section):
    repetitions: Int = 2  # ABBA blocks; each block gives two (A, B) pairs
    aa: Bool = False  # both arms are the same build on purpose: nothing is marked better or worse
    bootstrap_resamples: Int = 10_000
    seed: Int = 0
    deltas: dict[Str, Float] = Field(default_factory=default_deltas)  # declared per metric (metric_table)
    # the numeric parity certificate's tolerances, declared before the run (docs/AB_METHOD.md):
    # nll_doc_abs = largest |NLL_B − NLL_A| per document (nats/token), nll_doc_z = largest
    # per-document |z| = |mean of NLL_B,t − NLL_A,t| / (its SD/√positions), greedy_match = least
    # share of prompts whose greedy tokens are identical; every declared one must hold; unset:
    # reported, not decided
    numerics: dict[Str, Float] = Field(default_factory=dict)

    def check_ranges(self) -> None:
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


class Validity(_Section):
    # Host load: a number turns on the per-row rule (analysis/ab.py host_load_bound: could an arm-sided
    # client lag change this A/B verdict?), null turns it off; the value is what runs recorded before
    # issue 42 were judged with. The *_ms caps are absolute, invalidate a run, and are off by default.
    loop_lag_share: Float | None = 0.05
    loop_lag_p99_ms: Float | None = None
    loop_lag_max_ms: Float | None = None
    first_request_factor: Float = 3.0
    inflight_fraction: Float = 0.95
    reset_prefix_cache: Bool = False

    def check_ranges(self) -> None:
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


class Profile(_Section):
    name: Str
    description: Str = ""
    model: Str | None = None  # None: build the tiny local model
    # config.json model_type values this profile serves; empty: any (preflight checks it)
    model_types: list[Str] = Field(default_factory=list)
    served_model_name: Str | None = None
    labels: dict[Str, Str] = Field(default_factory=lambda: {"A": "baseline", "B": "deepinfer"})
    topology: Topology = Field(default_factory=Topology)
    server: Server = Field(default_factory=Server)
    max_model_len: Int = 4096
    dtype: Str | None = None
    kv_cache_dtype: Str | None = None
    speculative: dict[Str, Any] | None = None
    serve_flags: list[Str] = Field(default_factory=list)
    env: dict[Str, Str] = Field(default_factory=dict)
    plan: Plan = Field(default_factory=Plan)
    ab: AB = Field(default_factory=AB)
    validity: Validity = Field(default_factory=Validity)
    read_timeout_s: Float = 3600.0
    corpus_file: Str | None = None  # ShareGPT JSON/JSONL for workload sharegpt (--corpus FILE)

    def check_ranges(self) -> None:
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
        gpus, topo = self.server.gpus, self.topology
        if self.server.mode == "docker" and isinstance(gpus, list):
            per_node = -(-topo.tp * topo.pp // topo.nodes)
            _require(
                len(gpus) >= per_node,
                "server.gpus",
                gpus,
                f"TP{topo.tp} x PP{topo.pp} on {topo.nodes} node(s) needs {per_node} GPUs per node",
            )
        if "--disable-log-stats" in self.serve_flags:
            raise ConfigError("--disable-log-stats removes the Prometheus counters the harness needs")


def _no_replication(topo: Topology) -> str:
    cuts = split_text(topo.pp_partition or [], topo.groups())
    return (
        f"topology.pp_partition = {topo.pp_partition}: {cuts}, and DEEPINFER_SM80_PP_REPLICATION=0 turns "
        "off the replication that serves it; drop that variable or pick a partition without such a cut"
    )


_M = typing.TypeVar("_M", bound=BaseModel)


def _unwrap(hint: Any) -> Any:
    while typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    return hint


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (types.UnionType, typing.Union)


def _type_name(hint: Any) -> str:
    hint = _unwrap(hint)
    origin = typing.get_origin(hint)
    if _is_union(hint):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(hint)[0])}"
    if origin is dict:
        k, v = typing.get_args(hint)
        return f"a mapping of {_type_name(k)} to {_type_name(v)}"
    return {int: "integer", float: "number", str: "string", bool: "true/false", type(None): "null"}.get(
        hint, getattr(hint, "__name__", str(hint))
    )


def _locate(cls: type[BaseModel], loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], Any]:
    """The deepest prefix of a pydantic error location that names a schema field, and its type.

    A union (`int | {mean, …}`, `list[int] | None`) is one field: an error inside any member is
    reported at the union, with the union's own type name, as the schema reads."""
    hint: Any = cls
    depth = 0
    for part in loc:
        hint = _unwrap(hint)
        origin = typing.get_origin(hint)
        if _is_union(hint):
            break
        if isinstance(hint, type) and issubclass(hint, BaseModel) and part in hint.model_fields:
            hint = hint.model_fields[part].annotation
        elif origin is list and isinstance(part, int):
            hint = typing.get_args(hint)[0]
        elif origin is dict and isinstance(part, str):
            hint = typing.get_args(hint)[1]
        else:
            break
        depth += 1
    return loc[:depth], _unwrap(hint)


def _dotted(where: str, loc: tuple[Any, ...]) -> str:
    name = where
    for part in loc:
        name += f"[{part}]" if isinstance(part, int) else f".{part}"
    return name.lstrip(".")


def _raw(data: Any, loc: tuple[Any, ...], fallback: Any) -> Any:
    """The value the user wrote at `loc` (before any coercion), for the message."""
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return fallback
    return data


def _message(cls: type[BaseModel], data: Any, exc: ValidationError, where: str) -> str:
    """pydantic's first error as the schema's one line: `field = value: what is allowed`."""
    errors = exc.errors()
    # an unknown key first (a misspelt key also leaves its field missing), then schema order
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    error = (first.get("ctx") or {}).get("error")
    loc = tuple(first["loc"])
    if isinstance(error, _SectionError):  # a nested section, refused where it stands
        return error.at(_dotted(where, loc))
    if isinstance(error, ConfigError):  # a section's check_ranges
        return str(error)
    kind = first["type"]
    if kind in ("extra_forbidden", "missing"):
        parent = loc[:-1]
        same = [e for e in errors if e["type"] == kind and tuple(e["loc"][:-1]) == parent]
        keys = sorted(str(e["loc"][-1]) for e in same)
        _, section = _locate(cls, parent)
        section_name = _dotted(where, parent) or "profile"
        if kind == "missing":
            return f"{section_name}: missing required {keys}"
        return f"{section_name}: unknown keys {keys}; allowed {list(section.model_fields)}"
    at, hint = _locate(cls, loc)
    name = _dotted(where, at)
    value = _raw(data, at, first.get("input"))
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return f"{name or 'profile'}: expected a mapping for {hint.__name__}, got {value!r}"
    if kind == "finite_number":
        return f"{name} = {value!r}: must be finite"
    return f"{name} = {value!r}: expected {_type_name(hint)}"


def _build(cls: type[_M], data: Any, where: str) -> _M:
    """`data` validated as `cls` (the section at dotted path `where`), or one ConfigError line."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'profile'}: expected a mapping for {cls.__name__}, got {data!r}")
    try:
        return cls.model_validate(data)
    except _SectionError as exc:
        raise ConfigError(exc.at(where)) from None
    except ValidationError as exc:
        raise ConfigError(_message(cls, data, exc, where)) from None


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

    Every field is checked against the models' types and ranges before anything else runs;
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
    return profile.model_dump()


def parse_numerics(text: str) -> dict[str, float]:
    """`report --numerics '{nll_doc_z: 3.0, nll_doc_abs: 0.5}'`: tolerances given after a run,
    checked by the same schema and ranges as a profile's `ab.numerics`."""
    value = _yaml(text, "--numerics")
    try:
        return _build(AB, {"numerics": value}, "ab").numerics
    except ConfigError as exc:
        raise ConfigError(f"--numerics: {exc}") from exc
