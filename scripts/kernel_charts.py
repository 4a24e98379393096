"""Kernel-speedup chart from results/gpu/*.json only (no GPU): bars per kernel and size for the SM80
baseline, upstream vLLM 0.32.0 and DeepInfer, labeled with the GPU the JSON was measured on.

Usage: python scripts/kernel_charts.py RESULTS_GPU_DIR CHARTS_DIR  ->  CHARTS_DIR/kernel_speedups.{png,svg}
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COMBINE_T = (64, 1536, 4096)
GATHER_TOKENS = (4096, 49_152, 1_048_576)
INSERT_TOKENS = (64, 1536, 8192)


@dataclass(frozen=True)
class Group:
    label: str  # x tick
    bars: dict[str, float]  # series -> µs


def _size(n: int) -> str:
    return f"{n / 1024:g}K" if n >= 1024 else str(n)


def combine_groups(data: dict) -> list[Group]:
    """Ratio 1 rows; both our and upstream's kernel write into a caller buffer (`out=`), as in serving."""
    rows = [s for s in data["results"]["shapes"] if s["ratio"] == 1 and s["T"] in COMBINE_T]
    return [
        Group(
            f"T={r['T']}",
            {
                "PyTorch op chain (write-up baseline)": r["timings"]["op chain"]["us"],
                "upstream = SM80 baseline": r["timings"]["upstream out="]["us"],
                "DeepInfer": r["timings"]["optimized out="]["us"],
            },
        )
        for r in sorted(rows, key=lambda r: r["T"])
    ]


def cache_groups(data: dict, key: str, sizes: tuple[int, ...]) -> list[Group]:
    rows = [r for r in data["results"][key] if r["tokens"] in sizes]
    return [
        Group(
            _size(r["tokens"]),
            {
                "SM80 port (base)": r["base"]["us"],
                "upstream (sm_90 only)": r["upstream"]["us"],
                "DeepInfer": r["optimized"]["us"],
            },
        )
        for r in sorted(rows, key=lambda r: r["tokens"])
    ]


def draw(ax: plt.Axes, title: str, groups: list[Group]) -> None:
    series = list(groups[0].bars)
    width = 0.8 / len(series)
    for j, name in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(groups))]
        ys = [g.bars[name] for g in groups]
        bars = ax.bar(xs, ys, width, label=name)
        for bar, g in zip(bars, groups, strict=True):
            if name == "DeepInfer":
                best_other = min(v for k, v in g.bars.items() if k != name)
                ax.annotate(f"{best_other / g.bars[name]:.1f}x", (bar.get_x() + width / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(top=8 * max(v for g in groups for v in g.bars.values()))  # room for the legend
    ax.set_xticks(range(len(groups)), [g.label for g in groups])
    ax.set_ylabel("µs (median, CUDA graph)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)


def render(results: Path, charts: Path) -> list[Path]:
    combine = json.loads((results / "topk_swa_combine-h200.json").read_text())
    cache = json.loads((results / "kv_cache-h200.json").read_text())
    prov = cache["provenance"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    draw(axes[0], "combine_topk_swa_indices (ratio 1)", combine_groups(combine))
    draw(axes[1], "dequantize_and_gather_k_cache", cache_groups(cache, "gather", GATHER_TOKENS))
    draw(axes[2], "quantize_and_insert_k_cache", cache_groups(cache, "insert", INSERT_TOKENS))
    fig.suptitle(
        f"Measured on {prov['gpu']} (sm_{prov['capability'].replace('.', '')}, driver {prov['driver']}, "
        f"torch {prov['torch']}, triton {prov['triton']}); labels: DeepInfer's speedup over the best "
        "other bar. Not Ampere: no SM80 GPU was available.",
        fontsize=9,
    )
    fig.tight_layout()
    charts.mkdir(parents=True, exist_ok=True)
    out = [charts / "kernel_speedups.png", charts / "kernel_speedups.svg"]
    for path in out:
        fig.savefig(path, dpi=120, metadata={"Date": None} if path.suffix == ".svg" else None)
    plt.close(fig)
    return out


if __name__ == "__main__":
    for p in render(Path(sys.argv[1]), Path(sys.argv[2])):
        print(f"wrote {p}")
