"""Run-level outputs from files only: summary.json, ab.json, and Markdown/CSV tables (pandas).

`build_report` re-summarizes every run from its files, compares A and B per cell and metric,
and writes the tables; runs whose cell definitions differ are not compared (mark `x`).
"""

from __future__ import annotations

import math
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from deepinfer_harness import SCHEMA_VERSION, __version__
from deepinfer_harness.analysis.ab import (
    CellRuns,
    Samples,
    certificate_lines,
    compare_metric,
    metrics_for,
    numeric_certificate,
    numerics,
)
from deepinfer_harness.analysis.metrics import DEFAULT_PERCENTILES, e2el_ns, tpot_ns, ttft_ns
from deepinfer_harness.analysis.reader import RunReader
from deepinfer_harness.analysis.run_summary import limits_of, write_summary
from deepinfer_harness.analysis.stats import MIN_PAIRS, positive
from deepinfer_harness.cells import parse_cell
from deepinfer_harness.layout import RunKey, RunLayout, read_json, write_json
from deepinfer_harness.metric_table import RUN_COLUMNS, delta_name, per_request_latency
from deepinfer_harness.records import RequestRecord

PM = "±"  # always printed as "mean ± sd (n runs)"


def fmt(x: Any, digits: int = 3) -> str:
    """`digits` significant figures in plain notation (140, 0.085, 4.79, 32,000); an exponent only
    below 0.001, where plain notation would hide the value."""
    if not isinstance(x, int | float) or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    magnitude = math.floor(math.log10(abs(x)))
    if magnitude < -3:
        return f"{x:.{digits}g}"
    return f"{x:.{max(digits - 1 - magnitude, 0)}f}"


def pct(x: Any) -> str:
    return f"{100 * x:.1f} %" if isinstance(x, int | float) and math.isfinite(x) else "n/a"


def markdown(frame: pd.DataFrame) -> str:
    """GitHub table without the optional `tabulate` dependency."""
    cells = [
        [fmt(v, 4) if isinstance(v, float) else ("" if v is None else str(v)) for v in row]
        for row in frame.itertuples(index=False)
    ]
    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    return "\n".join([head, rule, *("| " + " | ".join(c) + " |" for c in cells)])


def side(arm: dict[str, Any]) -> str:
    """`41.2 ± 0.6 (n=2)`: mean ± sd over the arm's valid runs."""
    if arm["estimate"] is None:
        return "n/a"
    sd = f" {PM} {fmt(arm['sd'], 2)}" if arm.get("sd") is not None else ""
    return f"{fmt(arm['estimate'])}{sd} (n={arm['n_valid']})"


def ratio_text(x: Any, digits: int = 3) -> str:
    """A B/A ratio as printed: `0.823` for a positive finite number, else `n/a` (never inf or nan)."""
    return f"{x:.{digits}f}" if positive(x) else "n/a"


def ci_text(row: dict[str, Any]) -> str:
    n = row["n_pairs"]
    pairs = f"{n} pair{'' if n == 1 else 's'}"
    if not (positive(row.get("ci_low")) and positive(row.get("ci_high"))):
        if n >= row.get("min_pairs", MIN_PAIRS):
            return f"{pairs}, no CI"
        return f"{pairs}, no CI below {row.get('min_pairs', MIN_PAIRS)}"
    return f"95% CI {ratio_text(row['ci_low'])}–{ratio_text(row['ci_high'])}, {pairs}"


def pairs_for_delta(row: dict[str, Any]) -> str:
    """Pairs needed for the declared δ, or why there is no such number."""
    if row.get("delta") is None:
        return "— (no δ declared)"
    if row["pairs_needed"] is not None:
        return f"{row['pairs_needed']} (δ {100 * row['delta']:.0f} %)"
    if row.get("aa") is None:
        return "— (no A/A pair)"
    return f"∞: A/A offset ≥ δ {100 * row['delta']:.0f} %"


def ab_line(row: dict[str, Any]) -> str:
    """`decode-i1k-o256-c8  mean_tpot_ms  A 41.2 ± 0.6 (n=6) → B 33.9 ± 0.5 (n=6)  B/A 0.823×
    (95% CI 0.80–0.84, 6 pairs)  -  why` — ± is the sd over valid runs."""
    ratio = f"B/A {ratio_text(row.get('ratio'))}×" if positive(row.get("ratio")) else "B/A n/a"
    return (
        f"{row['cell_id']}  {row['metric']}  A {side(row['a'])} → B {side(row['b'])}  {ratio} "
        f"({ci_text(row)})  {row['mark']}  {row['why']}"
    )


def ttft_samples(reader: RunReader, cell_id: str, keys: list[tuple[str, int]]) -> Samples:
    """Per-request client TTFT (ms) of each run's measured, successful requests."""
    return latency_samples(reader, cell_id, keys, "ttft")


def latency_samples(reader: RunReader, cell_id: str, keys: list[tuple[str, int]], name: str) -> Samples:
    """Per-request values (ms) of one latency (ttft, tpot, e2el) of each run's measured, successful
    requests: the inner level of the two-level percentile bootstrap."""

    def values(r: RequestRecord) -> list[float]:
        v = {"ttft": ttft_ns, "tpot": tpot_ns, "e2el": e2el_ns}[name](r)
        return [] if v is None else [v / 1e6]

    return {k: [x for r in reader.measured_ok(RunKey(cell_id, *k)) for x in values(r)] for k in keys}


