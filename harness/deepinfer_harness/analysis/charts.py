"""Charts regenerated from result files only (`make charts`): one pure function per chart.

Each chart is `(DataFrame) -> Figure`, saved as PNG and SVG under charts/<run path>/ with
deterministic metadata, so re-running on the same results rewrites the same files. Every line is
one family of cells (one workload, prompt and output length, arrival process…) and one arm; a line
never joins different cells' numbers at one x. Arms are named by the profile's own labels. A chart
whose cells the run does not have is not drawn, and `charts_for_run` says so in one line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from deepinfer_harness import SCHEMA_VERSION
from deepinfer_harness.analysis.intervals import mean_ci
from deepinfer_harness.analysis.stats import MIN_PAIRS
from deepinfer_harness.cells import format_size, parse_cell
from deepinfer_harness.layout import read_json
from deepinfer_harness.strict_json import number

plt.rcParams["svg.hashsalt"] = "deepinfer-harness"
COLORS = {"A": "#4C72B0", "B": "#DD8452"}
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P")
# the latencies `vllm bench serve` reports percentiles of, in its order
LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL"))
CLOSED_LOOP = ("decode", "chat", "prefix")
CI_TEXT = "whiskers: 95 % t-interval of the mean over the arm's valid runs (from 5 runs)"


def runs_frame(summary: dict) -> pd.DataFrame:
    """Valid runs only: an invalid run (e.g. a killed server's 0 tok/s) is never plotted as data."""
    valid = [r for r in summary["runs"] if r["validity"]["valid"]]
    return pd.DataFrame(valid)


def ab_frame(ab: dict) -> pd.DataFrame:
    return pd.DataFrame(ab["rows"])


def _labels(summary: dict) -> dict[str, str]:
    labels = summary["provenance"].get("labels") or {}
    return {v: f"{v}: {labels.get(v, v)}" for v in ("A", "B")}


def _present(x: object) -> bool:
    """A number, not None/NaN (pandas turns a missing ratio into NaN, which is truthy)."""
    return isinstance(x, int | float) and not pd.isna(x)


def _ci_present(row: dict) -> bool:
    low = row.get("ci_low")
    return isinstance(low, int | float) and low == low  # NaN != NaN: pandas' missing value


def throughput_ab(ab: pd.DataFrame, labels: dict[str, str]) -> Figure:
    """End-to-end throughput per cell, A vs B, one panel per metric, B/A ratio and 95 % CI on each
    group. An arm without a valid run gets no bar (a note instead), a row without a ratio no label."""
    metrics = [m for m in ("prefill_tok_s", "decode_tok_s") if (ab["metric"] == m).any()]
    fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4.8), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        rows = ab[ab["metric"] == metric].reset_index(drop=True)
        for i, row in rows.iterrows():
            tops = []
            for j, v in enumerate(("A", "B")):
                side = row[v.lower()]
                x = i + (j - 0.5) * 0.38
                est = side.get("estimate")
                if not _present(est):
                    ax.annotate(
                        f"{v}: no valid run",
                        (x, 0),
                        xytext=(0, 3),
                        textcoords="offset points",
                        ha="center",
                        fontsize=6,
                        rotation=90,
                        va="bottom",
                    )
                    continue
                runs = [r for r in side["runs"] if _present(r)]
                err = [[est - min(runs, default=est)], [max(runs, default=est) - est]]
                ax.bar(
                    x, est, 0.36, color=COLORS[v], yerr=err, capsize=3, label=labels[v] if i == 0 else None
                )
                tops.append(max(runs, default=est))
            if _present(row["ratio"]) and tops:
                ci = (
                    f"[{row['ci_low']:.2f}, {row['ci_high']:.2f}]"
                    if _present(row["ci_low"])
                    else f"no CI: {row['n_pairs']} pairs"
                )
                text = f"{row['ratio']:.2f}× {row['mark']}\n{ci}"
                ax.annotate(
                    text, (i, max(tops)), xytext=(0, 4), textcoords="offset points", ha="center", fontsize=7
                )
        ax.set_xticks(range(len(rows)), rows["cell_id"], fontsize=7, rotation=15)
        ax.set_ylabel(metric.replace("_tok_s", " tok/s"))
        ax.set_title("bar: mean of valid runs, whiskers: min–max", fontsize=8)
        ax.margins(y=0.2)
        handles, _ = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=8)
    has_ci = any(_ci_present(r) for r in ab.to_dict("records"))
    ci = f"95 % CI where a cell has >= {MIN_PAIRS} pairs"
    if not has_ci:
        ci = f"no CI (every cell < {MIN_PAIRS} pairs)"
    fig.suptitle(f"Throughput per cell: B/A ratio, {ci}, and mark")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig


def _size_label(n: float) -> str:
    """128, 1k, 64k: prompt lengths as the cell ids write them (never 2^7)."""
    n = int(n)
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def closed_loop_series(cell_id: str) -> str:
    """The family of a closed-loop cell: everything in its id but the concurrency (`decode prose
    i3k o512`); cells of one family differ only in C, so one line may join them."""
    try:
        c = parse_cell(cell_id)
    except ValueError:
        return re.sub(r"-c\d+(?=-|$)", "", cell_id)
    prefix = f" p{format_size(c.prefix)}" if c.kind == "prefix" else ""
    return f"{c.kind} {c.workload} i{format_size(c.isl)}{prefix} o{format_size(c.osl)}"


