"""Cell ids: a small grammar that doubles as directory names.

    prefill-cold-i{L}[-c{C}]   cold prefill, C concurrent (default 1), max_tokens 1
    ttft-i{L}-c{C}             time to first token
    decode-i{L}-o{O}-c{C}      closed-loop decode at concurrency C
    nll-i{L}                   prompt-logprob NLL on reference documents of L tokens
    greedy-i{L}-o{O}-c{C}      greedy token-match check between arms
    rate-i{L}-o{O}-r{R}-{A}    open loop: R requests/s (`0p5` = 0.5, `inf` = all at once), arrivals
                               A = poisson | constant; L and O are the means of the length draws
    prefix-i{L}-p{P}-o{O}-c{C} shared prefix: every prompt's first P of L tokens are the same text,
                               prefix cache on (one salt per run)
    chat-i{L}-o{O}-c{C}        /v1/chat/completions with the chat template (L = the window of corpus
                               ids each user message is decoded from; the server counts the rest)

Any id may end in `-w{workload}` (`decode-i3k-o512-c8-wcode`): the prompt text (workloads.py);
without it the workload is `prose`. Sizes are integers; a `k` suffix means ×1024 (`i64k` = 65536),
and `format_size` writes the suffix only when it is exact, so `parse_cell(format_cell(c)) == c`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

KINDS = ("prefill-cold", "ttft", "decode", "nll", "greedy", "rate", "prefix", "chat")
ARRIVALS = ("poisson", "constant")
DEFAULT_WORKLOAD = "prose"
WORKLOADS = ("prose", "code", "sharegpt", "page")  # workloads.py builds each one's text
_SIZE = r"(\d+k?)"
_WORKLOAD = re.compile(r"^(.*)-w([a-z][a-z0-9]*)$")
_PATTERNS = {
    "prefill-cold": re.compile(rf"^prefill-cold-i{_SIZE}(?:-c(\d+))?$"),
    "ttft": re.compile(rf"^ttft-i{_SIZE}-c(\d+)$"),
    "decode": re.compile(rf"^decode-i{_SIZE}-o{_SIZE}-c(\d+)$"),
    "nll": re.compile(rf"^nll-i{_SIZE}$"),
    "greedy": re.compile(rf"^greedy-i{_SIZE}-o{_SIZE}-c(\d+)$"),
    "rate": re.compile(rf"^rate-i{_SIZE}-o{_SIZE}-r(inf|\d+(?:p\d+)?)-({'|'.join(ARRIVALS)})$"),
    "prefix": re.compile(rf"^prefix-i{_SIZE}-p{_SIZE}-o{_SIZE}-c(\d+)$"),
    "chat": re.compile(rf"^chat-i{_SIZE}-o{_SIZE}-c(\d+)$"),
}
# fields a cell of the original five kinds leaves at their defaults: dropped from its definition,
# so adding them kept every earlier cell's definition sha256 (resume compares it)
EXTRA_FIELDS = {"rate": 0.0, "arrival": "", "prefix": 0}


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
    rate: float = 0.0  # rate cells: requests per second (inf: all at t = 0)
    arrival: str = ""  # rate cells: poisson | constant
    prefix: int = 0  # prefix cells: shared prefix length (tokens)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown cell kind {self.kind!r}; expected one of {KINDS}")
        if self.isl <= 0 or self.osl <= 0 or self.concurrency <= 0:
            raise ValueError(f"isl, osl and concurrency must be positive: {self}")
        if self.kind in ("prefill-cold", "ttft", "nll") and self.osl != 1:
            raise ValueError(f"{self.kind} cells generate exactly one token (osl=1), got {self.osl}")
        if self.kind == "nll" and self.concurrency != 1:
            raise ValueError("nll cells run at concurrency 1")
        if self.kind == "rate" and (not self.rate > 0 or self.arrival not in ARRIVALS):
            raise ValueError(f"rate cells need a rate > 0 and an arrival in {ARRIVALS}: {self}")
        if self.kind == "prefix" and not 0 < self.prefix < self.isl:
            raise ValueError(f"prefix cells need 0 < prefix < isl: {self}")

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
            base = f"rate-i{i}-o{o}-r{format_rate(cell.rate)}-{cell.arrival}"
        case "prefix":
            base = f"prefix-i{i}-p{format_size(cell.prefix)}-o{o}-c{c}"
        case _:
            base = f"nll-i{i}"
    return base if cell.workload == DEFAULT_WORKLOAD else f"{base}-w{cell.workload}"


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
            cell = Cell(kind, isl, parse_size(groups[1]), 1, workload, parse_rate(groups[2]), groups[3])
        elif kind == "prefix":
            cell = Cell(
                kind, isl, parse_size(groups[2]), int(groups[3]), workload, prefix=parse_size(groups[1])
            )
        elif kind == "nll":
            cell = Cell(kind, isl, workload=workload)
        else:
            cell = Cell(kind, isl, 1, int(groups[1]) if groups[1] else 1, workload)
        want = format_cell(
            Cell(
                cell.kind,
                cell.isl,
                cell.osl,
                cell.concurrency,
                DEFAULT_WORKLOAD,
                cell.rate,
                cell.arrival,
                cell.prefix,
            )
        )
        if want != cell_id:
            raise ValueError(f"non-canonical cell id {cell_id!r}; write {want!r}")
        return cell
    raise ValueError(f"cannot parse cell id {cell_id!r}; grammar: see deepinfer_harness.cells")
