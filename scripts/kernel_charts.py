"""Kernel charts from results/gpu only (no GPU): the rows every bench writes, and the indexer's recorded
workspace.

Which file draws an op: results/gpu/*.json are the current run of each op (the newest where two hold
it). A run kept in a subfolder with its logs (results/gpu/<run>/*.json) is drawn only for an op no
top-level file holds (the newest such), and only if it is a bench's own output (it has `bench`):
entry-point A/B files time through vLLM's entry points, another quantity, and are not drawn here.

Charts: one per op (the indexer prefill's four ops share `indexer_prefill`), µs per call against size,
log-log. A series is one implementation at one shape; its legend name says which implementation
(NAMES: the bench's `base` has one meaning per chart), its line style + marker follow its role (ours,
base, upstream, torch, ...), its colour the shape (the role where a panel has one shape). Series timed
at one size only are drawn as grouped bars beside every other series at that shape and size. Like
shapes only: a shape with no DeepInfer series is left out and named in the chart's note; a chart with
one implementation is not drawn (nothing to compare). At most MAX_SERIES series a panel. Every panel
has a title naming its shapes (or its size, for bars).

Two charts have their own layout (FIGURES, one pure function each: rows in, figure out):
`sparse_mla_decode` is a panel per head count, colour = context, style = implementation; a context
timed at fewer Tq than the others (128K: Tq 6, 24, 48, the bench's TQ_AT_128K) is drawn as its points
alone and said so in the panel title and the note. `dspark_draft` is a 2 x 2 grid, timing mode (eager,
graph) by sampler (greedy, gumbel); in each panel colour = path (DeepInfer per-step, DeepInfer one
launch, upstream), style = what is timed (one draft position, all K positions). Their legends sit
below the panels, off the data.

`speedups`: per op and timing mode ("eager"/"graph" in a shape's name), ours over each reference at
equal (shape, size): median bar from 1 (slower hangs below the line), whiskers at min and max.
`indexer_workspace`: the indexer's peak workspace against context, dense vs streamed, as its JSON
records it (results.<case>.{dense,stream}_workspace_mb).

Every chart's title names the file, GPU (sm), torch, triton and git sha of its run. Re-running on the
same JSON rewrites identical files (fixed SVG hash salt, no date or software in the metadata); charts
that no JSON holds rows for any more are removed.

Usage: python scripts/kernel_charts.py RESULTS_GPU_DIR CHARTS_DIR
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import textwrap
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

plt.rcParams["svg.hashsalt"] = "deepinfer-sm80"  # stable element ids: the same JSON gives the same SVG

MAX_SERIES = 8
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray")
# role -> (line style, marker, filled marker); hollow markers stay visible over a line they overlap
ROLE_STYLE: dict[str, tuple[object, str, bool]] = {
    "deepinfer": ("-", "o", True),
    "base": ("--", "s", True),
    "upstream": (":", "^", False),
    "torch": ("-.", "x", True),
    "stage": ((0, (5, 1, 1, 1)), "D", False),
    "variant": ((0, (6, 2)), "P", True),
    "variant2": ((0, (1, 1)), "*", True),
}
ROLE_COLOR = {
    "deepinfer": "tab:blue",
    "base": "tab:orange",
    "upstream": "tab:green",
    "torch": "tab:gray",
    "stage": "tab:red",
    "variant": "tab:purple",
    "variant2": "tab:brown",
}
ROLE_HATCH = {"upstream": "//", "torch": "..", "stage": "xx"}
OURS = "deepinfer"
REFERENCES = ("base", "upstream")  # the roles the speed-up overview divides by
OVERLAP = 0.03  # two series of one shape within 3 % at every common size are said to overlap


class Impl(NamedTuple):
    name: str  # the legend's words: which implementation this series is
    role: str  # style, and what it is in the speed-up overview
    short: str  # the speed-up overview's word for it as a reference


_UP_E4M3 = "upstream vLLM 0.32.0 (hardware e4m3, sm_89+)"
# sparse MLA's "upstream" is vLLM's ROCm Triton function run on CUDA, not the FlashMLA vLLM runs on sm_90
_UP_ROCM_MLA = "upstream vLLM 0.32.0 rocm_sparse_attn_* (ROCm Triton on CUDA, hardware e4m3; not FlashMLA)"
_DENSE = Impl("dense (base): DeepInfer logits kernel + torch.topk", "base", "dense")
# (op, impl as the bench writes it) -> what the series is. The indexer bench files its own logits kernel
# under `base` (the dense path's first stage): in a logits chart that line is ours, so it is named so.
NAMES: dict[tuple[str, str], Impl] = {
    ("kv_gather", "base"): Impl("base: SM80 port of upstream's kernel (software e4m3)", "base", "base"),
    ("kv_gather", "upstream"): Impl(_UP_E4M3, "upstream", "upstream"),
    ("kv_quant_insert", "base"): Impl("base: SM80 port of upstream's kernel (software e4m3)", "base", "base"),
    ("kv_quant_insert", "upstream"): Impl(_UP_E4M3, "upstream", "upstream"),
    ("sparse_mla_decode", "base"): Impl(
        "base: SM80 port of upstream's split-K (software e4m3)", "base", "base"
    ),
    ("sparse_mla_decode", "upstream"): Impl(_UP_ROCM_MLA, "upstream", "upstream ROCm Triton (not FlashMLA)"),
    ("sparse_mla_prefill", "base"): Impl("base: SM80 port of upstream's prefill kernel", "base", "base"),
    ("sparse_mla_prefill", "upstream"): Impl(_UP_ROCM_MLA, "upstream", "upstream ROCm Triton (not FlashMLA)"),
    ("topk_swa_combine", "upstream"): Impl(
        "upstream vLLM 0.32.0 (runs on sm_80: the baseline)", "upstream", "upstream"
    ),
    ("topk_swa_combine", "torch"): Impl("PyTorch op chain", "torch", "torch"),
    ("dspark_draft", "upstream"): Impl("upstream vLLM 0.32.0 chain + sampler", "upstream", "upstream"),
    ("indexer_decode_logits", "base"): Impl(
        "DeepInfer SM80 paged logits kernel (software e4m3)", OURS, "ours"
    ),
    ("indexer_decode_logits", "upstream"): Impl(
        "upstream vLLM 0.32.0 ROCm Triton fp8 logits run on CUDA (sm_89+; not DeepGEMM)",
        "upstream",
        "upstream ROCm Triton (not DeepGEMM)",
    ),
    ("indexer_decode_topk", OURS): Impl("DeepInfer streamed: logits + running top-k", OURS, "ours"),
    ("indexer_decode_topk", "base"): _DENSE,
    ("indexer_prefill_topk", OURS): Impl("DeepInfer streamed: logits + running top-k", OURS, "ours"),
    ("indexer_prefill_topk", "base"): _DENSE,
    ("indexer_prefill_logits", "base"): Impl(
        "dense, its logits stage alone (DeepInfer kernel)", "stage", "stage"
    ),
    ("indexer_prefill_cand_write", OURS): Impl(
        "DeepInfer streamed + candidate write (layer 20)", "variant", "v"
    ),
    ("indexer_prefill_cand_only", OURS): Impl(
        "DeepInfer candidate columns only (layers 24-36)", "variant2", "v"
    ),
}
for _op in ("mhc_post_pre", "mhc_pre_first", "mhc_post"):
    NAMES[(_op, "upstream")] = Impl("upstream vLLM 0.32.0 TileLang (the baseline)", "upstream", "upstream")
    NAMES[(_op, "torch")] = Impl("fp32 torch spec", "torch", "torch")
DEFAULT_NAME = {
    OURS: "DeepInfer (ours)",
    "base": "base",
    "upstream": "upstream vLLM 0.32.0",
    "torch": "torch",
}
# ops drawn on one chart (default: its own)
CHART_OF = {
    "indexer_prefill_topk": "indexer_prefill",
    "indexer_prefill_logits": "indexer_prefill",
    "indexer_prefill_cand_write": "indexer_prefill",
    "indexer_prefill_cand_only": "indexer_prefill",
}
# x-axis quantity of each chart's `size` (the benches' row docs)
SIZE_UNIT = {
    "kv_gather": "tokens gathered",
    "kv_quant_insert": "tokens inserted",
    "topk_swa_combine": "query tokens T",
    "sparse_mla_decode": "query rows Tq",
    "sparse_mla_prefill": "query tokens",
    "dspark_draft": "batch B (requests)",
    "indexer_decode_logits": "keys (context tokens)",
    "indexer_decode_topk": "keys (context tokens)",
    "indexer_prefill": "keys (context tokens)",
    "mhc_post_pre": "tokens T",
    "mhc_pre_first": "tokens T",
    "mhc_post": "tokens T",
}
WORKSPACE_CASE = re.compile(r"^(decode|prefill)_(\d+)K(?:_r(\d+))?$")


def impl_of(op: str, impl: str) -> Impl:
    return NAMES.get((op, impl), Impl(DEFAULT_NAME.get(impl, impl), impl, impl))


@dataclass(frozen=True)
class Run:
    name: str  # the file, relative to the results folder
    date: str
    label: str  # file | GPU sm | torch | triton | git
    top: bool  # a top-level file (the current run) rather than one kept in a subfolder
    results: dict = field(hash=False, compare=False)


def run_label(name: str, prov: dict) -> str:
    cap = str(prov.get("capability", ""))
    sm = f" sm_{cap.replace('.', '')}" if cap else ""
    return (
        f"{name} | {prov.get('gpu', '?')}{sm} | torch {prov.get('torch', '?')} | "
        f"triton {prov.get('triton', '?')} | git {str(prov.get('git_sha', '?'))[:7]}"
    )


def load_runs(results: Path) -> tuple[dict[str, list[dict]], dict[str, Run]]:
    """op -> its rows, op -> the run they come from (see the module doc for which file wins)."""
    candidates: dict[str, list[tuple[Run, list[dict]]]] = defaultdict(list)
    for path in sorted(results.rglob("*.json")):
        top = path.parent == results
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError:
            print(f"kernel_charts: {path} is not JSON, skipped", file=sys.stderr)
            continue
        if not isinstance(data, dict) or not data.get("rows") or not (top or "bench" in data):
            continue
        prov = data.get("provenance") or {}
        name = path.relative_to(results).as_posix()
        res = data.get("results")
        run = Run(
            name, str(prov.get("date", "")), run_label(name, prov), top, res if isinstance(res, dict) else {}
        )
        ops: dict[str, list[dict]] = defaultdict(list)
        for row in data["rows"]:
            ops[row["op"]].append(row)
        for op, rows in ops.items():
            candidates[op].append((run, rows))
    chosen: dict[str, tuple[Run, list[dict]]] = {}
    for op, held in sorted(candidates.items()):
        # top level first, then the newest (sorted() is stable: the first file by path among equals)
        chosen[op] = max(held, key=lambda c: (c[0].top, c[0].date))
        others = [c[0].name for c in held if c[0] is not chosen[op][0]]
        if others:
            note = f"kernel_charts: {op} from {chosen[op][0].name}, not {', '.join(others)}"
            print(note, file=sys.stderr)
    return {op: v[1] for op, v in chosen.items()}, {op: v[0] for op, v in chosen.items()}


def natural(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key reading digit runs as numbers: r1, r8, r48 (not r1, r48, r8)."""
    return tuple((0, int(t)) if t.isdigit() else (1, t) for t in re.findall(r"\d+|\D+", text))