def prefill_series(cell_id: str) -> str:
    """The family of a C=1 prefill or TTFT cell: its kind and workload (the ISL is the x axis)."""
    try:
        c = parse_cell(cell_id)
    except ValueError:
        return re.sub(r"-i\d+k?(?=-|$)", "", cell_id)
    return f"{c.kind} ({c.workload})"


_RATE_ID = re.compile(r"^rate-(i\d+k?-o\d+k?)-r([^-]+)(-.*)?$")
_RAMP = re.compile(r"^[\dp]+to[\dp]+(lin|exp)$")


def rate_series(cell_id: str) -> str | None:
    """The family of an open-loop cell: its id without the rate (`i1k-o128-poisson`, `i1k-o128-
    gamma-b0p5-wcode`), so fixed rates and sweep points of one shape share a line; a duration-
    bounded family says so in words (`i1k-o128-poisson, 60 s each, at the rate sent`); None for a
    ramp, whose offered rate moves during the cell (no single x: `ramp_frame` charts it over time),
    and for the synchronous cell (one request at a time: no offered rate)."""
    m = _RATE_ID.match(cell_id)
    if not m or _RAMP.match(m.group(2)) or m.group(2) == "sync":
        return None
    rest = m.group(3) or ""
    bound = re.search(r"-d([\dp]+)", rest)
    if bound is None:
        return m.group(1) + rest
    seconds = bound.group(1).replace("p", ".")
    return f"{m.group(1)}{rest.replace(bound.group(0), '')}, {seconds} s each, at the rate sent"


def _with(runs: pd.DataFrame, column: str, fn: Callable[[str], Any]) -> pd.DataFrame:
    d = runs.copy()
    d[column] = [fn(c) for c in d["cell_id"]] if "cell_id" in d else d["kind"]
    return d


def _styles(series: list[str]) -> dict[str, tuple[str, str]]:
    return {s: (LINESTYLES[i % len(LINESTYLES)], MARKERS[i % len(MARKERS)]) for i, s in enumerate(series)}


def _line_label(labels: dict[str, str], v: str, series: str, many: bool) -> str:
    return f"{labels[v]} · {series}" if many else labels[v]


def _arm_lines(ax: Axes, d: pd.DataFrame, x: str, metric: str, labels: dict[str, str]) -> None:
    """Every run of each arm as a dot, and the arm's mean per x as a line: one line per series
    (a family of cells) and arm."""
    if metric not in d:
        return
    series = sorted(d["series"].unique())
    styles = _styles(series)
    for s in series:
        for v in ("A", "B"):
            sub = d[(d["variant"] == v) & (d["series"] == s)]
            sub = sub[sub[metric].map(_present).astype(bool)]
            if sub.empty:
                continue
            ls, marker = styles[s]
            ax.scatter(sub[x], sub[metric], color=COLORS[v], alpha=0.5, s=14, marker=marker)
            mean = sub.groupby(x)[metric].mean()
            ax.plot(
                mean.index,
                mean.values,
                linestyle=ls,
                marker=marker,
                color=COLORS[v],
                label=_line_label(labels, v, s, len(series) > 1),
            )


def decode_scaling(runs: pd.DataFrame, labels: dict[str, str]) -> Figure:
    """System decode tok/s and TPOT against concurrency: one line per workload, prompt and output
    length (a family of decode cells) and arm, every run as a dot."""
    d = _with(runs[runs["kind"] == "decode"], "series", closed_loop_series)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric, unit in (
        (axes[0], "decode_tok_s", "decode tok/s (window)"),
        (axes[1], "mean_tpot_ms", "mean TPOT (ms)"),
    ):
        _arm_lines(ax, d, "concurrency", metric, labels)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(d["concurrency"].unique()), [str(c) for c in sorted(d["concurrency"].unique())])
        ax.minorticks_off()
        ax.set_xlabel("concurrency C")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Decode scaling by concurrency (one line per cell family and arm)")
    fig.tight_layout()
    return fig


def prefill_by_isl(runs: pd.DataFrame, labels: dict[str, str]) -> Figure:
    """Median TTFT and prefill tok/s against prompt length on a log axis (C=1 cold prefill and TTFT
    cells), one line per cell kind and workload and arm."""
    d = runs[runs["kind"].isin(["prefill-cold", "ttft"]) & (runs["concurrency"] == 1)]
    d = _with(d, "series", prefill_series)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric, unit in (
        (axes[0], "median_ttft_ms", "median TTFT (ms)"),
        (axes[1], "prefill_tok_s", "prefill tok/s (ISL / server TTFT)"),
    ):
        _arm_lines(ax, d, "isl", metric, labels)
        ax.set_xscale("log", base=2)
        isls = sorted(d["isl"].unique())
        ax.set_xticks(isls, [_size_label(x) for x in isls])
        ax.minorticks_off()
        ax.set_xlabel("prompt length (tokens, log scale)")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Prefill by prompt length")
    fig.tight_layout()
    return fig


