"""Kernel charts from results/gpu/*.json only (no GPU, no per-op code): the rows every bench writes.

One chart per op (µs against size, a line per impl and shape, log-log) and one overview of DeepInfer's
speedup over base and upstream at each measured size, each labelled with the GPU and versions of the run.
Usage: python scripts/kernel_charts.py RESULTS_GPU_DIR CHARTS_DIR (writes <op>.{png,svg}, speedups.{png,svg})
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

plt.rcParams["svg.hashsalt"] = "deepinfer-sm80"  # stable element ids: the same JSON gives the same SVG

STYLE = {"deepinfer": "-o", "base": "--s", "upstream": ":^", "torch": "-.x"}


def load_rows(results: Path) -> tuple[list[dict], dict[str, str]]:
    """Every row of every JSON that has them, and op -> provenance label."""
    rows: list[dict] = []
    labels: dict[str, str] = {}
    for path in sorted(results.glob("*.json")):
        data = json.loads(path.read_text())
        if not data.get("rows"):
            print(f"kernel_charts: {path.name} has no rows (older schema), skipped", file=sys.stderr)
            continue
        prov = data.get("provenance", {})
        label = (
            f"{prov.get('gpu', '?')} | torch {prov.get('torch', '?')} | triton {prov.get('triton', '?')}"
            f" | git {str(prov.get('git_sha', '?'))[:7]}"
        )
        for row in data["rows"]:
            rows.append(row)
            labels[row["op"]] = label
    return rows, labels


def op_figure(op: str, rows: list[dict], label: str) -> plt.Figure:
    series: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        series[(r["impl"], r["shape"])].append((r["size"], r["us"]))
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for (impl, shape), points in sorted(series.items()):
        points.sort()
        ax.plot(*zip(*points, strict=True), STYLE.get(impl, "-"), label=f"{impl} {shape}", markersize=4)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("size (see the op's bench: tokens, query rows or keys)")
    ax.set_ylabel("µs (median of CUDA-graph replays)")
    ax.set_title(f"{op}\n{label}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def speedup_figure(rows: list[dict], labels: dict[str, str]) -> plt.Figure:
    """Per op, DeepInfer's speedup over base and over upstream: median bar, whiskers at min and max
    over every measured (shape, size)."""
    by_key: dict[tuple[str, str, int], dict[str, float]] = defaultdict(dict)
    for r in rows:
        by_key[(r["op"], r["shape"], r["size"])][r["impl"]] = r["us"]
    ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
    for (op, _shape, _size), impls in by_key.items():
        for ref in ("base", "upstream"):
            if "deepinfer" in impls and ref in impls:
                ratios[(op, ref)].append(impls[ref] / impls["deepinfer"])
    keys = sorted(ratios)
    med = [statistics.median(ratios[k]) for k in keys]
    low = [m - min(ratios[k]) for m, k in zip(med, keys, strict=True)]
    high = [max(ratios[k]) - m for m, k in zip(med, keys, strict=True)]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(keys)), 4.8))
    colors = {"base": "tab:blue", "upstream": "tab:orange"}
    ax.bar(range(len(keys)), med, yerr=[low, high], capsize=3, color=[colors[k[1]] for k in keys])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(range(len(keys))), [f"{op} vs {ref} (n={len(ratios[(op, ref)])})" for op, ref in keys],
                  rotation=60, ha="right", fontsize=7)  # fmt: skip
    ax.set_ylabel("DeepInfer speedup (x): median, min-max")
    ax.set_yscale("log")
    ax.set_title("\n".join(sorted(set(labels.values()))), fontsize=6)
    fig.tight_layout()
    return fig


def save(fig: plt.Figure, out: Path, stem: str) -> None:
    for ext in ("png", "svg"):
        # fixed metadata so re-running on the same JSON rewrites identical files
        meta = {"Software": None} if ext == "png" else {"Date": None, "Creator": None}
        fig.savefig(out / f"{stem}.{ext}", dpi=110, metadata=meta)
    plt.close(fig)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: kernel_charts.py RESULTS_GPU_DIR CHARTS_DIR", file=sys.stderr)
        return 2
    results, out = Path(argv[0]), Path(argv[1])
    if not results.is_dir():
        print(f"kernel_charts: {results} is not a directory", file=sys.stderr)
        return 2
    rows, labels = load_rows(results)
    out.mkdir(parents=True, exist_ok=True)
    by_op: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_op[r["op"]].append(r)
    for op, op_rows in sorted(by_op.items()):
        save(op_figure(op, op_rows, labels[op]), out, op)
    if rows:
        save(speedup_figure(rows, labels), out, "speedups")
    print(f"kernel_charts: {len(by_op)} ops, {len(rows)} rows -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