def panels(series: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """(impl, shape) series split into panels of at most MAX_SERIES, whole shapes per panel."""
    shapes = sorted({s for _, s in series}, key=natural)
    per_shape = {s: sorted(i for i, sh in series if sh == s) for s in shapes}
    out: list[list[tuple[str, str]]] = [[]]
    for shape in shapes:
        group = [(impl, shape) for impl in per_shape[shape]]
        if out[-1] and len(out[-1]) + len(group) > MAX_SERIES:
            out.append([])
        out[-1].extend(group)
    return out


@dataclass
class ChartData:
    """One chart's series: (legend name, shape) -> [(size, µs)], and what each name is."""

    series: dict[tuple[str, str], list[tuple[int, float]]]
    impls: dict[str, Impl]
    left_out: list[str]  # "<impl short> <shape> at <sizes>" of series at a shape with no DeepInfer series

    def order(self, names: set[str]) -> list[str]:
        roles = list(ROLE_STYLE)
        rank = {
            n: roles.index(self.impls[n].role) if self.impls[n].role in roles else len(roles) for n in names
        }
        return sorted(names, key=lambda n: (rank[n], n))


def chart_data(rows: list[dict]) -> ChartData:
    series: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    impls: dict[str, Impl] = {}
    for r in rows:
        impl = impl_of(r["op"], r["impl"])
        impls[impl.name] = impl
        series[(impl.name, r["shape"])].append((int(r["size"]), float(r["us"])))
    ours = {s for (n, s) in series if impls[n].role == OURS}
    left = [
        f"{impls[n].short} {s} at {', '.join(f'{x:,}' for x, _ in sorted(v))}"
        for (n, s), v in sorted(series.items())
        if s not in ours
    ]
    kept = {k: sorted(v) for k, v in series.items() if k[1] in ours}
    return ChartData(kept, {n: impls[n] for n, _ in kept}, left)


def _style(role: str) -> tuple[object, str, bool]:
    return ROLE_STYLE.get(role, ("-", "d", True))


def overlaps(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> float | None:
    """Largest relative gap between two series over their common sizes (>= 2), if it is within OVERLAP."""
    da, db = dict(a), dict(b)
    common = sorted(set(da) & set(db))
    if len(common) < 2:
        return None
    gap = max(abs(da[s] / db[s] - 1.0) for s in common)
    return gap if gap <= OVERLAP else None


def draw_lines(
    ax: Axes, chart: str, group: list[tuple[str, str]], data: ChartData, value_fmt: str | None = None
) -> None:
    """Series as lines; `value_fmt` (e.g. "{:,} MB") writes each point's value beside it."""
    shapes = sorted({s for _, s in group}, key=natural)
    one_shape = len(shapes) == 1
    names = data.order({n for n, _ in group})
    suffix: dict[str, str] = {}
    for name, shape in sorted(group, key=lambda k: (names.index(k[0]), k[1])):
        role = data.impls[name].role
        line, marker, filled = _style(role)
        color = ROLE_COLOR.get(role, "black") if one_shape else COLORS[shapes.index(shape) % len(COLORS)]
        xy = data.series[(name, shape)]
        ax.plot(
            *zip(*xy, strict=True),
            linestyle=line,
            marker=marker,
            markersize=4.5 if filled else 8,
            markerfacecolor=color if filled else "none",
            color=color,
            linewidth=1.4,
            label=f"{name} {shape}",
        )
        for x, y in xy if value_fmt else []:
            ax.annotate(value_fmt.format(y), (x, y), xytext=(4, 3), textcoords="offset points", fontsize=6)
        for other in names[: names.index(name)]:
            gap = overlaps(xy, data.series.get((other, shape), []))
            if gap is not None:
                suffix[name] = f" (within {100 * gap:.1f} % of {data.impls[other].short}: lines overlap)"
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"{SIZE_UNIT.get(chart, 'size (the rows unit)')}, log2")
    ax.set_ylabel("time per call, µs (median, log)")
    ax.grid(True, which="both", alpha=0.3)
    handles = []
    for name in names:
        role = data.impls[name].role
        line, marker, filled = _style(role)
        color = ROLE_COLOR.get(role, "black") if one_shape else "black"
        handles.append(
            Line2D(
                [],
                [],
                linestyle=line,
                marker=marker,
                color=color,
                markersize=4.5 if filled else 8,
                markerfacecolor=color if filled else "none",
                label=name + suffix.get(name, ""),
            )
        )
    below = {"loc": "upper left", "fontsize": 7, "title_fontsize": 7, "frameon": False}
    if one_shape:
        ax.legend(handles=handles, bbox_to_anchor=(0.0, -0.13), title=f"shape {shapes[0]}", **below)
        return
    # one legend (constrained layout makes room for one): the implementations, then the shapes' colours
    shape_handles = [
        Line2D([], [], color=COLORS[i % len(COLORS)], label=f"shape {s}") for i, s in enumerate(shapes)
    ]
    title_ = "line style + marker = implementation, colour = shape"
    ax.legend(handles=handles + shape_handles, bbox_to_anchor=(0.0, -0.13), title=title_, **below)


def _us(us: float) -> str:
    return f"{us:,.0f}" if us >= 100 else f"{us:.1f}"


def draw_bars(ax: Axes, chart: str, at: list[tuple[str, int]], data: ChartData) -> None:
    """Grouped bars: one group per (shape, size) in `at`, one bar per implementation timed there."""
    names = data.order({n for (n, s) in data.series for shape, _ in at if s == shape})
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        role = data.impls[name].role
        first = True
        for i, (shape, size) in enumerate(at):
            us = dict(data.series.get((name, shape), [])).get(size)
            if us is None:
                continue
            x = i + (j - (len(names) - 1) / 2) * width
            ax.bar(
                x,
                us,
                width,
                color=ROLE_COLOR.get(role, "tab:gray"),
                hatch=ROLE_HATCH.get(role, ""),
                edgecolor="black",
                linewidth=0.6,
                label=name if first else None,
            )
            ax.annotate(_us(us), (x, us), ha="center", va="bottom", fontsize=6)
            first = False
    unit = SIZE_UNIT.get(chart, "size")
    ax.set_xticks(list(range(len(at))), [f"{shape}\n{size:,} {unit}" for shape, size in at], fontsize=7)
    ax.set_ylabel("time per call, µs (median)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.16), fontsize=7, frameon=False)


def op_figure(chart: str, rows: list[dict], label: str) -> plt.Figure | None:
    """The chart of one op (or of the ops CHART_OF puts together); None when it compares nothing."""
    data = chart_data(rows)
    if len({i.role for i in data.impls.values()}) < 2:
        return None
    multi = [k for k, v in data.series.items() if len(v) > 1]
    # single-point series go to bars, with every other series' point at their (shape, size)
    at = sorted({(k[1], v[0][0]) for k, v in data.series.items() if len(v) == 1})
    groups = panels(multi) if multi else []
    n = len(groups) + (1 if at else 0)
    fig, axes = plt.subplots(1, n, figsize=(6.6 * n, 6.4), squeeze=False, layout="constrained")
    for ax, group in zip(axes[0], groups, strict=False):
        draw_lines(ax, chart, group, data)
        shapes = sorted({s for _, s in group}, key=natural)
        ax.set_title(f"{chart}, shape{'s' if len(shapes) > 1 else ''} {', '.join(shapes)}", fontsize=8)
    if at:
        draw_bars(axes[0][-1], chart, at, data)
        unit = SIZE_UNIT.get(chart, "size")
        sizes = ", ".join(f"{n:,}" for n in sorted({size for _, size in at}))
        axes[0][-1].set_title(f"{chart}: timed at one size ({unit} {sizes})", fontsize=8)
    notes = [
        f"left out (no DeepInfer series at that shape: nothing like to compare): {'; '.join(data.left_out)}"
    ]
    fig.suptitle(
        title(f"{chart}: time per call (median of one run, no CI)", label, notes if data.left_out else []),
        fontsize=8,
    )
    return fig


SPARSE_DECODE_SHAPE = re.compile(r"^h(\d+)-ctx(\d+)k$")
CONTEXT_COLOR = ("tab:blue", "tab:red", "tab:green", "tab:purple")


def _fig_legend(fig: plt.Figure, handles: list[Line2D], ncols: int) -> None:
    """One legend for the whole figure, below every panel (never over the data)."""
    fig.legend(handles=handles, loc="outside lower center", ncols=ncols, fontsize=7, frameon=False)


def sparse_mla_decode_figure(rows: list[dict], label: str) -> plt.Figure:
    """Sparse MLA decode: one panel per head count, Tq on x; colour = context, style = implementation.

    A context timed at fewer Tq than the panel's fullest one is drawn as its points only (no line
    across Tq it never ran) and the title and note say which Tq it has: the run's data, nothing filled.
    """
    data = chart_data(rows)
    by_heads: dict[int, dict[tuple[str, int], list[tuple[int, float]]]] = defaultdict(dict)
    for (name, shape), xy in data.series.items():
        m = SPARSE_DECODE_SHAPE.match(shape)
        if m is None:
            raise ValueError(f"sparse_mla_decode: shape {shape!r} is not h<heads>-ctx<K>k")
        by_heads[int(m[1])][(name, int(m[2]))] = xy
    contexts = sorted({ctx for series in by_heads.values() for _, ctx in series})
    names = data.order({n for n, _ in data.series})
    fig, axes = plt.subplots(
        1, len(by_heads), figsize=(5.6 * len(by_heads), 6.4), squeeze=False, sharey=True, layout="constrained"
    )
    partial: dict[int, list[int]] = {}  # context -> the Tq it was timed at, where fewer than the fullest
    for ax, heads in zip(axes[0], sorted(by_heads), strict=True):
        series = by_heads[heads]
        full = max(len(xy) for xy in series.values())
        said = []
        for ctx in contexts:
            tqs = sorted({x for (_, c), xy in series.items() if c == ctx for x, _ in xy})
            if not tqs:
                continue
            said.append(
                f"{ctx}K: Tq {tqs[0]}–{tqs[-1]}"
                if len(tqs) == full
                else f"{ctx}K: Tq {', '.join(map(str, tqs))} only"
            )
            if len(tqs) < full:
                partial[ctx] = tqs
            for name in names:
                xy = series.get((name, ctx))
                if not xy:
                    continue
                line, marker, filled = _style(data.impls[name].role)
                color = CONTEXT_COLOR[contexts.index(ctx) % len(CONTEXT_COLOR)]
                ax.plot(
                    *zip(*xy, strict=True),
                    linestyle=line if len(xy) == full else "none",
                    marker=marker,
                    markersize=(4.5 if filled else 8) + (2 if len(xy) < full else 0),
                    markerfacecolor=color if filled else "none",
                    color=color,
                    linewidth=1.4,
                    label=f"{name} ctx{ctx}k",
                )
        ax.set_title(f"{heads} heads ({'; '.join(said)})", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(f"{SIZE_UNIT['sparse_mla_decode']}, log2")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("time per call, µs (median, log)")
    handles = []
    for name in names:
        line, marker, filled = _style(data.impls[name].role)
        face = "black" if filled else "none"
        handles.append(
            Line2D(
                [],
                [],
                linestyle=line,
                marker=marker,
                color="black",
                markerfacecolor=face,
                markersize=4.5 if filled else 8,
                label=name,
            )
        )
    for i, ctx in enumerate(contexts):
        words = f"context {ctx}K" + (
            " (points only: no line across Tq it did not run)" if ctx in partial else ""
        )
        handles.append(Line2D([], [], color=CONTEXT_COLOR[i % len(CONTEXT_COLOR)], linewidth=3, label=words))
    _fig_legend(fig, handles, ncols=2)
    notes = [
        f"{ctx}K context was timed at Tq {', '.join(map(str, tqs))} only: the bench runs every Tq at the "
        f"shortest context and these at {ctx}K (its TQ_AT_128K, a device-budget choice); the JSON holds no "
        "other point, none is drawn"
        for ctx, tqs in sorted(partial.items())
    ]
    if partial:
        notes.append(
            "decode reads the same records a query whatever the context, so the contexts' points coincide"
        )
    fig.suptitle(
        title(
            "sparse_mla_decode: time per call against query rows Tq (median of one run, no CI)", label, notes
        ),
        fontsize=8,
    )
    return fig


DSPARK_SHAPE = re.compile(
    r"^(?P<scope>step|chain(?P<k>\d+))-(?P<sampler>\w+?)(?P<perstep>-perstep)?(?:-tp\d+)?-(?P<mode>eager|graph)$"
)
MODE_WORDS = {"eager": "eager (host launch cost included)", "graph": "in a CUDA graph (as vLLM runs it)"}


def dspark_series(op: str, impl: str, shape: str) -> tuple[str, str, str]:
    """(mode, sampler, the series' legend name) of one DSpark row; the legend name says what is timed
    (one draft position, or all K of a chain) and by which path."""
    m = DSPARK_SHAPE.match(shape)
    if m is None:
        raise ValueError(f"dspark_draft: shape {shape!r} is not step-<sampler>-tp<N>-<mode> or chain<K>-...")
    if m["scope"] == "step":
        what = "one draft position"
        ours, theirs = "DeepInfer per-step kernel (default)", "upstream's sampler, the bias GEMM before it"
    else:
        what = f"all K = {m['k']} positions"
        ours = "DeepInfer per-step path (default)" if m["perstep"] else "DeepInfer one-launch chain (opt-in)"
        theirs = "upstream's _sample_sequential"
    who = ours if impl == OURS else f"{theirs} ({impl_of(op, impl).short} vLLM 0.32.0)"
    return m["mode"], m["sampler"], f"{what}: {who}"


def dspark_draft_figure(rows: list[dict], label: str) -> plt.Figure:
    """DSpark's draft step: a panel per timing mode (rows) and sampler (columns), batch on x.

    Colour = path (DeepInfer per-step, DeepInfer one launch, upstream), line style + marker = what is
    timed (one draft position, or all K positions of a chain); y shared along a timing mode."""
    cells: dict[tuple[str, str], dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        mode, sampler, name = dspark_series(r["op"], r["impl"], r["shape"])
        cells[(mode, sampler)][name].append((int(r["size"]), float(r["us"])))
    modes = [m for m in ("eager", "graph") if any(k[0] == m for k in cells)]
    samplers = sorted({k[1] for k in cells})
    names = sorted({n for c in cells.values() for n in c}, key=lambda n: (not n.startswith("all"), n))

    def style(name: str) -> tuple[str, object, str, bool]:
        color = "tab:green" if "upstream" in name else "tab:purple" if "one-launch" in name else "tab:blue"
        chain = name.startswith("all")
        return color, "-" if chain else (0, (4, 2)), "o" if chain else "s", "upstream" not in name

    fig, axes = plt.subplots(
        len(modes),
        len(samplers),
        figsize=(6.0 * len(samplers), 4.0 * len(modes) + 1.6),
        squeeze=False,
        sharex=True,
        sharey="row",
        layout="constrained",
    )
    for i, mode in enumerate(modes):
        for j, sampler in enumerate(samplers):
            ax = axes[i][j]
            for name in names:
                xy = sorted(cells[(mode, sampler)].get(name, []))
                if not xy:
                    continue
                color, line, marker, filled = style(name)
                ax.plot(
                    *zip(*xy, strict=True),
                    linestyle=line,
                    marker=marker,
                    color=color,
                    linewidth=1.4,
                    markersize=5 if filled else 7,
                    markerfacecolor=color if filled else "none",
                    label=name,
                )
            ax.set_title(f"{sampler} sampler, {MODE_WORDS[mode]}", fontsize=8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
            if i == len(modes) - 1:
                ax.set_xlabel(f"{SIZE_UNIT['dspark_draft']}, log2")
            if j == 0:
                ax.set_ylabel("time per call, µs (median, log)")
    handles = []
    for name in names:
        color, line, marker, filled = style(name)
        handles.append(
            Line2D(
                [],
                [],
                linestyle=line,
                marker=marker,
                color=color,
                markersize=5 if filled else 7,
                markerfacecolor=color if filled else "none",
                label=name,
            )
        )
    _fig_legend(fig, handles, ncols=2)
    notes = [
        "colour = path (blue DeepInfer per-step, purple DeepInfer one launch, green upstream); "
        "solid + circle = all K positions of a chain, dashed + square = one position; "
        "upstream has one chain, the reference for both of ours"
    ]
    fig.suptitle(
        title(
            "dspark_draft: one draft step, time per call against batch (median of one run, no CI)",
            label,
            notes,
        ),
        fontsize=8,
    )
    return fig


# charts with their own layout; every other op is drawn by op_figure
FIGURES = {"sparse_mla_decode": sparse_mla_decode_figure, "dspark_draft": dspark_draft_figure}


def chart_figure(chart: str, rows: list[dict], label: str) -> plt.Figure | None:
    """The figure of one chart: its own function where FIGURES has one, else op_figure."""
    if chart in FIGURES and len({impl_of(r["op"], r["impl"]).role for r in rows}) > 1:
        return FIGURES[chart](rows, label)
    return op_figure(chart, rows, label)


def title(head: str, label: str, notes: list[str]) -> str:
    lines = [head, label, *(w for note in notes for w in textwrap.wrap(note, 130))]
    return "\n".join(lines)


def workspace_figure(runs: dict[str, Run], by_op: dict[str, list[dict]]) -> plt.Figure | None:
    """The indexer's peak workspace against context (dense vs streamed), as its JSON records it."""
    prefill_run, decode_run = runs.get("indexer_prefill_topk"), runs.get("indexer_decode_topk")
    # the queries the streamed prefill ran at each key count (its rows' shape, e.g. q8192)
    stream_q = {
        int(r["size"]): r["shape"] for r in by_op.get("indexer_prefill_topk", []) if r["impl"] == OURS
    }
    panels_data: dict[str, dict[tuple[str, str], list[tuple[int, float]]]] = {"prefill": {}, "decode": {}}
    left: list[str] = []
    for run, kind in ((prefill_run, "prefill"), (decode_run, "decode")):
        for case, entry in sorted((run.results if run else {}).items()):
            m = WORKSPACE_CASE.match(case)
            if not m or m[1] != kind or not isinstance(entry, dict):
                continue
            keys = int(m[2]) * 1024
            for path, impl in (("stream", OURS), ("dense", "base")):
                mb = entry.get(f"{path}_workspace_mb")
                if mb is None:
                    continue
                if kind == "decode":
                    shape = f"r{m[3]}"
                else:
                    shape = f"q{entry.get('dense_queries')}" if path == "dense" else stream_q.get(keys, "?")
                    if shape != stream_q.get(keys):  # not the queries the streamed case ran at these keys
                        ran, streamed = shape[1:], stream_q.get(keys, "?")[1:]
                        left.append(f"{path} at {keys:,} keys ran {ran} queries, not {streamed} ({mb:,} MB)")
                        continue
                name = impl_of("indexer_prefill_topk", impl).name
                panels_data[kind].setdefault((name, shape), []).append((keys, float(mb)))
    if not any(panels_data.values()):
        return None
    impls = {
        i.name: i for i in (impl_of("indexer_prefill_topk", OURS), impl_of("indexer_prefill_topk", "base"))
    }
    fig, axes = plt.subplots(1, 2, figsize=(13.2, 6.0), squeeze=False, layout="constrained")
    heads = {"prefill": "prefill (shape = queries)", "decode": "decode (shape = rows: requests in the batch)"}
    for ax, (kind, series) in zip(axes[0], panels_data.items(), strict=True):
        data = ChartData({k: sorted(v) for k, v in series.items()}, impls, [])
        if data.series:
            draw_lines(ax, "indexer_prefill", list(data.series), data, value_fmt="{:,} MB")
        ax.set_ylabel("peak workspace, MB (log)")
        ax.set_title(heads[kind], fontsize=8)
    labels = sorted({r.label for r in (prefill_run, decode_run) if r})
    notes = [
        "measured, not from a formula: peak bytes allocated above the live set during one call "
        "(torch.cuda.max_memory_allocated), as the JSON records them "
        "(results.<case>.{dense,stream}_workspace_mb)",
        *([f"left out (unlike shape): {'; '.join(left)}"] if left else []),
    ]
    fig.suptitle(
        title("indexer_workspace: peak workspace against context", "\n".join(labels), notes), fontsize=8
    )
    return fig


def _group(op: str, shape: str) -> str:
    """The speedup bar a row belongs to: its op, split by timing mode where the shape names one."""
    mode = next((m for m in ("eager", "graph") if m in shape.split("-")), None)
    return f"{op} ({mode})" if mode else op


def speedup_ratios(by_op: dict[str, list[dict]]) -> dict[tuple[str, str, str], list[float]]:
    """(bar, reference's short name, its role) -> reference µs / ours at each equal (shape, size)."""
    by_key: dict[tuple[str, str, int], dict[str, tuple[Impl, float]]] = defaultdict(dict)
    for op, rows in by_op.items():
        for r in rows:
            impl = impl_of(op, r["impl"])
            by_key[(op, r["shape"], int(r["size"]))][impl.role] = (impl, float(r["us"]))
    ratios: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for (op, shape, _size), impls in sorted(by_key.items()):
        if OURS not in impls:
            continue
        for ref in REFERENCES:
            if ref in impls:
                impl, us = impls[ref]
                ratios[(_group(op, shape), impl.short, ref)].append(us / impls[OURS][1])
    return dict(ratios)


# ops timed but not shipped: the binding table keeps upstream's TileLang mHC in both images (docs/MHC.md),
# so a bar for them would read as a speed-up the images give; their own charts still draw them
NOT_SHIPPED = ("mhc_post_pre", "mhc_pre_first", "mhc_post")


def speedup_figure(by_op: dict[str, list[dict]], labels: dict[str, str]) -> plt.Figure:
    """Per op (and timing mode) the images ship, DeepInfer's speedup over each reference: median bar
    drawn from 1 (slower than the reference hangs below the line), whiskers at min and max over
    (shape, size). Ops in NOT_SHIPPED are left out and named in the note."""
    left_out = sorted(op for op in by_op if op in NOT_SHIPPED)
    by_op = {op: rows for op, rows in by_op.items() if op not in NOT_SHIPPED}
    labels = {op: label for op, label in labels.items() if op not in NOT_SHIPPED}
    ratios = speedup_ratios(by_op)
    keys = sorted(ratios)
    fig, ax = plt.subplots(figsize=(max(7.0, 0.5 * len(keys)), 6.4), layout="constrained")
    seen: set[str] = set()
    for i, k in enumerate(keys):
        vals = ratios[k]
        med = statistics.median(vals)
        role = k[2]
        ax.bar(
            i,
            med - 1.0,
            bottom=1.0,
            color=ROLE_COLOR[role],
            hatch=ROLE_HATCH.get(role, ""),
            edgecolor="black",
            linewidth=0.5,
            label=f"vs {role}" if role not in seen else None,
        )
        ax.errorbar(
            i, med, yerr=[[med - min(vals)], [max(vals) - med]], color="black", capsize=3, linewidth=1
        )
        ax.annotate(
            f"{med:.2f}×", (i, max(vals)), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=6
        )
        seen.add(role)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(
        list(range(len(keys))),
        [f"{g} vs {short} (n={len(ratios[(g, short, r)])})" for g, short, r in keys],
        rotation=60,
        ha="right",
        fontsize=7,
    )
    ax.set_ylabel("DeepInfer speedup, × (their µs / ours, log): below 1 = slower")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    notes = [
        "bar: median over (shape, size), whiskers: min–max; no CI: one run per op. 'dense' = DeepInfer's "
        "indexer logits + torch.topk (the streamed top-k's baseline); indexer logits: ours against upstream's"
    ]
    if left_out:
        shipped_not = ", ".join(left_out)
        notes.append(f"not drawn (timed, not shipped: the images keep upstream's kernels): {shipped_not}")
    ax.set_title(
        title("DeepInfer speed-up per kernel", "\n".join(sorted(set(labels.values()))), notes), fontsize=6
    )
    return fig


def save(fig: plt.Figure, out: Path, stem: str) -> list[Path]:
    written = []
    for ext in ("png", "svg"):
        # fixed metadata so re-running on the same JSON rewrites identical files
        meta = {"Software": None} if ext == "png" else {"Date": None, "Creator": None}
        fig.savefig(out / f"{stem}.{ext}", dpi=110, metadata=meta)
        written.append(out / f"{stem}.{ext}")
    plt.close(fig)
    return written


def figures(by_op: dict[str, list[dict]], runs: dict[str, Run]) -> Iterator[tuple[str, plt.Figure]]:
    """Every chart's (file stem, figure), built from the rows alone (the caller saves and closes them)."""
    labels = {op: run.label for op, run in runs.items()}
    charts: dict[str, list[str]] = defaultdict(list)
    for op in sorted(by_op):
        charts[CHART_OF.get(op, op)].append(op)
    for chart, ops in sorted(charts.items()):
        rows = [r for op in ops for r in by_op[op]]
        fig = chart_figure(chart, rows, "\n".join(sorted({labels[op] for op in ops})))
        if fig is None:
            print(
                f"kernel_charts: {chart} not drawn: one implementation, nothing to compare", file=sys.stderr
            )
            continue
        yield chart, fig
    ws = workspace_figure(runs, by_op)
    if ws is not None:
        yield "indexer_workspace", ws
    if by_op:
        yield "speedups", speedup_figure(by_op, labels)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: kernel_charts.py RESULTS_GPU_DIR CHARTS_DIR", file=sys.stderr)
        return 2
    results, out = Path(argv[0]), Path(argv[1])
    if not results.is_dir():
        print(f"kernel_charts: {results} is not a directory", file=sys.stderr)
        return 2
    by_op, runs = load_runs(results)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for stem, fig in figures(by_op, runs):
        written += save(fig, out, stem)
    for stale in sorted({*out.glob("*.png"), *out.glob("*.svg")} - set(written)):
        stale.unlink()  # a chart whose rows no JSON holds any more (this folder is the script's own)
        print(f"kernel_charts: removed {stale.name} (no rows behind it)")
    print(f"kernel_charts: {len(by_op)} ops, {sum(map(len, by_op.values()))} rows -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