def throughput_by_concurrency(runs: pd.DataFrame, labels: dict[str, str]) -> Figure:
    """End-to-end output tok/s and median E2EL against concurrency for the closed-loop cells
    (decode, chat, shared prefix): one line per cell family (kind, workload, prompt and output
    length) and arm, each point the arm's mean over its valid runs with its 95 % t interval."""
    d = _with(runs[runs["kind"].isin(CLOSED_LOOP)], "series", closed_loop_series)
    series = sorted(d["series"].unique())
    styles = _styles(series)
    concurrencies = sorted(d["concurrency"].unique())
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for ax, metric, unit in (
        (axes[0], "output_throughput", "output tok/s (end to end)"),
        (axes[1], "median_e2el_ms", "median E2EL (ms)"),
    ):
        for s in series:
            ls, marker = styles[s]
            for v in ("A", "B"):
                points = _points(d[(d["series"] == s) & (d["variant"] == v)], metric, "concurrency")
                if points:
                    label = _line_label(labels, v, s, len(series) > 1)
                    _ci_line(
                        ax, points, float, color=COLORS[v], linestyle=ls, marker=marker, ms=4, label=label
                    )
        ax.set_xscale("log", base=2)
        ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
        ax.minorticks_off()
        ax.set_xlabel("concurrency C")
        ax.set_ylabel(unit, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Throughput vs concurrency (one line per cell family and arm)\n{CI_TEXT}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    return fig


def _rate(x: Any) -> float | None:
    """An offered rate read back from a summary: a positive number, inf (`"inf"`), else None."""
    x = number(x)
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and x > 0 else None


def sent_rate(run: dict[str, Any]) -> float | None:
    """The rate a duration-bounded run actually sent (its schedule's count in [0, D) over D),
    None for any other run. Runs recorded before `sent_rate` was written: sent_requests / D."""
    bound = number(run.get("duration_bound_s"))
    if not (isinstance(bound, int | float) and bound > 0):
        return None
    value = _rate(run.get("sent_rate"))
    if value is None and isinstance(run.get("sent_requests"), int | float):
        value = _rate(run["sent_requests"] / bound)
    return value


def rate_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """The open-loop runs that sit on a rate axis (no ramp, no synchronous cell), with `series`
    and `rate`: the offered rate (a sweep point's recorded one), or for a duration-bounded run
    the rate it actually sent (`sent_rate`), which its series label says."""
    if runs.empty or "kind" not in runs:
        return pd.DataFrame()
    d = runs[runs["kind"] == "rate"].copy()
    if d.empty or "offered_rate" not in d:
        return pd.DataFrame()
    d["series"] = [rate_series(c) for c in d["cell_id"]]
    rows = d.to_dict("records")
    d["rate"] = [sent_rate(r) if sent_rate(r) is not None else _rate(r["offered_rate"]) for r in rows]
    return d[d["series"].notna() & d["rate"].notna()]


def ramp_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """Every valid ramp run's timeline (run_summary.ramp_timeline), one row per run and bin:
    cell_id, variant, rep, t_mid_s, offered_rps, sent_rps, completed_rps, median_ttft_ms,
    median_e2el_ms. Empty when no ramp run carries one."""
    columns = ["cell_id", "variant", "rep", "t_mid_s", "offered_rps", "sent_rps", "completed_rps"]
    columns += ["median_ttft_ms", "median_e2el_ms"]
    out = []
    if not runs.empty and "timeline" in runs:
        for r in runs.to_dict("records"):
            if not isinstance(r.get("timeline"), list):
                continue
            for b in r["timeline"]:
                mid = (b["t_start_s"] + b["t_end_s"]) / 2
                row = {"cell_id": r["cell_id"], "variant": r["variant"], "rep": r.get("rep"), "t_mid_s": mid}
                out.append(row | {k: number(b.get(k)) for k in columns[4:]})
    return pd.DataFrame(out, columns=columns)


def ramp_over_time(frame: pd.DataFrame, labels: dict[str, str]) -> Figure:
    """A ramp cell over time, one row of panels per ramp cell: the offered rate (the schedule's
    arrivals per bin, grey), the rate each arm sent and completed per bin (mean over its runs), and
    the median TTFT and E2EL of the requests sent in each bin. A ramp has no single offered rate,
    so it is charted here, not on the rate axis."""
    cells = sorted(frame["cell_id"].unique())
    fig, axes = plt.subplots(len(cells), 2, figsize=(11, 3.4 * len(cells)), squeeze=False)
    for row, cell_id in zip(axes, cells, strict=True):
        d = frame[frame["cell_id"] == cell_id]
        rate_ax, lat_ax = row
        offered = d.groupby("t_mid_s")["offered_rps"].mean()
        rate_ax.step(
            offered.index, offered.values, where="mid", color="0.45", lw=2, label="offered (schedule)"
        )
        for v in ("A", "B"):
            sub = d[d["variant"] == v]
            if sub.empty:
                continue
            means = sub.groupby("t_mid_s")[["sent_rps", "completed_rps", "median_ttft_ms", "median_e2el_ms"]]
            m = means.mean()
            rate_ax.plot(m.index, m["sent_rps"], color=COLORS[v], ls=":", label=f"{labels[v]}: sent")
            rate_ax.plot(
                m.index,
                m["completed_rps"],
                color=COLORS[v],
                marker="o",
                ms=3,
                label=f"{labels[v]}: completed",
            )
            lat_ax.plot(
                m.index,
                m["median_ttft_ms"],
                color=COLORS[v],
                marker="o",
                ms=3,
                label=f"{labels[v]}: median TTFT",
            )
            lat_ax.plot(
                m.index, m["median_e2el_ms"], color=COLORS[v], ls="--", label=f"{labels[v]}: median E2EL"
            )
        rate_ax.set_title(f"{cell_id}: rate per bin", fontsize=9)
        rate_ax.set_ylabel("requests/s")
        lat_ax.set_title(f"{cell_id}: latency of the requests sent in each bin", fontsize=9)
        lat_ax.set_ylabel("ms")
        for ax in row:
            ax.set_xlabel("time since the schedule began (s)")
            ax.grid(alpha=0.3)
    handles: dict[str, Any] = {}
    for ax in axes.flat:
        for h, t in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(t, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=3, fontsize=7)
    fig.suptitle(
        "Ramp-up over time (vllm bench serve --ramp-up-strategy): means over each arm's valid runs",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.03 * math.ceil(len(handles) / 3) + 0.02, 1, 0.95))
    return fig