def _cells(manifest: dict[str, Any], runs: list[dict[str, Any]], parity_ok: bool) -> list[CellRuns]:
    definitions = {c["cell_id"]: c for c in manifest["cells"]}
    expected = [(s["variant"], s["rep"]) for s in manifest["schedule"]]
    out = []
    for cell_id in sorted(definitions.keys() | {r["cell_id"] for r in runs}):
        cell_runs = {(r["variant"], r["rep"]): r for r in runs if r["cell_id"] == cell_id}
        sha = definitions.get(cell_id, {}).get("definition_sha256")
        same_def = all(r.get("definition_sha256") == sha for r in cell_runs.values())
        # a sweep point's definition is placed from measured rates: its runs must have been sent at
        # one rate (the run's recorded decision, run/sweep.py), or they measure different loads
        same_def = same_def and len(_sweep_rates(cell_id, cell_runs.values())) <= 1
        kind = (
            definitions[cell_id]["kind"] if cell_id in definitions else next(iter(cell_runs.values()))["kind"]
        )
        out.append(CellRuns(cell_id, kind, cell_runs, expected, parity_ok and same_def))
    return out


def _sweep_rates(cell_id: str, runs: Any) -> set[float]:
    """The rates a sweep point's runs were sent at (empty for any other cell)."""
    if not cell_id.startswith("rate-") or not parse_cell(cell_id).is_sweep_point:
        return set()
    return {float(r["offered_rate"]) for r in runs if isinstance(r.get("offered_rate"), int | float)}


def build_report(layout: RunLayout, numerics_tolerances: dict[str, float] | None = None) -> dict[str, Any]:
    """`numerics_tolerances` replaces the run's declared `ab.numerics` (`report --numerics`); the
    certificate then says they were given after the run."""
    manifest = read_json(layout.manifest)
    plan = manifest["profile"].get("plan", {})
    limits = limits_of(manifest["profile"])
    ab_cfg = manifest["profile"]["ab"]
    aa_run = bool(ab_cfg.get("aa"))
    percentiles = tuple(plan.get("percentiles") or DEFAULT_PERCENTILES)
    reader = RunReader(layout)
    runs: list[dict[str, Any]] = []
    for key in layout.keys():
        runs.append(write_summary(reader, key, limits))
    parity = manifest.get("parity") or {}
    cells = _cells(manifest, runs, parity.get("status") == "ok")
    ab: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "aa_run": aa_run,
        "min_pairs": MIN_PAIRS,
        "rows": [],
        "numerics": [],
    }
    for cell in cells:
        if not cell.runs:
            continue
        for metric in metrics_for(cell.kind, list(cell.runs.values()), percentiles):
            delta = ab_cfg["deltas"].get(delta_name(metric))
            name = per_request_latency(metric)
            samples = latency_samples(reader, cell.cell_id, list(cell.runs), name) if name else None
            row = compare_metric(
                cell,
                metric,
                ab_cfg["bootstrap_resamples"],
                ab_cfg["seed"],
                delta,
                samples,
                aa_run,
                lag_rule=limits.get("loop_lag_share") is not None,
            )
            if row:
                row["line"] = ab_line(row)
                ab["rows"].append(row)
        if cell.kind in ("nll", "greedy"):
            ab["numerics"].append(numerics(reader, cell))
    if numerics_tolerances is None:
        ab["numeric_certificate"] = numeric_certificate(ab["numerics"], ab_cfg.get("numerics") or {})
    else:
        ab["numeric_certificate"] = numeric_certificate(ab["numerics"], numerics_tolerances) | {
            "tolerances_declared": "after the run (report --numerics)",
            "tolerances_of_the_run": ab_cfg.get("numerics") or {},
        }
    ab["provenance"] = run_provenance = provenance(manifest)  # ab.json read alone says what ran
    write_json(layout.ab, ab)
    missing = [f"{c.cell_id}/{m}" for c in cells for m in c.missing]
    invalid = [
        {
            "run": f"{r['cell_id']}/{r['variant']}.r{r['rep']}",
            "violations": r["validity"]["violations"],
            # the host was too loaded for the cell's timings and nothing else was wrong: the harness
            # and the server did their part (validity.py lag_violations)
            "host_load_only": all(v.startswith("host load") for v in r["validity"]["violations"]),
            "loop_lag_p99_ms": (r.get("loop_lag") or {}).get("loop_lag_p99_ms"),
        }
        for r in runs
        if not r["validity"]["valid"]
    ]
    summary = {
        "schema_version": SCHEMA_VERSION,
        "run_id": manifest["run_id"],
        "aa_run": aa_run,
        "provenance": run_provenance,
        "runs": runs,
        "n_runs": len(runs),
        "n_expected": len(cells) * len(manifest["schedule"]),
        "missing_runs": missing,
        "invalid_runs": invalid,
        "n_invalid": len(invalid),
        "n_invalid_host_load_only": sum(x["host_load_only"] for x in invalid),
        "marks": _mark_counts(ab["rows"]),
        "ab_lines": [row["line"] for row in ab["rows"]],
        "numeric_certificate": ab["numeric_certificate"],
        "certificate_lines": certificate_lines(ab["numeric_certificate"]),
    }
    if aa_run:
        summary["self_test"] = self_test(summary, ab["rows"])
    summary["acceptance_by_workload"] = acceptance_by_workload(runs)
    summary["rate_sweep"] = rate_sweep(runs)
    if any(r.get("kind") == "rate" for r in runs):
        sweeps = manifest.get("sweeps") or {}
        summary["sweeps"] = sweeps  # the sweep rates the run decided once (run/sweep.py)
        summary["rate_verdicts"] = rate_verdicts(runs, ab["rows"], sweeps)
    spec_cells = spec_decode_by_cell(runs, ab["rows"])
    if spec_cells:
        summary["spec_decode"] = {"by_cell": spec_cells, "by_workload": spec_decode_by_workload(runs)}
    summary["targets"] = targets(summary, parity)
    write_json(layout.summary, summary)
    write_tables(layout, runs, ab, summary)
    return summary


