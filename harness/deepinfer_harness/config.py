"""Typed profile configuration: YAML → nested dataclasses, `--set a.b=value` overrides, validation.

Profiles live in harness/profiles/<name>.yaml (or any path). Unknown keys are errors, and
`__post_init__` rejects configurations that vLLM 0.32.0 would refuse or that would silently
change the measurement (e.g. max_model_len below ISL + OSL, which clamps max_tokens).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deepinfer_harness.topology import V41_KV_SHARING_GROUPS, partition_error

PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles"
VARIANTS = ("A", "B")


class ConfigError(ValueError):
    pass


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
        if self.tp < 1 or self.pp < 1 or self.nodes < 1:
            raise ConfigError("tp, pp and nodes must be >= 1")
        if self.pp_partition is not None:
            groups = tuple((int(s), int(e)) for s, e in self.kv_sharing_groups) or V41_KV_SHARING_GROUPS
            layers = self.num_hidden_layers or sum(self.pp_partition)
            error = partition_error(self.pp_partition, self.pp, layers, groups)
            if error:
                raise ConfigError(error)
        if self.nodes > 1 and not self.ray:
            raise ConfigError("a multi-node server needs ray: true (vLLM launches it over Ray)")


@dataclass
class Server:
    mode: str = "local"  # local | docker | url
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

    def __post_init__(self) -> None:
        if self.mode not in ("local", "docker", "url"):
            raise ConfigError(f"server.mode must be local, docker or url, got {self.mode!r}")
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


@dataclass
class PrefillPlan:
    isls: list[int] = field(default_factory=list)
    n: int = 5
    n_long: int = 3  # ISL >= long_isl
    long_isl: int = 160_000
    concurrent: list[dict[str, int]] = field(default_factory=list)  # [{isl, c, n}]


@dataclass
class DecodePlan:
    isl: int = 2048
    osl: int = 512
    concurrencies: list[int] = field(default_factory=list)
    warmup_s: float = 30.0
    window_s: float = 120.0
    min_steps: int = 2000


@dataclass
class GreedyPlan:
    isl: int = 2048
    osl: int = 256
    concurrencies: list[int] = field(default_factory=list)
    n: int = 8


@dataclass
class Plan:
    prefill: PrefillPlan = field(default_factory=PrefillPlan)
    ttft_isls: list[int] = field(default_factory=list)
    ttft_n: int = 30
    decode: DecodePlan = field(default_factory=DecodePlan)
    nll: list[dict[str, int]] = field(default_factory=list)  # [{isl, docs}]
    greedy: GreedyPlan = field(default_factory=GreedyPlan)
    order_seed: int = 20261129


@dataclass
class AB:
    repetitions: int = 2  # ABBA blocks; each block gives two (A, B) pairs
    aa: bool = False  # both arms are the same build on purpose: nothing is marked better or worse
    bootstrap_resamples: int = 10_000
    seed: int = 0
    deltas: dict[str, float] = field(default_factory=lambda: {"decode_tok_s": 0.02, "ttft_ms": 0.03})


@dataclass
class Validity:
    loop_lag_p99_ms: float = 5.0
    loop_lag_max_ms: float = 50.0
    first_request_factor: float = 3.0
    inflight_fraction: float = 0.95
    reset_prefix_cache: bool = False


@dataclass
class Profile:
    name: str
    description: str = ""
    model: str | None = None  # None: build the tiny local model
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

    def __post_init__(self) -> None:
        if self.ab.repetitions < 1:
            raise ConfigError(f"ab.repetitions must be >= 1, got {self.ab.repetitions}")
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
        if p.greedy.concurrencies:
            needs.append(p.greedy.isl + p.greedy.osl)
        if needs and max(needs) > self.max_model_len:
            raise ConfigError(
                f"max_model_len {self.max_model_len} < largest ISL+OSL {max(needs)}: "
                "vLLM would silently clamp max_tokens"
            )
        if self.speculative and self.speculative.get("num_speculative_tokens_per_batch_size"):
            raise ConfigError("leave num_speculative_tokens_per_batch_size unset (it changes tokens/step)")
        flags = self.serve_flags
        if "--max-num-seqs" in flags and p.decode.concurrencies:
            max_seqs = int(flags[flags.index("--max-num-seqs") + 1])
            if max(p.decode.concurrencies) > max_seqs:
                raise ConfigError(
                    f"decode C={max(p.decode.concurrencies)} > --max-num-seqs {max_seqs}: "
                    "requests would queue and the window would not hold C in flight"
                )
        if "--disable-log-stats" in self.serve_flags:
            raise ConfigError("--disable-log-stats removes the Prometheus counters the harness needs")


def _build(cls: type, data: Any, where: str) -> Any:
    if not dataclasses.is_dataclass(cls):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping for {cls.__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    kwargs = {}
    for key, value in data.items():
        hint = hints[key]
        sub = hint if dataclasses.is_dataclass(hint) else None
        if isinstance(hint, types.UnionType):
            sub = next((a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)), None)
        kwargs[key] = _build(sub, value, f"{where}.{key}") if sub and value is not None else value
    return cls(**kwargs)


def _set_dotted(data: dict, dotted: str, value: Any) -> None:
    *path, last = dotted.split(".")
    node = data
    for key in path:
        node = node.setdefault(key, {})
    node[last] = value


def profile_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path
    candidate = PROFILE_DIR / f"{name_or_path}.yaml"
    if not candidate.exists():
        known = sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))
        raise ConfigError(f"no profile {name_or_path!r}; known: {known}")
    return candidate


def load_profile(name_or_path: str, overrides: list[str] | None = None) -> Profile:
    """Load a profile; each override is `dotted.key=yaml_value` (e.g. `plan.decode.window_s=10`)."""
    data = yaml.safe_load(profile_path(name_or_path).read_text()) or {}
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r} is not key=value")
        _set_dotted(data, key.strip(), yaml.safe_load(raw))
    try:
        return _build(Profile, data, data.get("name", name_or_path))
    except TypeError as exc:
        raise ConfigError(f"{name_or_path}: {exc}") from exc


def profile_dict(profile: Profile) -> dict[str, Any]:
    return dataclasses.asdict(profile)