def _rate_label(d: pd.DataFrame) -> str:
    """The rate axis's label: offered rate, and where duration-bounded cells are drawn, that
    they sit at the rate they sent."""
    if "duration_bound_s" in d and d["duration_bound_s"].map(_present).astype(bool).any():
        return "offered rate; duration cells: rate sent (requests/s)"
    return "offered rate (requests/s)"


def _rate_axis(ax: Axes, rates: list[float]) -> Callable[[float], float]:
    """A log₂ axis of the offered rates; inf (every request at once) one octave past the largest
    finite rate, ticked ∞. Returns the rate → x map."""
    finite = sorted({r for r in rates if math.isfinite(r)})
    inf_x = finite[-1] * 2 if finite else 1.0

    def at(r: float) -> float:
        return inf_x if math.isinf(r) else r

    ticks = sorted({at(r) for r in rates})
    ax.set_xscale("log", base=2)
    ax.set_xticks(
        ticks, ["∞" if t == inf_x and any(math.isinf(r) for r in rates) else f"{t:.3g}" for t in ticks]
    )
    ax.minorticks_off()
    return at


def _points(d: pd.DataFrame, metric: str, x: str = "rate") -> list[tuple[str, float, Any]]:
    """(cell, x, mean CI of `metric`) per cell of one series and arm, sorted by x; x is the mean
    of the cell's runs (a sweep point's measured rate may differ between runs; inf stays inf)."""
    out = []
    for cell, sub in d.groupby("cell_id"):
        ci = mean_ci(sub[metric]) if metric in sub else None
        xs = [float(v) for v in sub[x]]
        at = math.inf if any(math.isinf(v) for v in xs) else sum(xs) / len(xs)
        if ci is not None:
            out.append((str(cell), at, ci))
    return sorted(out, key=lambda p: p[1])


def _ci_line(
    ax: Axes, points: list[tuple[str, float, Any]], at: Callable[[float], float], **style: Any
) -> None:
    xs = [at(x) for _, x, _ in points]
    ys = [ci.mean for _, _, ci in points]
    err = [
        [ci.mean - ci.low if ci.has_ci else 0.0 for _, _, ci in points],
        [ci.high - ci.mean if ci.has_ci else 0.0 for _, _, ci in points],
    ]
    ax.errorbar(xs, ys, yerr=err, capsize=3, **style)


def _percentiles(d: pd.DataFrame) -> list[float]:
    """The latency percentiles the summaries hold (plan.percentiles; p50/p90/p99 by default)."""
    qs = {
        float(m.group(1))
        for c in d.columns
        if (m := re.fullmatch(r"p(\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms", str(c)))
    }
    return sorted(qs)


def _ab_key(name: str, q: float) -> str:
    """The A/B row of a percentile: p50 is the median row; others are p<q> rows."""
    return f"median_{name}_ms" if q == 50 else f"p{q:g}_{name}_ms"


def latency_vs_rate(
    rate_runs: pd.DataFrame, labels: dict[str, str], ab: pd.DataFrame | None = None
) -> Figure:
    """TTFT, TPOT, ITL and E2EL percentiles (rows × columns) against the offered rate, one line per
    open-loop shape and arm, each point the arm's mean over its valid runs with its 95 % t
    interval; beside B's point the run's A/B mark for that cell and percentile, where compared."""
    d = rate_runs
    qs = _percentiles(d)
    names = [(n, t) for n, t in LATENCIES if any(f"p{q:g}_{n}_ms" in d for q in qs)]
    marks = {}
    if ab is not None and not ab.empty:
        marks = {(r["cell_id"], r["metric"]): r["mark"] for r in ab.to_dict("records")}
    series = sorted(d["series"].unique())
    styles = _styles(series)
    fig, axes = plt.subplots(
        len(names), len(qs), figsize=(3.7 * len(qs), 2.7 * len(names)), squeeze=False, sharex=True
    )
    for i, (name, title) in enumerate(names):
        for j, q in enumerate(qs):
            ax, metric = axes[i][j], f"p{q:g}_{name}_ms"
            at = _rate_axis(ax, list(d["rate"]))
            for s in series:
                ls, marker = styles[s]
                for v in ("A", "B"):
                    points = _points(d[(d["series"] == s) & (d["variant"] == v)], metric)
                    if not points:
                        continue
                    label = _line_label(labels, v, s, len(series) > 1) if (i, j) == (0, 0) else None
                    _ci_line(ax, points, at, color=COLORS[v], linestyle=ls, marker=marker, ms=4, label=label)
                    if v != "B":
                        continue
                    for cell, x, ci in points:
                        mark = marks.get((cell, _ab_key(name, q)))
                        if mark:
                            ax.annotate(
                                mark, (at(x), ci.mean), xytext=(4, 2), textcoords="offset points", fontsize=8
                            )
            ax.set_title(f"p{q:g} {title}", fontsize=9)
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel("ms")
            if i == len(names) - 1:
                ax.set_xlabel(_rate_label(d))
    handles, texts = axes[0][0].get_legend_handles_labels()
    rows_of_legend = math.ceil(len(handles) / 2)
    fig.legend(handles, texts, loc="lower center", ncol=2, fontsize=7)
    fig.suptitle(f"Latency percentiles vs offered rate\n{CI_TEXT}; beside B: the run's A/B mark", fontsize=9)
    fig.tight_layout(rect=(0, 0.025 * rows_of_legend + 0.01, 1, 0.95))
    return fig