# What a summary read alone must say about each arm (issue 23 defect 6): the build it measured
ARM_FACTS = (
    "label",
    "served_model",
    "vllm_version",
    "engine_version",
    "pip_packages",
    "image",
    "image_digest",
    "image_labels",
    "image_revision",
    "patches",
    "patches_sha256",
    "level",
    "attention_backend",
    "speculative_config",
    "kv_cache",
    "server_info_sha256",
    "system_fingerprint",
    "nvidia_driver_version",
    "gpus",
    "serve_args",
)


def arm_provenance(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per arm, from its first recorded server start (the parity certificate compares the rest)."""
    out: dict[str, dict[str, Any]] = {}
    for variant, facts in sorted((manifest.get("variants") or {}).items()):
        out[variant] = {k: facts.get(k) for k in ARM_FACTS if facts.get(k) is not None}
    return out


def _hardware(harness: dict[str, Any], arms: dict[str, dict[str, Any]]) -> str:
    gpus = sorted({f"{len(a['gpus'])}× {a['gpus'][0].get('name')}" for a in arms.values() if a.get("gpus")})
    servers = ", ".join(gpus) if gpus else "no GPU seen by nvidia-smi (CPU servers)"
    return f"{harness.get('hardware') or 'client unknown'}; servers: {servers}"


def provenance(manifest: dict[str, Any]) -> dict[str, Any]:
    harness = manifest.get("harness", {})
    started = manifest.get("started_at")
    arms = arm_provenance(manifest)
    vllm = sorted({str(a.get("vllm_version")) for a in arms.values() if a.get("vllm_version")})
    return {
        "date": (
            datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds")
            if isinstance(started, int | float)
            else None
        ),
        "git_sha": harness.get("git_sha"),
        "command": harness.get("command"),
        "hardware": harness.get("hardware"),
        "versions": {
            "harness": __version__,
            "python": platform.python_version(),
            "vllm": " / ".join(vllm) or None,
            **harness.get("versions", {}),
        },
        "harness_version": __version__,
        "python": platform.python_version(),
        "profile": manifest["profile"]["name"],
        "model": manifest.get("model"),
        "parity": manifest.get("parity"),
        "labels": manifest["profile"]["labels"],
        "note": manifest.get("note"),
        "variants": arms,
    }


def acceptance_by_workload(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Speculative acceptance per workload and arm over valid decode runs (issue 23 defect 8): the
    counters' acceptance length where the server drafts, else tokens per content event."""
    groups: dict[tuple[str, str], list[float]] = {}
    for r in runs:
        if r.get("kind") != "decode" or not r["validity"]["valid"]:
            continue
        value = r.get("spec_decode_acceptance_length") or r.get("mean_tokens_per_chunk")
        if isinstance(value, int | float) and math.isfinite(value):
            groups.setdefault((parse_cell(r["cell_id"]).workload, r["variant"]), []).append(value)
    out = []
    for workload in sorted({w for w, _ in groups}):
        row: dict[str, Any] = {"workload": workload}
        for v in ("A", "B"):
            vals = groups.get((workload, v), [])
            row[v] = {"mean": sum(vals) / len(vals) if vals else None, "runs": len(vals)}
        out.append(row)
    return out


SATURATION = 0.9  # rate_attainment below 0.9: the run outlasted its schedule by > 10 % (a queue)


def _sweep_line(r: dict[str, Any]) -> tuple[str, float, float, str, str, float] | None:
    """(arrival, burstiness, duration bound, workload, variant, offered rate) of a valid rate run
    with one offered rate (a ramp has none), else None."""
    if r.get("kind") != "rate" or not r["validity"]["valid"]:
        return None
    cell = parse_cell(r["cell_id"])
    rate = r.get("offered_rate", cell.rate)
    rate = math.inf if rate == "inf" else rate
    if cell.ramp or cell.synchronous or not isinstance(rate, int | float) or not rate > 0:
        return None
    return cell.arrival, cell.burstiness, cell.duration_s, cell.workload, r["variant"], float(rate)


def rate_sweep(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The open-loop sweep per arrival process (and burstiness, and duration bound) and arm, by
    offered rate (valid runs, means over reps; a sweep point at the rate its run recorded):
    achieved request rate, goodput, median TTFT and TPOT, rate attainment, and the saturation
    point — the lowest offered rate whose mean rate_attainment is below SATURATION. Ramps have no
    one offered rate and are left out (their A/B rows are in the table)."""
    groups: dict[tuple[str, float, float, str, str, float], list[dict[str, Any]]] = {}
    for r in runs:
        line = _sweep_line(r)
        if line is not None:
            groups.setdefault(line, []).append(r)

    def mean(rows: list[dict[str, Any]], key: str) -> float | None:
        vals = [x[key] for x in rows if isinstance(x.get(key), int | float) and math.isfinite(x[key])]
        return sum(vals) / len(vals) if vals else None

    out = []
    for arrival, burstiness, duration, workload, variant in sorted({k[:5] for k in groups}):
        points = []
        for rate in sorted(
            k[5] for k in groups if k[:5] == (arrival, burstiness, duration, workload, variant)
        ):
            rows = groups[(arrival, burstiness, duration, workload, variant, rate)]
            points.append(
                {
                    "offered_rate": rate,
                    "runs": len(rows),
                    "request_throughput": mean(rows, "request_throughput"),
                    "goodput_req_s": mean(rows, "goodput_req_s"),
                    "median_ttft_ms": mean(rows, "median_ttft_ms"),
                    "mean_tpot_ms": mean(rows, "mean_tpot_ms"),
                    "rate_attainment": mean(rows, "rate_attainment"),
                }
            )
        behind = [
            p["offered_rate"]
            for p in points
            if p["rate_attainment"] is not None and p["rate_attainment"] < SATURATION
        ]
        line = {
            "arrival": arrival,
            "workload": workload,
            "variant": variant,
            "rate_unit": "requests/s",  # offered_rate inf (every request at once) is "inf" in JSON
            "points": points,
            "saturated_at": min(behind) if behind else None,
        }
        if arrival == "gamma":
            line["burstiness"] = burstiness
        if duration:
            line["duration_s"] = duration
        out.append(line)
    return out


# the rows the per-rate A/B verdict shows, in order (each where the cell has it)
RATE_VERDICT_METRICS = (
    "request_throughput",
    "output_throughput",
    "goodput_req_s",
    "median_ttft_ms",
    "mean_tpot_ms",
    "median_e2el_ms",
    "spec_decode_acceptance_length",
)


def rate_verdicts(
    runs: list[dict[str, Any]], rows: list[dict[str, Any]], sweeps: dict[str, Any]
) -> list[dict[str, Any]]:
    """The A/B verdict per offered rate: every rate cell (fixed rates, sweep points, ramps,
    duration-bounded cells), ordered by process, bound and rate, with its offered rate, both arms'
    achieved request rate and the ratio, CI and mark of each of RATE_VERDICT_METRICS."""
    by_cell: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_cell.setdefault(row["cell_id"], {})[row["metric"]] = row
    rates: dict[str, list[float]] = {}
    for r in runs:
        value = r.get("offered_rate")
        if r.get("kind") == "rate" and isinstance(value, int | float) and r["validity"]["valid"]:
            rates.setdefault(r["cell_id"], []).append(float(value))
    out = []
    for cell_id in sorted({r["cell_id"] for r in runs if r.get("kind") == "rate"}):
        cell = parse_cell(cell_id)
        offered = rates.get(cell_id) or []
        if cell.is_sweep_point:
            decision = sweeps.get(
                str(next((r.get("sweep_probe") for r in runs if r["cell_id"] == cell_id), ""))
            )
            recorded = (decision or {}).get("rates", {}).get(cell_id)
            rate = recorded if recorded is not None else (offered[0] if offered else None)
        else:
            rate = None if cell.ramp or cell.synchronous else cell.rate
        cell_rows = by_cell.get(cell_id, {})
        throughput = cell_rows.get("request_throughput")
        out.append(
            {
                "cell_id": cell_id,
                "arrival": cell.arrival,
                "burstiness": cell.burstiness if cell.arrival == "gamma" else None,
                "bound": "duration" if cell.duration_s else "count",
                "duration_s": cell.duration_s or None,
                "ramp": (
                    {"strategy": cell.ramp, "start_rps": cell.rate, "end_rps": cell.ramp_end}
                    if cell.ramp
                    else None
                ),
                "sweep_point": f"{cell.sweep_k}/{cell.sweep_of}" if cell.is_sweep_point else None,
                "offered_rate": rate,
                "rate_unit": "requests/s",
                "achieved": {  # request_throughput, mean over the arm's valid runs
                    v: throughput[v.lower()]["estimate"] if throughput else None for v in ("A", "B")
                },
                "verdict": {
                    m: {k: cell_rows[m][k] for k in ("ratio", "ci_low", "ci_high", "n_pairs", "mark", "why")}
                    for m in RATE_VERDICT_METRICS
                    if m in cell_rows
                },
            }
        )

    def order(v: dict[str, Any]) -> tuple:
        rate = v["offered_rate"] if isinstance(v["offered_rate"], int | float) else math.inf
        return (v["arrival"], v["burstiness"] or 0.0, v["duration_s"] or 0.0, v["ramp"] is not None, rate)

    return sorted(out, key=order)


def spec_decode_by_cell(runs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Speculative decoding per cell, A vs B, next to tokens/s: each arm's mean acceptance length
    (1 + Δaccepted/Δdrafts) and acceptance rate (% of drafted tokens kept) over its valid runs, its
    tokens/s (decode_tok_s in a decode cell, output_throughput elsewhere), and the A/B rows' ratio
    and mark. Only cells whose runs carry the spec-decode counters (a server that drafts)."""
    marks = {(r["cell_id"], r["metric"]): r for r in rows}
    cells: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        if r["validity"]["valid"] and isinstance(r.get("spec_decode_acceptance_length"), int | float):
            cells.setdefault(r["cell_id"], []).append(r)
    out = []
    for cell_id, cell_runs in sorted(cells.items()):
        kind = cell_runs[0]["kind"]
        speed = "decode_tok_s" if kind == "decode" else "output_throughput"
        entry: dict[str, Any] = {"cell_id": cell_id, "kind": kind, "tokens_per_s_metric": speed}
        for v in ("A", "B"):
            mine = [r for r in cell_runs if r["variant"] == v]
            entry[v] = {
                "runs": len(mine),
                "tokens_per_s": _mean_of(mine, speed),
                "acceptance_length": _mean_of(mine, "spec_decode_acceptance_length"),
                "acceptance_rate_pct": _mean_of(mine, "spec_decode_acceptance_rate"),
            }
        for metric in (speed, "spec_decode_acceptance_length", "spec_decode_acceptance_rate"):
            row = marks.get((cell_id, metric))
            entry[f"{metric}_ab"] = {"ratio": row["ratio"], "mark": row["mark"]} if row else None
        out.append(entry)
    return out


def spec_decode_by_workload(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Speculative decoding per workload and arm, pooled over the valid runs of every kind that
    drafts: acceptance length 1 + Σaccepted/Σdrafts and rate Σaccepted/Σdraft tokens (the counter
    sums, so a long run weighs by its drafts, not as one run), with the per-cell kinds it pools."""
    sums: dict[tuple[str, str], dict[str, float]] = {}
    kinds: dict[str, set[str]] = {}
    for r in runs:
        drafts = r.get("spec_decode_num_drafts")
        if not r["validity"]["valid"] or not isinstance(drafts, int | float) or drafts <= 0:
            continue
        workload = parse_cell(r["cell_id"]).workload
        acc = sums.setdefault((workload, r["variant"]), {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0})
        acc["drafts"] += drafts
        acc["draft_tokens"] += r.get("spec_decode_draft_tokens") or 0.0
        acc["accepted"] += r.get("spec_decode_accepted_tokens") or 0.0
        kinds.setdefault(workload, set()).add(r["kind"])
    out = []
    for workload in sorted(kinds):
        row: dict[str, Any] = {"workload": workload, "kinds": sorted(kinds[workload])}
        for v in ("A", "B"):
            acc = sums.get((workload, v))
            row[v] = (
                {
                    "acceptance_length": 1 + acc["accepted"] / acc["drafts"],
                    "acceptance_rate_pct": (
                        100 * acc["accepted"] / acc["draft_tokens"] if acc["draft_tokens"] else None
                    ),
                    "drafts": acc["drafts"],
                }
                if acc
                else None
            )
        out.append(row)
    return out


def _mean_of(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [x[key] for x in rows if isinstance(x.get(key), int | float) and math.isfinite(x[key])]
    return sum(vals) / len(vals) if vals else None


def targets(summary: dict[str, Any], parity: dict[str, Any]) -> list[dict[str, Any]]:
    """What this run set out to show, measured (results/ target shape: met is a bool, a target not
    met names its cause): every run present and valid, the arms' parity certificate clean, and each
    numerics check whose tolerance the profile declared."""

    def row(name: str, measured: Any, goal: float, unit: str, direction: str, cause: str) -> dict[str, Any]:
        met = measured is not None and (measured <= goal if direction == "<=" else measured >= goal)
        out = {"name": name, "measured": measured, "goal": goal, "unit": unit, "direction": direction}
        return (
            out | {"met": met} | ({} if met else {"cause": cause if measured is not None else "not measured"})
        )

    diffs = parity.get("diffs") if parity else None
    out = [
        row("runs present", summary["n_runs"], summary["n_expected"], "runs", ">=", "runs missing (resume)"),
        row("invalid runs", summary["n_invalid"], 0, "runs", "<=", "see invalid_runs"),
        row(
            "arm parity differences (versions, flags, env)",
            None if diffs is None else len(diffs),
            0,
            "items",
            "<=",
            "see provenance.parity.diffs",
        ),
    ]
    for c in summary["numeric_certificate"]["checks"]:
        if c["goal"] is not None:
            name = f"A/B {c['metric']} {c['cell_id']}"
            out.append(
                row(name, c["measured"], c["goal"], c["unit"], c["direction"], "outside the tolerance")
            )
    return out


def _mark_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["mark"]] = counts.get(row["mark"], 0) + 1
    return dict(sorted(counts.items()))


def headline(summary: dict[str, Any]) -> str:
    """One line for the end of a run: A/A or A/B, runs done of expected, invalid, missing, marks."""
    kind = "A/A (both arms the same build: differences are noise)" if summary["aa_run"] else "A/B"
    marks = " ".join(f"{k}×{v}" for k, v in summary["marks"].items()) or "none"
    return (
        f"{kind}: {summary['n_runs']} of {summary['n_expected']} runs, {summary['n_invalid']} invalid"
        f"{host_load_note(summary)}, {len(summary['missing_runs'])} missing; marks {marks}"
    )


def self_test(
    summary: dict[str, Any], rows: list[dict[str, Any]], missing_cause: str | None = None
) -> dict[str, Any]:
    """A declared A/A run is the harness's self-test: both arms are one build, so it passes when
    every run is present and valid and no row claims or flags anything (every row ~ or ?); a
    numeric parity certificate counts only where tolerances were declared (status ok or failed).
    `missing_cause`: why runs are missing, where the caller knows (bench-ab's session outcome);
    without it the first missing run is named. Returns {"passed": bool, "line": one sentence
    naming what failed}."""
    failed = []
    if summary["n_invalid"]:
        first = summary["invalid_runs"][0]
        why = (first["violations"] or ["?"])[0]
        failed.append(f"{summary['n_invalid']} runs invalid (first: {first['run']}: {why})")
    if summary["missing_runs"]:
        why = missing_cause or f"first: {summary['missing_runs'][0]}"
        failed.append(f"{len(summary['missing_runs'])} runs missing ({why})")
    for mark, word in (("!", "flagged"), ("x", "not comparable"), ("-", "better"), ("+", "worse")):
        hit = [r for r in rows if r["mark"] == mark]
        if hit:
            failed.append(f"{len(hit)} rows {word} ({mark}; first: {hit[0]['cell_id']} {hit[0]['metric']})")
    if (summary.get("numeric_certificate") or {}).get("status") == "failed":
        failed.append("the numeric parity certificate failed")
    n = summary["n_expected"]
    if failed:
        return {"passed": False, "line": f"self-test (A/A): FAILED: {'; '.join(failed)}"}
    return {
        "passed": True,
        "line": f"self-test (A/A): passed: {n} of {n} runs valid, no row claims or flags a difference",
    }


def host_load_note(summary: dict[str, Any]) -> str:
    """` (K for host load alone: client lag p99 up to X ms)` where K > 0: those runs' timings were
    distorted by this host, not by the harness or the server; '' otherwise (and for old summaries)."""
    loaded = [x for x in summary.get("invalid_runs", []) if x.get("host_load_only")]
    if not loaded:
        return ""
    lags = [v for x in loaded if isinstance(v := x.get("loop_lag_p99_ms"), int | float)]
    worst = f": client lag p99 up to {max(lags):.2f} ms" if lags else ""
    return f" ({len(loaded)} for host load alone{worst})"


CLAIMS = (("-", "better"), ("+", "worse"))


def stdout_summary(summary: dict[str, Any], root: Path) -> list[str]:
    """What a run prints on stdout: the headline, every row that claims better or worse, one line
    per cell with invalid or missing runs or without comparability, the counts of the rest, the
    certificate's verdict and where every row is (ab.md); never one line per row."""
    rows = read_json(root / "ab.json")["rows"]
    lines = [headline(summary)]
    if summary.get("self_test"):
        lines.insert(0, summary["self_test"]["line"])
    for mark, word in CLAIMS:
        claimed = [r for r in rows if r["mark"] == mark]
        if claimed:
            lines.append(f"{word} ({mark}): {len(claimed)} row{'s' if len(claimed) != 1 else ''}")
            lines += [f"  {r['line']}" for r in claimed]
    for mark, word in (("!", "invalid or missing runs"), ("x", "not comparable")):
        cells: dict[str, str] = {}
        for r in rows:
            if r["mark"] == mark:
                cells.setdefault(r["cell_id"], r["why"])
        lines += [f"{word} ({mark}): {cell}: {why}" for cell, why in cells.items()]
    rest = [
        f"{sum(1 for r in rows if r['mark'] == m)} {word} ({m})"
        for m, word in (("~", "within noise"), ("?", "no claim possible"))
        if any(r["mark"] == m for r in rows)
    ]
    if rest:
        lines.append("other rows: " + ", ".join(rest))
    cert = summary.get("numeric_certificate") or {}
    if cert.get("checks") and summary.get("aa_run") and cert["status"] == "incomplete":
        lines.append("numeric parity certificate: not judged (an A/A declares no tolerance)")
    elif cert.get("checks"):
        lines.append(f"numeric parity certificate: {cert['status']}")
    lines.append(f"every row ({len(rows)}): {root / 'ab.md'}; everything: {root / 'summary.json'}")
    return lines


def _scalars(item: dict[str, Any]) -> dict[str, Any]:
    """A numerics pair without its per-document detail (the table below it has that)."""
    return {k: v for k, v in item.items() if not isinstance(v, dict | list)}


def _document_table(num: dict[str, Any]) -> list[str]:
    """Per document and pair: the signed mean of NLL_B,t − NLL_A,t, its SD over positions, SE and
    z = mean/SE (the `nll_doc_z` rule), beside |mean| (the `nll_doc_abs` rule)."""
    rows = [
        {
            "pair": f"{kind.upper()} {item['pair']}",
            "doc": doc["index"],
            "positions": doc["positions"],
            "ΔNLL mean (B − A)": doc["dnll_mean"],
            "SD": doc["dnll_sd"],
            "SE": doc["se"],
            "z": "" if doc["z"] is None else f"{doc['z']:+.3g}",  # ±inf: every position moved alike
        }
        for kind in ("ab", "aa")
        for item in num[kind]
        for doc in item.get("documents", [])
    ]
    if not rows:
        return []
    return [
        "Per document (nats/token; z = mean / SE, SE = SD/√positions):",
        "",
        markdown(pd.DataFrame(rows)),
        "",
    ]


def _process(line: dict[str, Any], each: str = " each") -> str:
    """`poisson`, `gamma (burstiness 0.5)`, `constant, 60 s each`: a sweep line's process and bound."""
    text = str(line["arrival"])
    if line.get("burstiness") is not None:
        burst = line["burstiness"]
        text += f" (burstiness {fmt(burst) if math.isfinite(burst) else 'inf'})"
    return text + (f", {fmt(line['duration_s'])} s{each}" if line.get("duration_s") else "")


def _verdict_text(v: dict[str, Any] | None) -> str:
    """`0.912× -` (ratio and mark), or `—` where the cell has no such row."""
    if not v:
        return "—"
    return f"{ratio_text(v['ratio'])}× `{v['mark']}`"


def _rate_verdict_lines(summary: dict[str, Any]) -> list[str]:
    """ab.md: the A/B verdict per offered rate (every rate cell; sweep points at their recorded
    rates, with the probe's measured maximum above them)."""
    verdicts = summary.get("rate_verdicts") or []
    if not verdicts:
        return []
    lines = ["## A/B by offered rate", ""]
    for probe, d in sorted((summary.get("sweeps") or {}).items()):
        points = ", ".join(f"{cid} {fmt(r)}/s" for cid, r in d["rates"].items() if r is not None)
        if d.get("sync_rate") is not None:  # GuideLLM's anchor (run/sweep.py)
            lines.append(
                f"Sweep: {d['sync_cell']} ({d['sync_run']}) completed S = {fmt(d['sync_rate'])} "
                f"requests/s one at a time, {probe} ({d['probe_run']}) T = {fmt(d['max_rate'])} all "
                f"at once; point k/N is sent at S + k/N·(T − S): {points}."
                + (f" {d['note']}." if d.get("note") else "")
            )
        else:  # the former anchor, in runs recorded with it
            lines.append(
                f"Sweep: {probe} ({d['probe_run']}) completed {fmt(d['max_rate'])} requests/s; point k/N "
                f"is sent at k/N of that: {points}."
            )
    if summary.get("sweeps"):
        lines.append("")
    rows = []
    for v in verdicts:
        if v["ramp"]:
            offered = f"{v['ramp']['strategy']} {fmt(v['ramp']['start_rps'])}→{fmt(v['ramp']['end_rps'])}"
        elif isinstance(v["offered_rate"], int | float):
            offered = fmt(v["offered_rate"]) if math.isfinite(v["offered_rate"]) else "all at once"
        elif parse_cell(v["cell_id"]).synchronous:
            offered = "one at a time"
        else:
            offered = "not decided"
        rows.append(
            {
                "offered req/s": offered,
                "process": _process(v, each=""),
                "cell": v["cell_id"],
                "A req/s": fmt(v["achieved"]["A"]),
                "B req/s": fmt(v["achieved"]["B"]),
                **{
                    f"B/A {m}": _verdict_text(v["verdict"].get(m))
                    for m in ("request_throughput", "goodput_req_s", "median_ttft_ms", "mean_tpot_ms")
                },
            }
        )
    lines += [markdown(pd.DataFrame(rows)), ""]
    lines += ["Each ratio's CI and reason are on its row in the table above (marks as there).", ""]
    return lines


def _spec_decode_lines(summary: dict[str, Any]) -> list[str]:
    """ab.md: acceptance length and rate per cell and per workload, A vs B, next to tokens/s."""
    spec = summary.get("spec_decode")
    if not spec:
        return []
    rows = [
        {
            "cell": c["cell_id"],
            "tok/s A": fmt(c["A"]["tokens_per_s"]),
            "tok/s B": fmt(c["B"]["tokens_per_s"]),
            "tok/s B/A": _verdict_text(c[f"{c['tokens_per_s_metric']}_ab"]),
            "accept len A": fmt(c["A"]["acceptance_length"]),
            "accept len B": fmt(c["B"]["acceptance_length"]),
            "len B/A": _verdict_text(c["spec_decode_acceptance_length_ab"]),
            "accept % A": fmt(c["A"]["acceptance_rate_pct"]),
            "accept % B": fmt(c["B"]["acceptance_rate_pct"]),
            "% B/A": _verdict_text(c["spec_decode_acceptance_rate_ab"]),
        }
        for c in spec["by_cell"]
    ]
    lines = [
        "## Speculative decoding",
        "",
        "Acceptance length = 1 + Δaccepted / Δdrafts, acceptance rate = Δaccepted / Δdraft tokens "
        "(vLLM's vllm:spec_decode_* counters, scraped before and after each run); tok/s is "
        "decode_tok_s in a decode cell, output_throughput elsewhere; means over valid runs.",
        "",
        markdown(pd.DataFrame(rows)),
        "",
    ]
    for w in spec["by_workload"]:
        arms = [
            f"{v} {fmt(w[v]['acceptance_length'])} tokens/step, {fmt(w[v]['acceptance_rate_pct'])} % kept"
            if w[v]
            else f"{v} n/a"
            for v in ("A", "B")
        ]
        lines.append(f"- {w['workload']} ({', '.join(w['kinds'])}): {'; '.join(arms)}")
    return [*lines, ""]


def write_tables(
    layout: RunLayout, runs: list[dict[str, Any]], ab: dict[str, Any], summary: dict[str, Any]
) -> None:
    frame = pd.DataFrame(
        [
            {**{k: r.get(k) for k in RUN_COLUMNS if k != "valid"}, "valid": r["validity"]["valid"]}
            for r in runs
        ],
        columns=RUN_COLUMNS,
    )
    frame.to_csv(layout.root / "runs.csv", index=False)
    flat = pd.DataFrame(
        [
            {
                "cell_id": r["cell_id"],
                "metric": r["metric"],
                "a_mean": r["a"]["estimate"],
                "a_sd": r["a"]["sd"],
                "a_n": r["a"]["n_valid"],
                "b_mean": r["b"]["estimate"],
                "b_sd": r["b"]["sd"],
                "b_n": r["b"]["n_valid"],
                "ratio": r["ratio"],
                "ci_low": r["ci_low"],
                "ci_high": r["ci_high"],
                "n_pairs": r["n_pairs"],
                "aa_pairs": (r["aa"] or {}).get("n_pairs", 0),
                "noise_floor": r["noise_floor"],
                "mde": r["mde"],
                "pairs_needed": r["pairs_needed"],
                "mark": r["mark"],
                "why": r["why"],
            }
            for r in ab["rows"]
        ]
    )
    flat.to_csv(layout.root / "ab.csv", index=False)
    table = pd.DataFrame(
        [
            {
                "cell": r["cell_id"],
                "metric": r["metric"],
                f"A mean {PM} sd (n)": side(r["a"]),
                f"B mean {PM} sd (n)": side(r["b"]),
                "B/A": ratio_text(r["ratio"]),
                "95 % CI": (
                    f"{ratio_text(r['ci_low'])}–{ratio_text(r['ci_high'])}" if positive(r["ci_low"]) else "—"
                ),
                "pairs": r["n_pairs"],
                "A/A floor (pairs)": (f"{pct(r['noise_floor'])} ({r['aa']['n_pairs']})" if r["aa"] else "—"),
                "MDE": pct(r["mde"]),
                "pairs for δ": pairs_for_delta(r),
                "mark": f"`{r['mark']}`",
                "why": r["why"],
            }
            for r in ab["rows"]
        ]
    )
    run_kind = (
        "**A/A run**: both arms launch the same build, so no row is marked better or worse; the "
        "table measures the noise this setup produces."
        if ab["aa_run"]
        else "**A/B run.**"
    )
    text = [
        "# A/B results",
        "",
        headline(summary),
        "",
        run_kind,
        "",
        "Marks: `-` better, `+` worse, `~` within noise, `!` invalid or missing runs in the cell (only "
        "that), `x` not comparable (parity or definitions), `?` no claim possible (fewer than "
        f"{MIN_PAIRS} valid pairs, no A/A pair, or no defined B/A: a value of 0, inf or NaN in one arm, "
        "or missing; the row names those pairs). "
        f"`{PM}` is the standard deviation over the arm's "
        f"valid runs and n their count; invalid runs are never averaged in. B/A = exp(mean ln(B/A)) "
        f"over valid (A rep k, B rep k) pairs; 95 % CIs are paired-bootstrap and printed only from "
        f"{MIN_PAIRS} pairs. A/A floor = |mean A/A log-ratio| + t·sd/√n over the A/A pairs (same "
        "build, consecutive sessions), so session drift counts; MDE = max(floor, 2.8·σ/√pairs) with "
        "σ the RMS A/A log-ratio; pairs for δ = (2.8·σ/ln(1+δ))² for the δ declared per metric.",
        "",
    ]
    text += [markdown(table) if not table.empty else "(no comparable rows)", ""]
    text += ["## Invalid runs", ""]
    if note := host_load_note(summary):
        text += [
            f"{summary['n_invalid']} invalid{note}: those timings measure this host, not A or B.",
            "",
        ]
    text += [f"- {x['run']}: {'; '.join(x['violations'][:4])}" for x in summary["invalid_runs"]] or ["(none)"]
    text += ["", "## Missing runs", ""]
    text += [f"- {m}" for m in summary["missing_runs"]] or ["(none)"]
    text += ["", "## Runs", "", markdown(frame) if not frame.empty else "(none)", ""]
    text += ["## Acceptance by workload", ""]
    text += [
        f"- {w['workload']}: A {fmt(w['A']['mean'])} ({w['A']['runs']} runs), B {fmt(w['B']['mean'])} "
        f"({w['B']['runs']} runs) tokens per step"
        for w in summary.get("acceptance_by_workload", [])
    ] or ["(no valid decode run)"]
    text += [""]
    if summary.get("rate_sweep"):
        text += ["## Open-loop rate sweep", ""]
        for sweep in summary["rate_sweep"]:
            sat = sweep["saturated_at"]
            text += [
                f"- {sweep['variant']} {_process(sweep)} ({sweep['workload']}): "
                + ", ".join(
                    f"{p['offered_rate']:g}/s → {fmt(p['request_throughput'])}/s"
                    + (f" (goodput {fmt(p['goodput_req_s'])}/s)" if p["goodput_req_s"] is not None else "")
                    for p in sweep["points"]
                )
                + (
                    f"; falls behind its schedule (rate attainment < {SATURATION:g}) from {sat:g}/s"
                    if sat
                    else ""
                )
            ]
        text += [""]
    text += _rate_verdict_lines(summary)
    text += _spec_decode_lines(summary)
    text += ["## Numeric parity certificate", ""]
    text += certificate_lines(ab["numeric_certificate"]) or ["(no NLL or greedy cell)"]
    text += [""]
    for num in ab["numerics"]:
        text += [f"## Numerics {num['cell_id']}", ""]
        text += [f"- {kind.upper()} {_scalars(item)}" for kind in ("ab", "aa") for item in num[kind]] + [""]
        if num["kind"] == "nll":
            text += _document_table(num)
    (layout.root / "ab.md").write_text("\n".join(text))
