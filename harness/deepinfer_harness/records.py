"""Per-request records and the append-only JSONL they live in (one line per finished request).

Field names follow the result layout: vLLM bench names (`ttft`, `latency`, `itl` in seconds) plus
integer-nanosecond raw timing (`t_send_ns`, `event_times_ns`) that every metric is computed from.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from deepinfer_harness.layout import jsonl_objects
from deepinfer_harness.strict_json import dumps, numbers

# the fields holding text; every other field holds numbers, where "inf" is read back as a number
TEXT_FIELDS = frozenset(
    {"cell_id", "variant", "phase", "request_id", "cache_salt", "prompt_sha256", "error", "finish_reason",
     "system_fingerprint"}
)  # fmt: skip


@dataclass
class RequestRecord:
    cell_id: str
    variant: str
    rep: int
    session: int
    index: int
    worker: int = 0
    phase: str = "measure"  # warmup | measure
    request_id: str = ""
    cache_salt: str = ""
    prompt_sha256: str = ""
    prompt_len: int = 0
    max_tokens: int = 0
    start_time: float = 0.0  # unix seconds at send
    t_send_ns: int = 0  # perf_counter_ns just before the body is written
    t_end_ns: int = 0
    event_times_ns: list[int] = field(default_factory=list)  # content events, stamped on read
    tokens_per_chunk: list[int | None] = field(default_factory=list)
    events_per_read: list[int] = field(default_factory=list)
    http_status: int = 0
    done: bool = False  # saw data: [DONE]
    error: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None  # usage.completion_tokens
    cached_tokens: int | None = None
    output_token_ids: list[int] | None = None
    server_metrics: dict[str, Any] | None = None
    system_fingerprint: str | None = None
    prompt_logprobs: dict[str, Any] | None = None  # nll cells: {lp, top1, rank} per position

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float | None:
        return (self.event_times_ns[0] - self.t_send_ns) / 1e9 if self.event_times_ns else None

    @property
    def latency(self) -> float | None:
        return (self.event_times_ns[-1] - self.t_send_ns) / 1e9 if self.event_times_ns else None

    @property
    def itl(self) -> list[float]:
        t = self.event_times_ns
        return [(b - a) / 1e9 for a, b in itertools.pairwise(t)]

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data |= {"ttft": self.ttft, "latency": self.latency, "itl": self.itl}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        """A record from its JSON; ±inf written as "inf" / "-inf" (strict_json) is a number again.
        A record whose timing cannot be computed (a stamp that is not a finite number, a list
        field holding something else) is read as a failed request naming the field, so the run
        is reported invalid instead of breaking the report."""
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v if k in TEXT_FIELDS else numbers(v) for k, v in data.items() if k in names}
        problem = _malformed(fields)
        record = cls(**fields)
        if problem and record.error is None:
            record.error = f"malformed record: {problem}"
        return record


IDENTITY = {"cell_id": "", "variant": "", "rep": -1, "session": -1, "index": -1}  # no default in the class


def _finite_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _malformed(fields: dict[str, Any]) -> str | None:
    """Repair `fields` in place where a value cannot be used (a list field that is not a list gets
    its default, a chunk count that is not a finite number is unknown, a server object that is
    not a mapping is none) and say what made the record's timing unusable, if anything."""
    problems = [f"missing field {name}" for name in IDENTITY if name not in fields]
    for name, default in IDENTITY.items():
        fields.setdefault(name, default)
    for name in ("t_send_ns", "t_end_ns"):
        if name in fields and not _finite_number(fields[name]):
            problems.append(f"{name} = {fields.pop(name)!r}")
    for name in ("event_times_ns", "tokens_per_chunk", "events_per_read"):
        if name in fields and not isinstance(fields[name], list):
            problems.append(f"{name} = {fields.pop(name)!r} (not a list)")
    times = fields.get("event_times_ns", [])
    if not all(_finite_number(t) for t in times):
        problems.append(f"event_times_ns holds {next(t for t in times if not _finite_number(t))!r}")
        fields["event_times_ns"] = [t for t in times if _finite_number(t)]
    if "tokens_per_chunk" in fields:
        fields["tokens_per_chunk"] = [k if _finite_number(k) else None for k in fields["tokens_per_chunk"]]
    for name in ("server_metrics", "prompt_logprobs"):
        if fields.get(name) is not None and not isinstance(fields[name], dict):
            fields[name] = None
    if fields.get("output_token_ids") is not None and not isinstance(fields["output_token_ids"], list):
        fields["output_token_ids"] = None
    return "; ".join(problems) or None


class JsonlWriter:
    """Appends one JSON line per record and flushes it, so a crash loses at most the request in flight."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.count = 0  # records written by this writer (progress lines read it)
        self._fh: TextIO = path.open("a", encoding="utf-8")

    def write(self, record: RequestRecord) -> None:
        self._fh.write(dumps(record.to_json(), separators=(",", ":")) + "\n")
        self._fh.flush()
        self.count += 1

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: Path) -> list[RequestRecord]:
    """Records from a JSONL file; a torn last line (killed mid-write) is ignored, any other line
    that does not parse is a ResultFileError naming it (layout.jsonl_objects)."""
    if not path.exists():
        return []
    return [RequestRecord.from_json(obj) for obj in jsonl_objects(path)]
