"""Kernel charts from results/gpu/*.json only (no GPU, no per-op code): the rows every bench writes.

One chart per op (µs per call against size, log-log; graph replay or eager as the shape names it)
and one overview of DeepInfer's speedup over base and upstream, each labelled with the file, GPU,
versions and git sha of its run. Legible at a glance: at most MAX_SERIES series a panel (an op with
more gets one panel per group of shapes), every series in a panel its own colour (shape) and marker +
line style (impl), units on both axes, and timing modes ("eager" vs "graph" in a shape's name) never
pooled into one bar. Re-running on the same JSON rewrites identical files; charts of ops no JSON has
any more are removed.

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

MAX_SERIES = 8
IMPL_STYLE = {"deepinfer": ("-", "o"), "base": ("--", "s"), "upstream": (":", "^"), "torch": ("-.", "x")}
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray")
# x-axis quantity of each op's `size` (the benches' row docs); ops not listed say "size (rows' unit)"
SIZE_UNIT = {
    "kv_gather": "tokens gathered",
    "kv_quant_insert": "tokens inserted",
    "topk_swa_combine": "query tokens T",
    "sparse_mla_decode": "query rows Tq",
    "sparse_mla_prefill": "query tokens",
    "dspark_draft": "batch B (requests)",
    "indexer_decode_logits": "keys (context tokens)",
    "indexer_decode_topk": "keys (context tokens)",
    "indexer_prefill_logits": "keys (context tokens)",
    "indexer_prefill_topk": "keys (context tokens)",
    "indexer_prefill_cand_only": "keys (context tokens)",
    "indexer_prefill_cand_write": "keys (context tokens)",
    "mhc_post_pre": "tokens T",
}


def load_rows(results: Path) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """op -> its rows from one JSON (the newest run where several have the op), op -> that run's label."""
    by_op: dict[str, tuple[str, list[dict], str]] = {}
    for path in sorted(results.glob("*.json")):
        data = json.loads(path.read_text())
        if not data.get("rows"):
            print(f"kernel_charts: {path.name} has no rows, skipped", file=sys.stderr)
            continue
        prov = data.get("provenance", {})
        date = str(prov.get("date", ""))
        label = (
            f"{path.name} | {prov.get('gpu', '?')} | torch {prov.get('torch', '?')} | "
            f"triton {prov.get('triton', '?')} | git {str(prov.get('git_sha', '?'))[:7]}"
        )
        ops: dict[str, list[dict]] = defaultdict(list)
        for row in data["rows"]:
            ops[row["op"]].append(row)
        for op, rows in ops.items():
            if op in by_op:
                older = by_op[op] if by_op[op][0] <= date else (date, rows, label)
                note = f"kernel_charts: {op} in two files, drawing the newer ({older[2]} left out)"
                print(note, file=sys.stderr)
                if by_op[op][0] > date:
                    continue
            by_op[op] = (date, rows, label)
    return {op: v[1] for op, v in by_op.items()}, {op: v[2] for op, v in by_op.items()}


def panels(series: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """(impl, shape) series split into panels of at most MAX_SERIES, whole shapes per panel."""
    shapes = sorted({s for _, s in series})
    per_shape = {s: sorted(i for i, sh in series if sh == s) for s in shapes}
    out: list[list[tuple[str, str]]] = [[]]
    for shape in shapes:
        group = [(impl, shape) for impl in per_shape[shape]]
        if out[-1] and len(out[-1]) + len(group) > MAX_SERIES:
            out.append([])
        out[-1].extend(group)
    return out


def op_figure(op: str, rows: list[dict], label: str) -> plt.Figure:
    points: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        points[(r["impl"], r["shape"])].append((r["size"], r["us"]))
    groups = panels(list(points))
    fig, axes = plt.subplots(1, len(groups), figsize=(6.2 * len(groups), 4.6), squeeze=False)
    for ax, group in zip(axes[0], groups, strict=True):
        shapes = sorted({s for _, s in group})
        for impl, shape in group:
            line, marker = IMPL_STYLE.get(impl, ("-", "d"))
            xy = sorted(points[(impl, shape)])
            ax.plot(*zip(*xy, strict=True), linestyle=line, marker=marker, markersize=4,
                    color=COLORS[shapes.index(shape) % len(COLORS)], label=f"{impl} {shape}")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(f"{SIZE_UNIT.get(op, 'size (the rows unit)')}, log2")
        ax.set_ylabel("time per call, µs (median, log)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle(f"{op} (no CI: medians of one run)\n{label}", fontsize=9)
    fig.tight_layout()
    return fig


def _group(op: str, shape: str) -> str:
    """The speedup bar a row belongs to: its op, split by timing mode where the shape names one."""
    mode = next((m for m in ("eager", "graph") if m in shape.split("-")), None)
    return f"{op} ({mode})" if mode else op


def speedup_figure(by_op: dict[str, list[dict]], labels: dict[str, str]) -> plt.Figure:
    """Per op (and timing mode), DeepInfer's speedup over base and over upstream: median bar, whiskers
    at min and max over every measured (shape, size)."""
    by_key: dict[tuple[str, str, int], dict[str, float]] = defaultdict(dict)
    for op, rows in by_op.items():
        for r in rows:
            by_key[(op, r["shape"], r["size"])][r["impl"]] = r["us"]
    ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
    for (op, shape, _size), impls in by_key.items():
        for ref in ("base", "upstream"):
            if "deepinfer" in impls and ref in impls:
                ratios[(_group(op, shape), ref)].append(impls[ref] / impls["deepinfer"])
    keys = sorted(ratios)
    med = [statistics.median(ratios[k]) for k in keys]
    low = [m - min(ratios[k]) for m, k in zip(med, keys, strict=True)]
    high = [max(ratios[k]) - m for m, k in zip(med, keys, strict=True)]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(keys)), 5.2))
    colors = {"base": "tab:blue", "upstream": "tab:orange"}
    hatch = {"base": "", "upstream": "//"}
    for i, k in enumerate(keys):
        ax.bar(i, med[i], yerr=[[low[i]], [high[i]]], capsize=3, color=colors[k[1]], hatch=hatch[k[1]],
               label=f"vs {k[1]}" if k[1] not in [kk[1] for kk in keys[:i]] else None)  # fmt: skip
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(range(len(keys))), [f"{g} vs {ref} (n={len(ratios[(g, ref)])})" for g, ref in keys],
                  rotation=60, ha="right", fontsize=7)  # fmt: skip
    ax.set_ylabel("DeepInfer speedup, × (their µs / ours, log)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title("bar: median over (shape, size), whiskers: min–max; no CI: one run per op\n"
                 + "\n".join(sorted(set(labels.values()))), fontsize=6)  # fmt: skip
    fig.tight_layout()
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


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: kernel_charts.py RESULTS_GPU_DIR CHARTS_DIR", file=sys.stderr)
        return 2
    results, out = Path(argv[0]), Path(argv[1])
    if not results.is_dir():
        print(f"kernel_charts: {results} is not a directory", file=sys.stderr)
        return 2
    by_op, labels = load_rows(results)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for op, op_rows in sorted(by_op.items()):
        written += save(op_figure(op, op_rows, labels[op]), out, op)
    if by_op:
        written += save(speedup_figure(by_op, labels), out, "speedups")
    for stale in sorted({*out.glob("*.png"), *out.glob("*.svg")} - set(written)):
        stale.unlink()  # a chart whose rows no JSON holds any more (this folder is the script's own)
        print(f"kernel_charts: removed {stale.name} (no rows behind it)")
    print(f"kernel_charts: {len(by_op)} ops, {sum(map(len, by_op.values()))} rows -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