def latency_vs_rate_runs(frame: pd.DataFrame, order: list[str]) -> Figure:
    """`compare`'s chart 06: the median TTFT, TPOT, ITL and E2EL against the rate each cell was
    measured at (a sweep point at its run's recorded rate, so two runs' points sit where they were
    sent, never at a shared id), one line per run (colour), arm (A solid, B dashed) and open-loop
    shape (marker); each point the mean over that arm's valid runs. The legend sits below the panels."""
    names = [(n, t) for n, t in LATENCIES if f"p50_{n}_ms" in frame and frame[f"p50_{n}_ms"].notna().any()]
    series = sorted(frame["series"].unique())
    markers = {s: MARKERS[i % len(MARKERS)] for i, s in enumerate(series)}
    palette = plt.get_cmap("tab10")
    colors = {run: palette(i % 10) for i, run in enumerate(order)}
    fig, axes = plt.subplots(1, len(names), figsize=(3.8 * len(names), 3.8), squeeze=False)
    for ax, (name, title) in zip(axes[0], names, strict=True):
        metric = f"p50_{name}_ms"
        at = _rate_axis(ax, list(frame["rate"]))
        for run in order:
            for v, ls in (("A", "-"), ("B", "--")):
                for s in series:
                    d = frame[(frame["run"] == run) & (frame["variant"] == v) & (frame["series"] == s)]
                    d = d[d[metric].map(_present).astype(bool)]
                    if d.empty:
                        continue
                    points = sorted((float(x), float(sub[metric].mean())) for x, sub in d.groupby("rate"))
                    label = f"{run} · {v}" + (f" · {s}" if len(series) > 1 else "")
                    ax.plot(
                        [at(x) for x, _ in points],
                        [y for _, y in points],
                        color=colors[run],
                        linestyle=ls,
                        marker=markers[s],
                        ms=4,
                        label=label,
                    )
        ax.set_title(f"median {title}", fontsize=9)
        ax.set_xlabel(_rate_label(frame))
        ax.set_ylabel("ms")
        ax.grid(alpha=0.3)
    handles, texts = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, texts, loc="lower center", ncol=2, fontsize=7)
    fig.suptitle(
        "Latency vs rate across runs (each cell at the rate it was measured at; means over valid runs)",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.04 * math.ceil(len(handles) / 2) + 0.02, 1, 0.92))
    return fig


def slo_text(slo: Any) -> str:
    if not isinstance(slo, dict) or not slo:
        return "no SLO"
    return ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {v:g} ms" for k, v in sorted(slo.items()))


def goodput_vs_rate(rate_runs: pd.DataFrame, labels: dict[str, str]) -> Figure:
    """Goodput (requests/s meeting every SLO of plan.slo) and the achieved request rate against the
    offered rate, and the share of requests meeting the SLOs, per open-loop shape and arm."""
    d = rate_runs
    series = sorted(d["series"].unique())
    styles = _styles(series)
    slo = next((x for x in d.get("slo", []) if isinstance(x, dict) and x), {})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for ax, metric, unit in (
        (axes[0], "goodput_req_s", "requests/s"),
        (axes[1], "slo_attainment", "share of requests meeting every SLO"),
    ):
        at = _rate_axis(ax, list(d["rate"]))
        for s in series:
            ls, marker = styles[s]
            for v in ("A", "B"):
                sub = d[(d["series"] == s) & (d["variant"] == v)]
                points = _points(sub, metric)
                if not points:
                    continue
                label = _line_label(labels, v, s, len(series) > 1)
                _ci_line(ax, points, at, color=COLORS[v], linestyle=ls, marker=marker, ms=4, label=label)
                if metric == "goodput_req_s":
                    achieved = _points(sub, "request_throughput")
                    if achieved:
                        ax.plot(
                            [at(x) for _, x, _ in achieved],
                            [ci.mean for _, _, ci in achieved],
                            color=COLORS[v],
                            linestyle=ls,
                            alpha=0.35,
                            lw=1,
                            label=f"{label}: achieved request rate",
                        )
        ax.set_xlabel(_rate_label(d))
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
    axes[0].set_title("goodput (bold) and achieved request rate (faint)", fontsize=9)
    axes[1].set_title("share of requests meeting every SLO", fontsize=9)
    axes[1].set_ylim(0, 1.05)
    # one legend for both panels, below them: never on the data
    handles, texts = axes[0].get_legend_handles_labels()
    fig.legend(handles, texts, loc="lower center", ncol=2, fontsize=7)
    fig.suptitle(f"Goodput vs offered rate (SLO: {slo_text(slo)})\n{CI_TEXT}", fontsize=9)
    fig.tight_layout(rect=(0, 0.035 * math.ceil(len(handles) / 2) + 0.02, 1, 0.92))
    return fig


