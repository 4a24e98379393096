"""Run-level outputs from files only: summary.json, ab.json, and Markdown/CSV tables (pandas).

`summarize_run_dir` re-summarizes every run file, compares A and B per cell and metric, and
writes the tables; it refuses to compare runs whose cell definitions differ (mark `x`).
"""

from __future__ import annotations

import math
import platform
from typing import Any

import pandas as pd

from deepinfer_harness import SCHEMA_VERSION, __version__
from deepinfer_harness.ab import compare_metric, metrics_for, numerics
from deepinfer_harness.layout import RunLayout, read_json, write_json
from deepinfer_harness.metrics import ttft_ns
from deepinfer_harness.records import read_records
from deepinfer_harness.summarize import summarize_from_files

RUN_COLUMNS = ["cell_id", "variant", "rep", "session", "completed", "failed", "median_ttft_ms",
               "mean_tpot_ms",
               "decode_tok_s", "prefill_tok_s", "nll_mean", "valid"]


def fmt(x: Any, digits: int = 3) -> str:
    if not isinstance(x, int | float) or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:,.0f}"


def markdown(frame: pd.DataFrame) -> str:
    """GitHub table without the optional `tabulate` dependency."""
    cells = [[fmt(v, 4) if isinstance(v, float) else str(v) for v in row]
             for row in frame.itertuples(index=False)]
    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    return "\n".join([head, rule, *("| " + " | ".join(c) + " |" for c in cells)])


def ab_line(row: dict[str, Any]) -> str:
    """`decode-i1k-o256-c8  tpot_ms  41.2 ± 0.6 → 33.9 ± 0.5  0.82×  -  (95% CI 0.80–0.84)`."""
    def side(runs: list) -> str:
        vals = [v for v in runs if isinstance(v, int | float) and math.isfinite(v)]
        if not vals:
            return "n/a"
        mean = sum(vals) / len(vals)
        sd = (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else 0.0
        return f"{fmt(mean)} ± {fmt(sd, 2)}"
    ratio = f"{row['ratio']:.3f}×" if row.get("ratio") else "n/a"
    ci = f"(95% CI {row['ci_low']:.3f}–{row['ci_high']:.3f}, n={row['n_pairs']})" if row.get("ratio") else ""
    under = " underpowered" if row.get("underpowered") else ""
    return (f"{row['cell_id']}  {row['metric']}  {side(row['a']['runs'])} → {side(row['b']['runs'])}  "
            f"{ratio}  {row['mark']}  {ci}{under}")


def ttft_samples(layout: RunLayout, runs: list[dict[str, Any]]) -> dict[tuple[str, int], list[float]]:
    """Per-request client TTFT (ms) of each run's measured, successful requests."""
    out = {}
    for run in runs:
        records = read_records(layout.run_file(run["cell_id"], run["variant"], run["rep"], "jsonl"))
        measured = [r for r in records if r.phase == "measure" and r.ok]
        out[(run["variant"], run["rep"])] = [t / 1e6 for r in measured if (t := ttft_ns(r)) is not None]
    return out


def summarize_run_dir(layout: RunLayout) -> dict[str, Any]:
    manifest = read_json(layout.manifest)
    limits = manifest["profile"]["validity"]
    runs: list[dict[str, Any]] = []
    for path in layout.summaries():
        cell_id = path.parent.name
        variant, rep = path.name.split(".")[0], int(path.name.split(".")[1][1:])
        summary = summarize_from_files(layout, cell_id, variant, rep, limits)
        write_json(path, summary)
        runs.append(summary)
    definitions = {c["cell_id"]: c["definition_sha256"] for c in manifest["cells"]}
    present = {(r["cell_id"], r["variant"], r["rep"]) for r in runs}
    missing = [f"{c}/{s['variant']}.r{s['rep']}" for s in manifest["schedule"] for c in definitions
               if (c, s["variant"], s["rep"]) not in present]
    parity_ok = manifest.get("parity", {}).get("status") == "ok"
    ab: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "rows": [], "numerics": []}
    ab_cfg = manifest["profile"]["ab"]
    for cell_id in sorted({r["cell_id"] for r in runs}):
        cell_runs = [r for r in runs if r["cell_id"] == cell_id]
        same_def = all(r.get("definition_sha256") == definitions.get(cell_id) for r in cell_runs)
        kind = cell_runs[0]["kind"]
        for metric in metrics_for(kind, cell_runs):
            delta = ab_cfg["deltas"].get(metric.removeprefix("median_").removeprefix("mean_"))
            samples = ttft_samples(layout, cell_runs) if metric.startswith("p") and "ttft" in metric else None
            row = compare_metric(cell_runs, metric, parity_ok and same_def, ab_cfg["bootstrap_resamples"],
                                 ab_cfg["seed"], delta, samples)
            if row:
                row["line"] = ab_line(row)
                ab["rows"].append(row)
        if kind in ("nll", "greedy"):
            ab["numerics"].append(numerics(layout, cell_id, kind, cell_runs))
    write_json(layout.ab, ab)
    summary = {"schema_version": SCHEMA_VERSION, "run_id": manifest["run_id"],
               "provenance": {"harness_version": __version__, "git_sha": manifest["harness"].get("git_sha"),
                              "python": platform.python_version(), "profile": manifest["profile"]["name"],
                              "parity": manifest.get("parity"), "labels": manifest["profile"]["labels"],
                              "note": manifest.get("note")},
               "runs": runs, "n_runs": len(runs), "missing_runs": missing,
               "n_invalid": sum(1 for r in runs if not r["validity"]["valid"]),
               "ab_lines": [row["line"] for row in ab["rows"]]}
    write_json(layout.summary, summary)
    write_tables(layout, runs, ab)
    return summary


def write_tables(layout: RunLayout, runs: list[dict[str, Any]], ab: dict[str, Any]) -> None:
    frame = pd.DataFrame([{**{k: r.get(k) for k in RUN_COLUMNS if k != "valid"},
                           "valid": r["validity"]["valid"]} for r in runs], columns=RUN_COLUMNS)
    frame.to_csv(layout.root / "runs.csv", index=False)
    rows = pd.DataFrame([{"cell_id": r["cell_id"], "metric": r["metric"], "a": r["a"]["estimate"],
                          "b": r["b"]["estimate"], "ratio": r["ratio"], "ci_low": r["ci_low"],
                          "ci_high": r["ci_high"], "n_pairs": r["n_pairs"], "noise_floor": r["noise_floor"],
                          "mark": r["mark"], "underpowered": r["underpowered"]} for r in ab["rows"]])
    rows.to_csv(layout.root / "ab.csv", index=False)
    text = ["# A/B results", "", "Marks: `-` better, `+` worse, `~` within noise, `!` errors, "
            "`x` not comparable, `?` underpowered (< 5 pairs, no claim). B/A ratios with paired-bootstrap "
            "95 % CIs.", ""]
    text += [markdown(rows) if not rows.empty else "(no comparable rows)", ""]
    text += ["## Runs", "", markdown(frame) if not frame.empty else "(none)", ""]
    for num in ab["numerics"]:
        text += [f"## Numerics {num['cell_id']}", ""]
        text += [f"- {kind.upper()} {item}" for kind in ("ab", "aa") for item in num[kind]] + [""]
    (layout.root / "ab.md").write_text("\n".join(text))
