"""GPU timing: CUDA-graph replay over input sets rotated beyond L2, copy bandwidth, roofline fields.

A microbench prints one line per shape and never fails a test (docs/LAYOUT.md). Times are medians of
graph replays; each replay runs `calls` launches, each on the next input set, so no launch reads
what the previous one left in L2.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
import triton
import triton.language as tl

L2_FLUSH_BYTES = 256 << 20  # H200 L2 is 60 MB, A100 40 MB: rotate through > 4x that


@dataclass(frozen=True)
class Timing:
    name: str
    us: float  # median per call
    us_min: float
    bytes_moved: int
    gbps: float
    pct_of_copy: float | None
    floor_us: float | None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def input_sets_needed(bytes_per_call: int, limit: int = 64) -> int:
    """How many distinct input sets make one pass through them exceed L2_FLUSH_BYTES."""
    return max(2, min(limit, -(-L2_FLUSH_BYTES // max(bytes_per_call, 1))))


def time_graph(
    fn: Callable[[int], object], n_sets: int, *, calls: int | None = None, replays: int = 20, warmup: int = 3
) -> list[float]:
    """Per-call µs of `fn(i)` (i = input-set index) captured `calls` times in one CUDA graph."""
    calls = calls or n_sets
    for i in range(min(n_sets, calls)):
        fn(i)  # compile + warm outside capture
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        for i in range(calls):  # a second warm pass on the side stream, as capture requires
            fn(i % n_sets)
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for i in range(calls):
                fn(i % n_sets)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return samples


def time_eager(fn: Callable[[int], object], n_sets: int, *, reps: int = 50) -> list[float]:
    """Per-call µs with plain launches (for functions that cannot be graph-captured)."""
    for i in range(n_sets):
        fn(i)
    torch.cuda.synchronize()
    samples = []
    for r in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(r % n_sets)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return samples


def median_eager_us(fn: Callable[[], object], *, reps: int, warmup: int = 1) -> float:
    """Median µs of a no-argument callable over `reps` plain launches, after `warmup` untimed calls."""
    for _ in range(warmup - 1):
        fn()
    return statistics.median(time_eager(lambda _set: fn(), 1, reps=reps))


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def measure_copy_probes(nbytes: int = 2 << 30) -> dict[str, float]:
    """GB/s (bytes read + written) of a device-to-device copy done three ways.

    The ceiling is the best of them: on the H200 a torch copy replayed in a graph read 2.7 TB/s
    while an SM copy kernel went faster, and a ceiling set too low flatters every % of copy.
    """
    n = nbytes // 4
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    block = 8192
    probes = {
        "torch_copy_eager": time_eager(lambda _: dst.copy_(src), 1, reps=20),
        "torch_copy_graph": time_graph(lambda _: dst.copy_(src), 1, calls=4, replays=10),
        "triton_copy_graph": time_graph(
            lambda _: _copy_kernel[(triton.cdiv(n, block),)](src, dst, n, BLOCK=block, num_warps=8),
            1,
            calls=4,
            replays=10,
        ),
    }
    return {name: 2 * nbytes / (statistics.median(s) * 1e-6) / 1e9 for name, s in probes.items()}


@triton.jit
def _empty_kernel(ptr, n):
    if n < 0:  # never true: keeps the argument alive without touching memory
        tl.store(ptr, 0)


def measure_empty_launch_us() -> float:
    """Per-launch µs of an empty Triton kernel inside a graph: the launch share of every floor."""
    dummy = torch.empty(1, device="cuda")
    return statistics.median(time_graph(lambda _: _empty_kernel[(1,)](dummy, 1), 1, calls=200))


@dataclass(frozen=True)
class Ceilings:
    copy_gbps: float  # the best of copy_probes
    empty_launch_us: float
    copy_probes: dict[str, float] = field(default_factory=dict)

    @classmethod
    def measure(cls) -> Ceilings:
        probes = measure_copy_probes()
        return cls(max(probes.values()), measure_empty_launch_us(), probes)

    def as_dict(self) -> dict[str, object]:
        return {
            "copy_gbps": round(self.copy_gbps, 1),
            "empty_launch_us": round(self.empty_launch_us, 3),
            "copy_probes_gbps": {k: round(v, 1) for k, v in self.copy_probes.items()},
        }

    def floor_us(self, bytes_moved: int) -> float:
        return bytes_moved / (self.copy_gbps * 1e3) + self.empty_launch_us


def summarize(name: str, samples: Sequence[float], bytes_moved: int, ceilings: Ceilings | None) -> Timing:
    us = statistics.median(samples)
    gbps = bytes_moved / (us * 1e3) if us > 0 else 0.0
    return Timing(
        name=name,
        us=round(us, 3),
        us_min=round(min(samples), 3),
        bytes_moved=bytes_moved,
        gbps=round(gbps, 1),
        pct_of_copy=round(100 * gbps / ceilings.copy_gbps, 1) if ceilings else None,
        floor_us=round(ceilings.floor_us(bytes_moved), 3) if ceilings else None,
    )


def format_line(t: Timing, extra: str = "") -> str:
    pct = f" ({t.pct_of_copy:.0f}% of copy BW)" if t.pct_of_copy is not None else ""
    floor = f" | floor {t.floor_us:.1f} us" if t.floor_us is not None else ""
    return (
        f"{t.name:40} {t.us:10.1f} us | {t.gbps / 1e3:6.2f} TB/s{pct}{floor}{' | ' + extra if extra else ''}"
    )


# ----------------------------------------------------------------------------- the one result row format
IMPLS = ("deepinfer", "base", "upstream", "torch")
VERDICTS = ("bitwise", "close", "mismatch", "n/a")


@dataclass(frozen=True)
class Row:
    """One timed (op, impl, shape) in every bench's JSON; `make charts` draws these with no per-op code.

    `shape` names the series ("h16-ctx16k"), `size` is its x-axis value (tokens, query rows, keys);
    `verdict` is this impl's output against the reference impl of the same shape.
    """

    op: str
    impl: str
    shape: str
    size: int
    us: float
    gbps: float | None
    pct_of_copy: float | None
    floor_us: float | None
    verdict: str

    def __post_init__(self) -> None:
        if self.impl not in IMPLS:
            raise ValueError(f"{self.op}: impl {self.impl!r} not in {IMPLS}")
        if self.verdict not in VERDICTS:
            raise ValueError(f"{self.op}: verdict {self.verdict!r} not in {VERDICTS}")

    @classmethod
    def from_timing(cls, op: str, impl: str, shape: str, size: int, t: Timing, verdict: str) -> Row:
        return cls(op, impl, shape, size, t.us, t.gbps, t.pct_of_copy, t.floor_us, verdict)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


DIRECTIONS = (">=", "<=", "==")


def holds(measured: float, goal: float, direction: str) -> bool:
    """Whether `measured direction goal` holds (">=" a floor, "<=" a ceiling, "==" an exact count)."""
    if direction == ">=":
        return measured >= goal
    if direction == "<=":
        return measured <= goal
    if direction == "==":
        return measured == goal
    raise ValueError(f"direction {direction!r} not in {DIRECTIONS}")


@dataclass(frozen=True)
class Target:
    """A goal from an issue and what this run measured; a miss carries its measured cause.

    `direction` is required (keyword): a target without it reads the same whether 1.0001 was a
    floor or a ceiling. `met` may be False where the comparison holds (a target can fail on
    something else, e.g. an output mismatch, named in `cause`), never True where it does not.
    """

    name: str
    measured: float
    goal: float
    unit: str
    met: bool
    cause: str = ""
    direction: str = field(kw_only=True)

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"target {self.name!r}: direction {self.direction!r} not in {DIRECTIONS}")
        if self.met and not holds(self.measured, self.goal, self.direction):
            raise ValueError(
                f"target {self.name!r}: met=True but {self.measured} {self.direction} {self.goal} fails"
            )

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _target(name: str, measured: float, goal: float, unit: str, cause: str, direction: str) -> Target:
    recorded = round(measured, 3)  # met is judged on the value the JSON keeps
    ok = holds(recorded, goal, direction)
    return Target(name, recorded, goal, unit, ok, "" if ok else cause, direction=direction)


def at_least(name: str, measured: float, goal: float, unit: str, cause: str = "") -> Target:
    return _target(name, measured, goal, unit, cause, ">=")


def at_most(name: str, measured: float, goal: float, unit: str, cause: str = "") -> Target:
    return _target(name, measured, goal, unit, cause, "<=")


def exactly(name: str, measured: float, goal: float, unit: str, cause: str = "") -> Target:
    return _target(name, measured, goal, unit, cause, "==")