def _tolerance_lines(ax: Axes, key: str, certificate: dict[str, Any] | None) -> list[float]:
    """The certificate's tolerance for `key` as a red line (the one it judged by), and the run's own
    declared value, dashed, where tolerances were given after the run and differ."""
    cert = certificate or {}
    goal = (cert.get("tolerances") or {}).get(key)
    drawn: list[float] = []
    if isinstance(goal, int | float):
        after = " (given after the run)" if cert.get("tolerances_declared") else ""
        ax.axhline(goal, color="#C44E52", lw=1.2, label=f"tolerance {key} = {goal:g}{after}")
        drawn.append(goal)
    else:
        ax.text(0.5, 0.92, f"no {key} tolerance declared", transform=ax.transAxes, ha="center", fontsize=8)
    own = (cert.get("tolerances_of_the_run") or {}).get(key) if cert.get("tolerances_declared") else None
    if isinstance(own, int | float) and own != goal:
        ax.axhline(own, color="#555555", lw=1, ls="--", label=f"declared by the run: {own:g}")
        drawn.append(own)
    return drawn


def _bars(ax: Axes, values: list[Any], x: list[float], width: float, **style: Any) -> list[float]:
    """Bars of finite values; an infinite one (a z of ±inf: every position moved alike) is drawn to
    the top and labelled ∞. Returns the finite heights."""
    vals = [number(v) for v in values]
    finite = [abs(v) for v in vals if isinstance(v, int | float) and math.isfinite(v)]
    top = max(finite, default=1.0) * 1.15 or 1.0
    heights = [abs(v) if isinstance(v, int | float) and math.isfinite(v) else top for v in vals]
    bars = ax.bar(x, heights, width, **style)
    ax.bar_label(
        bars,
        [f"{v:.2g}" if isinstance(v, int | float) and math.isfinite(v) else "∞" for v in vals],
        fontsize=7,
    )
    return finite


