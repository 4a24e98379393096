"""Charts regenerated from result files only (`make charts`): one pure function per chart.

Each chart is `(DataFrame) -> Figure`, saved as PNG and SVG under charts/<run path>/ with
deterministic metadata, so re-running on the same results rewrites the same files.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from deepinfer_harness import SCHEMA_VERSION
from deepinfer_harness.analysis.stats import MIN_PAIRS
from deepinfer_harness.layout import read_json

plt.rcParams["svg.hashsalt"] = "deepinfer-harness"
COLORS = {"A": "#4C72B0", "B": "#DD8452"}


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


def _arm_lines(ax: Axes, d: pd.DataFrame, x: str, metric: str, labels: dict[str, str]) -> None:
    """Every run of each arm as a dot, and the arm's mean per x as a line."""
    for v in ("A", "B"):
        sub = d[d["variant"] == v]
        if sub.empty or metric not in sub:
            continue
        ax.scatter(sub[x], sub[metric], color=COLORS[v], alpha=0.5, s=14)
        mean = sub.groupby(x)[metric].mean()
        ax.plot(mean.index, mean.values, "-o", color=COLORS[v], label=labels[v])


def decode_scaling(runs: pd.DataFrame, labels: dict[str, str]) -> Figure:
    """System decode tok/s and TPOT against concurrency, one line per arm, every run as a dot."""
    d = runs[runs["kind"] == "decode"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
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
        ax.legend(fontsize=8)
    fig.suptitle("Decode scaling by concurrency")
    fig.tight_layout()
    return fig


def prefill_by_isl(runs: pd.DataFrame, labels: dict[str, str]) -> Figure:
    """Median TTFT and prefill tok/s against prompt length (C=1 cold prefill and TTFT cells)."""
    d = runs[runs["kind"].isin(["prefill-cold", "ttft"]) & (runs["concurrency"] == 1)]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric, unit in (
        (axes[0], "median_ttft_ms", "median TTFT (ms)"),
        (axes[1], "prefill_tok_s", "prefill tok/s (ISL / server TTFT)"),
    ):
        _arm_lines(ax, d, "isl", metric, labels)
        ax.set_xscale("log", base=2)
        isls = sorted(d["isl"].unique())
        ax.set_xticks(isls, [_size_label(x) for x in isls])
        ax.minorticks_off()
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Prefill by prompt length")
    fig.tight_layout()
    return fig


def nll_deltas(numerics: pd.DataFrame) -> Figure:
    """|ΔNLL| per position (mean and max) for A/B pairs next to the A/A noise pairs."""
    fig, ax = plt.subplots(figsize=(7, 4))
    labels, means, maxes = [], [], []
    for _, num in numerics[numerics["kind"] == "nll"].iterrows():
        for kind in ("ab", "aa"):
            for item in num[kind]:
                labels.append(f"{num['cell_id']}\n{kind.upper()} {item['pair']}")
                means.append(item["dnll_abs_mean"])
                maxes.append(item["dnll_abs_max"])
    x = range(len(labels))
    for offset, values, name in ((-0.2, means, "mean |ΔNLL|"), (0.2, maxes, "max |ΔNLL|")):
        bars = ax.bar([i + offset for i in x], values, 0.4, label=name)
        ax.bar_label(bars, [f"{v:.2g}" for v in values], fontsize=7)
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
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_ylabel("nats per token")
    ax.set_title("Prompt-logprob deltas (A/B vs A/A)")
    ax.legend(fontsize=8)
    fig.tight_layout()
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


def charts_for_run(run_dir: Path, out: Path) -> list[Path]:
    summary, ab = read_json(run_dir / "summary.json"), read_json(run_dir / "ab.json")
    runs, rows, labels = runs_frame(summary), ab_frame(ab), _labels(summary)
    note = summary["provenance"].get("note")
    written: list[Path] = []
    if not rows.empty and rows["metric"].isin(["prefill_tok_s", "decode_tok_s"]).any():
        written += save(throughput_ab(rows, labels), out, "throughput_ab", note)
    if not runs.empty and (runs["kind"] == "decode").any():
        written += save(decode_scaling(runs, labels), out, "decode_scaling", note)
    if not runs.empty and runs["kind"].isin(["prefill-cold", "ttft"]).any():
        written += save(prefill_by_isl(runs, labels), out, "prefill_by_isl", note)
    numerics = pd.DataFrame(ab["numerics"])
    nll = numerics[numerics["kind"] == "nll"] if not numerics.empty else numerics
    if not nll.empty and any(len(x) for x in nll["ab"]):  # greedy pairs alone would draw nothing
        written += save(nll_deltas(numerics), out, "nll_deltas", note)
    return written


def all_charts(results: Path, charts: Path) -> list[Path]:
    written: list[Path] = []
    for summary in sorted(results.rglob("summary.json")):
        run_dir = summary.parent
        manifest = run_dir / "manifest.json"
        if (
            manifest.exists()
            and (run_dir / "ab.json").exists()
            and read_json(manifest).get("schema_version") == SCHEMA_VERSION
        ):  # harness runs only
            written += charts_for_run(run_dir, charts / run_dir.relative_to(results))
    return written
