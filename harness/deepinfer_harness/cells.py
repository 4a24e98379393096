"""Cell ids: a small grammar that doubles as directory names.

    prefill-cold-i{L}[-c{C}]   cold prefill, C concurrent (default 1), max_tokens 1
    ttft-i{L}-c{C}             time to first token
    decode-i{L}-o{O}-c{C}      closed-loop decode at concurrency C
    nll-i{L}                   prompt-logprob NLL on reference documents of L tokens
    greedy-i{L}-o{O}-c{C}      greedy token-match check between arms
    rate-i{L}-o{O}-r{R}-{A}[-b{B}][-d{D}]
                               open loop: R requests/s (`0p5` = 0.5, `inf` = all at once), arrivals
                               A = poisson | constant | gamma | poisson0 (arrivals.py says what each
                               sends: poisson is vllm bench serve's); L and O are the means of the length
                               draws. R may also be a ramp `{S}to{E}lin` / `{S}to{E}exp` (the rate
                               moves from S to E requests/s, linearly or geometrically, as vllm bench
                               serve --ramp-up-strategy), `sync` (GuideLLM's synchronous strategy:
                               one request at a time, each sent when the one before ends: the sweep's
                               first anchor) or a sweep point `{k}of{N}sweep` (GuideLLM's sweep: the
                               synchronous rate S plus k/N of the way to the all-at-once throughput T,
                               both measured by the run, plan.rate.sweep). `{k}of{N}max` (k/N of T) is
                               the former anchor, read in runs recorded with it and planned no more.
                               `-b{B}`: the gamma process's burstiness (gamma cells only; 1 is
                               vllm bench serve's Poisson); `-d{D}`: send for D seconds (the requests
                               the seeded schedule puts in [0, D)) instead of a fixed count
    prefix-i{L}-p{P}-o{O}-c{C} shared prefix: every prompt's first P of L tokens are the same text,
                               prefix cache on (one salt per run)
    chat-i{L}-o{O}-c{C}        /v1/chat/completions with the chat template (L = the window of corpus
                               ids each user message is decoded from; the server counts the rest)

Any id may end in `-w{workload}` (`decode-i3k-o512-c8-wcode`): the prompt text (workloads.py);
without it the workload is `prose`. Sizes are integers; a `k` suffix means ×1024 (`i64k` = 65536),
and `format_size` writes the suffix only when it is exact, so `parse_cell(format_cell(c)) == c`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

KINDS = ("prefill-cold", "ttft", "decode", "nll", "greedy", "rate", "prefix", "chat")
ARRIVALS = ("poisson0", "poisson", "constant", "gamma")  # poisson0 first: the id regex tries it first
# `poisson` is vllm bench serve 0.32.0's Poisson process (arrivals.py); runs recorded before it was
# (the harness's own process, first request at t = 0, no rescaling) now read as `poisson0`
POISSON_PROCESS = "vllm-0.32.0"
RAMPS = {"linear": "lin", "exponential": "exp"}  # vllm bench serve --ramp-up-strategy → id suffix
DEFAULT_WORKLOAD = "prose"
WORKLOADS = ("prose", "code", "sharegpt", "page")  # workloads.py builds each one's text
_SIZE = r"(\d+k?)"
_NUM = r"\d+(?:p\d+)?"  # a decimal with `p` for the point (ids are directory names)
_RAMP = re.compile(rf"^({_NUM})to({_NUM})(lin|exp)$")
_SWEEP = re.compile(r"^(\d+)of(\d+)(max|sweep)$")
_WORKLOAD = re.compile(r"^(.*)-w([a-z][a-z0-9]*)$")
_PATTERNS = {
    "prefill-cold": re.compile(rf"^prefill-cold-i{_SIZE}(?:-c(\d+))?$"),
    "ttft": re.compile(rf"^ttft-i{_SIZE}-c(\d+)$"),
    "decode": re.compile(rf"^decode-i{_SIZE}-o{_SIZE}-c(\d+)$"),
    "nll": re.compile(rf"^nll-i{_SIZE}$"),
    "greedy": re.compile(rf"^greedy-i{_SIZE}-o{_SIZE}-c(\d+)$"),
    "rate": re.compile(
        rf"^rate-i{_SIZE}-o{_SIZE}-r(inf|sync|{_NUM}|{_NUM}to{_NUM}(?:lin|exp)|\d+of\d+(?:max|sweep))"
        rf"-({'|'.join(ARRIVALS)})(?:-b(inf|{_NUM}))?(?:-d({_NUM}))?$"
    ),
    "prefix": re.compile(rf"^prefix-i{_SIZE}-p{_SIZE}-o{_SIZE}-c(\d+)$"),
    "chat": re.compile(rf"^chat-i{_SIZE}-o{_SIZE}-c(\d+)$"),
}
# fields a cell of the original five kinds leaves at their defaults: dropped from its definition,
# so adding them kept every earlier cell's definition sha256 (resume compares it)
EXTRA_FIELDS = {
    "rate": 0.0,
    "arrival": "",
    "prefix": 0,
    # open-loop shapes added later (burstiness, ramp-up, duration bound, sweep point): the same rule
    "burstiness": 0.0,
    "ramp": "",
    "ramp_end": 0.0,
    "duration_s": 0.0,
    "sweep_k": 0,
    "sweep_of": 0,
    # GuideLLM's sweep anchor (synchronous rate, then throughput, points between): the same rule
    "synchronous": False,
    "sweep_between": False,
}


def format_rate(rate: float) -> str:
    """`4`, `0p5` (0.5), `inf`: a rate as it appears in a cell id (no dot: ids are directory names)."""
    if math.isinf(rate):
        return "inf"
    text = f"{rate:.6g}"
    if "e" in text:
        raise ValueError(f"rate {rate} cannot be written in a cell id; use a plain decimal")
    return text.replace(".", "p")


def parse_rate(text: str) -> float:
    return math.inf if text == "inf" else float(text.replace("p", "."))


def id_number_error(value: float, finite: bool = True) -> str | None:
    """Why `value` cannot be a number of a cell id (`None` when it can): it must be written
    exactly in at most 6 significant digits (`0p25`), so that parsing the id gives it back."""
    if math.isinf(value) and not finite and value > 0:
        return None
    if not math.isfinite(value):
        return "must be finite"
    try:
        text = format_rate(value)
    except ValueError as exc:
        return str(exc)
    if parse_rate(text) != value:
        return f"{value!r} is written {text!r} in a cell id, which reads back as {parse_rate(text)!r}"
    return None


def format_size(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def parse_size(text: str) -> int:
    value = int(text[:-1]) * 1024 if text.endswith("k") else int(text)
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return value


@dataclass(frozen=True, order=True)
class Cell:
    kind: str
    isl: int
    osl: int = 1
    concurrency: int = 1
    workload: str = DEFAULT_WORKLOAD
    rate: float = 0.0  # rate cells: requests per second (inf: all at t = 0); a ramp's start rate
    arrival: str = ""  # rate cells: poisson | constant | gamma | poisson0
    prefix: int = 0  # prefix cells: shared prefix length (tokens)
    burstiness: float = 0.0  # gamma cells: the gamma shape (vllm bench serve --burstiness); else 0
    ramp: str = ""  # ramp cells: linear | exponential, from `rate` to `ramp_end` requests/s
    ramp_end: float = 0.0
    duration_s: float = 0.0  # > 0: send the requests the schedule puts in [0, duration_s)
    sweep_k: int = 0  # sweep points: rate = S + sweep_k / sweep_of × (T − S) (run/sweep.py)
    sweep_of: int = 0
    synchronous: bool = False  # the sweep's synchronous anchor: rate inf sent one at a time
    sweep_between: bool = False  # a point between S and T (`sweep`); False: k/N of T (`max`, former)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown cell kind {self.kind!r}; expected one of {KINDS}")
        if self.isl <= 0 or self.osl <= 0 or self.concurrency <= 0:
            raise ValueError(f"isl, osl and concurrency must be positive: {self}")
        if self.kind in ("prefill-cold", "ttft", "nll") and self.osl != 1:
            raise ValueError(f"{self.kind} cells generate exactly one token (osl=1), got {self.osl}")
        if self.kind == "nll" and self.concurrency != 1:
            raise ValueError("nll cells run at concurrency 1")
        if self.kind == "prefix" and not 0 < self.prefix < self.isl:
            raise ValueError(f"prefix cells need 0 < prefix < isl: {self}")
        if self.kind == "rate":
            self._check_rate()
        elif any(getattr(self, k) != EXTRA_FIELDS[k] for k in EXTRA_FIELDS if k != "prefix"):
            raise ValueError(f"only rate cells have a rate, arrival, ramp, duration or sweep: {self}")

    def _check_rate(self) -> None:
        if self.arrival not in ARRIVALS:
            raise ValueError(f"rate cells need an arrival in {ARRIVALS}: {self}")
        if self.synchronous and not (
            math.isinf(self.rate) and not (self.ramp or self.duration_s or self.sweep_of)
        ):
            raise ValueError(
                f"a synchronous cell sends one request at a time: no rate, ramp or bound: {self}"
            )
        if self.sweep_between and not self.sweep_of:
            raise ValueError(f"sweep_between is a sweep point's: {self}")
        if self.sweep_of or self.sweep_k:
            if not 1 <= self.sweep_k < self.sweep_of:
                raise ValueError(f"a sweep point needs 1 <= k < N: {self}")
            if self.rate or self.ramp or self.duration_s:
                raise ValueError(f"a sweep point's rate is measured: no rate, ramp or duration: {self}")
        elif not self.rate > 0:
            raise ValueError(f"rate cells need a rate > 0: {self}")
        if self.ramp:
            if self.ramp not in RAMPS:
                raise ValueError(f"ramp must be one of {list(RAMPS)}: {self}")
            if not (math.isfinite(self.ramp_end) and 0 < self.rate < self.ramp_end):
                raise ValueError(f"a ramp needs 0 < start rate < end rate, both finite: {self}")
        elif self.ramp_end:
            raise ValueError(f"ramp_end without a ramp: {self}")
        if (self.arrival == "gamma") != (self.burstiness > 0):
            raise ValueError(f"gamma cells (and only they) need a burstiness > 0: {self}")
        if self.duration_s < 0 or (self.duration_s and math.isinf(self.rate)):
            raise ValueError(f"a duration bound needs a finite rate and a duration > 0: {self}")

    @property
    def is_sweep_point(self) -> bool:
        return self.sweep_of > 0

    @property
    def id(self) -> str:
        return format_cell(self)


def format_cell(cell: Cell) -> str:
    i, o, c = format_size(cell.isl), format_size(cell.osl), cell.concurrency
    match cell.kind:
        case "prefill-cold":
            base = f"prefill-cold-i{i}" + (f"-c{c}" if c != 1 else "")
        case "ttft":
            base = f"ttft-i{i}-c{c}"
        case "decode" | "greedy" | "chat":
            base = f"{cell.kind}-i{i}-o{o}-c{c}"
        case "rate":
            base = f"rate-i{i}-o{o}-r{_rate_text(cell)}-{cell.arrival}"
            base += f"-b{format_rate(cell.burstiness)}" if cell.arrival == "gamma" else ""
            base += f"-d{format_rate(cell.duration_s)}" if cell.duration_s else ""
        case "prefix":
            base = f"prefix-i{i}-p{format_size(cell.prefix)}-o{o}-c{c}"
        case _:
            base = f"nll-i{i}"
    return base if cell.workload == DEFAULT_WORKLOAD else f"{base}-w{cell.workload}"


def _rate_text(cell: Cell) -> str:
    if cell.synchronous:
        return "sync"
    if cell.sweep_of:
        return f"{cell.sweep_k}of{cell.sweep_of}{'sweep' if cell.sweep_between else 'max'}"
    if cell.ramp:
        return f"{format_rate(cell.rate)}to{format_rate(cell.ramp_end)}{RAMPS[cell.ramp]}"
    return format_rate(cell.rate)


def _parse_rate_cell(isl: int, osl: int, workload: str, groups: tuple[str | None, ...]) -> Cell:
    rate_text, arrival, burst, duration = groups[2], str(groups[3]), groups[4], groups[5]
    fields: dict = {
        "burstiness": parse_rate(burst) if burst is not None else 0.0,
        "duration_s": parse_rate(duration) if duration is not None else 0.0,
    }
    if rate_text == "sync":
        fields |= {"rate": math.inf, "synchronous": True}
    elif m := _SWEEP.match(str(rate_text)):
        fields |= {
            "sweep_k": int(m.group(1)),
            "sweep_of": int(m.group(2)),
            "sweep_between": m.group(3) == "sweep",
        }
    elif m := _RAMP.match(str(rate_text)):
        strategy = next(k for k, v in RAMPS.items() if v == m.group(3))
        fields |= {"rate": parse_rate(m.group(1)), "ramp": strategy, "ramp_end": parse_rate(m.group(2))}
    else:
        fields["rate"] = parse_rate(str(rate_text))
    return Cell("rate", isl, osl, 1, workload, arrival=arrival, **fields)


def parse_cell(cell_id: str) -> Cell:
    workload = DEFAULT_WORKLOAD
    if m := _WORKLOAD.match(cell_id):
        cell_id, workload = m.group(1), m.group(2)
        if workload == DEFAULT_WORKLOAD:
            raise ValueError(f"non-canonical cell id {cell_id}-w{workload!r}; write {cell_id!r}")
    for kind, pattern in _PATTERNS.items():
        m = pattern.match(cell_id)
        if not m:
            continue
        groups = m.groups()
        isl = parse_size(groups[0])
        if kind in ("decode", "greedy", "chat"):
            cell = Cell(kind, isl, parse_size(groups[1]), int(groups[2]), workload)
        elif kind == "rate":
            cell = _parse_rate_cell(isl, parse_size(groups[1]), workload, groups)
        elif kind == "prefix":
            cell = Cell(
                kind, isl, parse_size(groups[2]), int(groups[3]), workload, prefix=parse_size(groups[1])
            )
        elif kind == "nll":
            cell = Cell(kind, isl, workload=workload)
        else:
            cell = Cell(kind, isl, 1, int(groups[1]) if groups[1] else 1, workload)
        want = format_cell(dataclasses.replace(cell, workload=DEFAULT_WORKLOAD))
        if want != cell_id:
            raise ValueError(f"non-canonical cell id {cell_id!r}; write {want!r}")
        return cell
    raise ValueError(f"cannot parse cell id {cell_id!r}; grammar: see deepinfer_harness.cells")