def nll_deltas(
    numerics: pd.DataFrame, labels: dict[str, str] | None = None, certificate: dict[str, Any] | None = None
) -> Figure:
    """|ΔNLL| per position (mean and max) for A/B pairs next to the A/A noise pairs; where the run
    has per-document values, the largest per-document |ΔNLL| and |z| of each pair with the
    numeric certificate's tolerances (nll_doc_abs, nll_doc_z) drawn as lines."""
    labels = labels or {"A": "A", "B": "B"}
    names, items = [], []
    for _, num in numerics[numerics["kind"] == "nll"].iterrows():
        for kind in ("ab", "aa"):
            for item in num[kind]:
                names.append(f"{num['cell_id']}\n{'A/B' if kind == 'ab' else 'A/A'} {item['pair']}")
                items.append(item)
    per_doc = any(i.get("doc_dnll_abs_max") is not None for i in items)
    panels = 3 if per_doc else 1
    fig, axes = plt.subplots(1, panels, figsize=(7 if panels == 1 else 16, 4.4), squeeze=False)
    x = list(range(len(names)))
    ax = axes[0][0]
    maxes: list[float] = []
    for offset, key, name in ((-0.2, "dnll_abs_mean", "mean |ΔNLL|"), (0.2, "dnll_abs_max", "max |ΔNLL|")):
        maxes += _bars(ax, [i.get(key) for i in items], [k + offset for k in x], 0.4, label=name)
    ax.set_ylim(0, max([*maxes, 1e-6]) * 1.3)
    if maxes and max(maxes) == 0:
        ax.text(
            0.5,
            0.5,
            "every compared prompt logprob is bit-identical",
            transform=ax.transAxes,
            ha="center",
            fontsize=9,
        )
    ax.set_title(
        "per position (the certificate judges documents, not positions)"
        if per_doc
        else "per position; this run's ab.json has no per-document values: no tolerance to draw",
        fontsize=9,
    )
    ax.set_ylabel("nats per token")
    if per_doc:
        for ax, key, tol, unit, title in (
            (axes[0][1], "doc_dnll_abs_max", "nll_doc_abs", "nats per token", "largest per-document |ΔNLL|"),
            (axes[0][2], "doc_dnll_z_abs_max", "nll_doc_z", "standard errors", "largest per-document |z|"),
        ):
            heights = _bars(ax, [i.get(key) for i in items], x, 0.5, color="#8172B3")
            lines = _tolerance_lines(ax, tol, certificate)
            ax.set_ylim(0, max([*heights, *lines, 1e-6]) * 1.3)
            ax.set_title(title, fontsize=9)
            ax.set_ylabel(unit)
    for ax in axes[0]:
        ax.set_xticks(x, names, fontsize=7)
        handles, _ = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=7, loc="upper right")
    status = f"; numeric certificate: {certificate['status']}" if certificate else ""
    fig.suptitle(f"Prompt-logprob deltas, {labels['A']} vs {labels['B']} (A/B vs A/A){status}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return fig


UNITS = {"output_throughput": "output tok/s (end to end)", "decode_tok_s": "decode tok/s (window)"}
RUN_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")


def e2e_throughput_by_run(
    frame: pd.DataFrame, arm_labels: dict[str, dict[str, str]], metric: str = "output_throughput"
) -> Figure:
    """Compare chart 04 (the seed write-up's end-to-end production throughput): `metric` per
    closed-loop cell family (one panel each) and concurrency (groups), grouped bars per run and
    arm (A hatched, B solid, one colour per run), each the arm's mean over its valid runs with its
    95 % t interval. `frame`: one row per valid run summary with run, variant, series,
    concurrency and `metric`; `arm_labels`: run → {A, B} → the run's own label."""
    runs = [r for r in arm_labels if (frame["run"] == r).any()]  # runs without a bar take no slot
    series = sorted(frame["series"].unique())
    slots = [(k, run, v) for k, run in enumerate(runs) for v in ("A", "B")]
    width = 0.8 / len(slots)
    widths = [
        max(4.0, 0.9 * len(frame[frame["series"] == s]["concurrency"].unique()) * len(slots) * 0.45)
        for s in series
    ]
    fig, axes = plt.subplots(1, len(series), figsize=(max(sum(widths) + 1, 9.0), 4.8), squeeze=False)
    for ax, s in zip(axes[0], series, strict=True):
        d = frame[frame["series"] == s]
        concurrencies = sorted(d["concurrency"].unique())
        for g, c in enumerate(concurrencies):
            for i, (k, run, v) in enumerate(slots):
                ci = mean_ci(d[(d["run"] == run) & (d["variant"] == v) & (d["concurrency"] == c)][metric])
                if ci is None:
                    continue
                err = [[ci.mean - ci.low], [ci.high - ci.mean]] if ci.has_ci else None
                ax.bar(
                    g + (i - (len(slots) - 1) / 2) * width,
                    ci.mean,
                    width * 0.95,
                    yerr=err,
                    capsize=2,
                    color=RUN_COLORS[k % len(RUN_COLORS)],
                    alpha=0.55 if v == "A" else 1.0,
                    hatch="//" if v == "A" else None,
                    edgecolor="white",
                    label=f"{run} · {arm_labels[run][v]}",
                )
        ax.set_xticks(range(len(concurrencies)), [f"C={c}" for c in concurrencies])
        ax.set_title(s, fontsize=9)
        ax.set_ylabel(UNITS.get(metric, metric), fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    handles: dict[str, Any] = {}
    for ax in axes[0]:
        for h, text in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(text, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=2, fontsize=7)
    fig.suptitle(
        "End-to-end output throughput per workload and concurrency, per run (A hatched, B solid)\n"
        f"{CI_TEXT}; no bar: no valid run of that cell",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.03 + 0.025 * math.ceil(len(handles) / 2), 1, 0.9))
    return fig


def scaling_by_gpus(frame: pd.DataFrame, metric: str = "output_throughput") -> Figure:
    """Compare chart 05 (the seed write-up's topology scaling): `metric` in total (top) and per GPU
    (bottom) against the runs ordered by GPU count (tp × pp from each run's profile), one panel per
    closed-loop cell family, one line per concurrency and arm (A dashed, B solid), each point the
    arm's mean over its valid runs with its 95 % t interval. `frame`: one row per valid run
    summary with run, gpus, topology, variant, series, concurrency and `metric`."""
    order = frame.drop_duplicates("run").sort_values(["gpus", "topology", "run"])
    position = {run: i for i, run in enumerate(order["run"])}
    series = sorted(frame["series"].unique())
    concurrencies = sorted(frame["concurrency"].unique())
    cmap = plt.get_cmap("viridis")
    color = {c: cmap(i / max(len(concurrencies) - 1, 1) * 0.9) for i, c in enumerate(concurrencies)}
    fig, axes = plt.subplots(2, len(series), figsize=(max(9.0, 4.6 * len(series)), 7.2), squeeze=False)
    for j, s in enumerate(series):
        for c in concurrencies:
            for v, ls in (("A", "--"), ("B", "-")):
                d = frame[(frame["series"] == s) & (frame["concurrency"] == c) & (frame["variant"] == v)]
                points = []
                for run, sub in d.groupby("run"):
                    ci = mean_ci(sub[metric])
                    if ci is not None:
                        points.append((position[str(run)], float(sub["gpus"].iloc[0]), ci))
                points.sort(key=lambda p: p[0])
                if not points:
                    continue
                for row, per in ((0, False), (1, True)):
                    scale = [1 / g if per else 1.0 for _, g, _ in points]
                    ys = [ci.mean * k for (_, _, ci), k in zip(points, scale, strict=True)]
                    err = [
                        [
                            (ci.mean - ci.low) * k if ci.has_ci else 0.0
                            for (_, _, ci), k in zip(points, scale, strict=True)
                        ],
                        [
                            (ci.high - ci.mean) * k if ci.has_ci else 0.0
                            for (_, _, ci), k in zip(points, scale, strict=True)
                        ],
                    ]
                    axes[row][j].errorbar(
                        [p for p, _, _ in points],
                        ys,
                        yerr=err,
                        capsize=3,
                        color=color[c],
                        linestyle=ls,
                        marker="o",
                        ms=4,
                        label=f"{v} C={c}",
                    )
        for row, unit in ((0, "total"), (1, "per GPU")):
            ax = axes[row][j]
            ax.set_xticks(
                range(len(order)),
                [
                    f"{int(g)} GPUs · {t}\n{r}"
                    for g, t, r in zip(order["gpus"], order["topology"], order["run"], strict=True)
                ],
                fontsize=6,
            )
            ax.set_xlim(-0.5, len(order) - 0.5)
            ax.set_ylabel(f"{UNITS.get(metric, metric)}, {unit}", fontsize=8)
            ax.grid(alpha=0.3)
        axes[0][j].set_title(s, fontsize=9)
    axes[0][0].legend(fontsize=6, ncol=2)
    fig.suptitle(
        "Scaling across topologies: total and per-GPU throughput by GPU count (A dashed, B solid)\n"
        f"GPUs = tp × pp of each run's profile; {CI_TEXT.replace('of the mean ', '')}",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


def save(fig: Figure, out: Path, name: str, note: str | None = None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    if note:  # e.g. "CPU smoke A/A …": the caption travels with the picture
        fig.subplots_adjust(bottom=fig.subplotpars.bottom + 0.06)
        fig.text(0.01, 0.01, note, fontsize=6, wrap=True)
    paths = [out / f"{name}.png", out / f"{name}.svg"]
    fig.savefig(paths[0], dpi=120, metadata={"Software": None})
    fig.savefig(paths[1], metadata={"Date": None})
    plt.close(fig)
    return paths


Chart = tuple[str, str | None, Callable[[], Figure]]  # (name, why it is not drawn or None, draw)


def run_charts(summary: dict[str, Any], ab: dict[str, Any]) -> list[Chart]:
    """Every chart of one run, each with the reason it is not drawn (None: drawn)."""
    runs, rows, labels = runs_frame(summary), ab_frame(ab), _labels(summary)
    kinds = set(runs["kind"]) if not runs.empty and "kind" in runs else set()
    rates = rate_frame(runs)
    goodput = (
        rates[rates["goodput_req_s"].map(_present).astype(bool)]
        if "goodput_req_s" in rates
        else rates.iloc[0:0]
    )
    ramps = ramp_frame(runs)
    numerics = pd.DataFrame(ab["numerics"])
    nll = numerics[numerics["kind"] == "nll"] if not numerics.empty else numerics
    certificate = ab.get("numeric_certificate") or summary.get("numeric_certificate")

    def why_not(ok: bool, text: str) -> str | None:
        return None if ok else text

    has_rows = not rows.empty and rows["metric"].isin(["prefill_tok_s", "decode_tok_s"]).any()
    no_rate = "no valid open-loop rate cell at a single offered rate"
    if rates.empty and "rate" in kinds:
        no_rate += " (ramps have no single rate)"
    return [
        (
            "throughput_ab",
            why_not(has_rows, "no prefill or decode throughput row"),
            lambda: throughput_ab(rows, labels),
        ),
        (
            "decode_scaling",
            why_not("decode" in kinds, "no valid decode cell"),
            lambda: decode_scaling(runs, labels),
        ),
        (
            "throughput_by_concurrency",
            why_not(bool(kinds & set(CLOSED_LOOP)), "no valid decode, chat or shared-prefix cell"),
            lambda: throughput_by_concurrency(runs, labels),
        ),
        (
            "prefill_by_isl",
            why_not(bool(kinds & {"prefill-cold", "ttft"}), "no valid cold-prefill or TTFT cell"),
            lambda: prefill_by_isl(runs, labels),
        ),
        ("latency_vs_rate", why_not(not rates.empty, no_rate), lambda: latency_vs_rate(rates, labels, rows)),
        (
            "goodput_vs_rate",
            (
                why_not(not goodput.empty, "the plan declares no SLO (plan.slo): goodput is not defined")
                if not rates.empty
                else no_rate
            ),
            lambda: goodput_vs_rate(goodput, labels),
        ),
        (
            "ramp_over_time",
            why_not(not ramps.empty, "no valid ramp cell with a recorded timeline"),
            lambda: ramp_over_time(ramps, labels),
        ),
        (
            "nll_deltas",
            # greedy pairs alone would draw nothing
            why_not(not nll.empty and any(len(x) for x in nll["ab"]), "no NLL cell with an A/B pair"),
            lambda: nll_deltas(numerics, labels, certificate),
        ),
    ]


def charts_for_run(run_dir: Path, out: Path, notes: list[str] | None = None) -> list[Path]:
    """Draw every chart the run has cells for; one line per chart not drawn goes to `notes`."""
    summary, ab = read_json(run_dir / "summary.json"), read_json(run_dir / "ab.json")
    note = summary["provenance"].get("note")
    written: list[Path] = []
    for name, why, draw in run_charts(summary, ab):
        if why is None:
            written += save(draw(), out, name, note)
        elif notes is not None:
            notes.append(f"{run_dir.name}: {name} not drawn: {why}")
    return written


def all_charts(results: Path, charts: Path, notes: list[str] | None = None) -> list[Path]:
    written: list[Path] = []
    for summary in sorted(results.rglob("summary.json")):
        run_dir = summary.parent
        manifest = run_dir / "manifest.json"
        if (
            manifest.exists()
            and (run_dir / "ab.json").exists()
            and read_json(manifest).get("schema_version") == SCHEMA_VERSION
        ):  # harness runs only
            written += charts_for_run(run_dir, charts / run_dir.relative_to(results), notes)
    return written
