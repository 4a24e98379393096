"""`compare RUN RUN …`: runs of different profiles or topologies side by side, from their files.

Each run directory is read as its report left it (summary.json; manifest.json for the profile and
topology; ab.json for the run's own A/B rows), nothing in it is written. For every cell and metric
the A/B analysis compares (ab.metrics_for, the same keys `report` compares), one line per run:

- each arm's mean over its valid runs with a 95 % t interval (intervals.mean_ci);
- the run's own A/B verdict, unchanged from its ab.json: paired B/A, its bootstrap CI, the mark
  and why (ab.compare_metric; an A/A run's rows say A/A);
- against the first run given (the reference), each arm's ratio of geometric means with a Welch
  t interval (intervals.welch_ratio). Two run directories are other sessions, maybe other
  machines: nothing pairs their runs and no A/A floor spans them, so this ratio gets no mark.

`--out DIR` also writes compare.json (strict JSON), compare.md (what stdout shows) and the charts:
04 end-to-end output throughput per workload and concurrency, grouped bars per run and arm,
05 scaling across topologies (total and per-GPU throughput by GPU count = tp × pp of each run's
profile), and 06 latency vs rate across runs (the median TTFT, TPOT, ITL and E2EL of every rate
cell at its measured rate, one line per run, arm and open-loop shape), each skipped with one line
when the runs have nothing it could draw.

Sweep points are joined by the rate they were sent at, not by their id: `r2of5sweep` of one run
and of another are different loads (each run measured its own anchors). A sweep point's row is
keyed `<family> @ <rate>/s` (the first run's recorded rate); another run's point of the same
family joins it when its recorded rate is within RATE_JOIN (relative) of that rate, and otherwise
starts a row of its own. Every entry keeps its own `cell_id` and `rate`.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from deepinfer_harness import SCHEMA_VERSION
from deepinfer_harness.analysis.ab import metrics_for
from deepinfer_harness.analysis.intervals import IndependentRatio, MeanCI, mean_ci, welch_ratio
from deepinfer_harness.analysis.metrics import DEFAULT_PERCENTILES
from deepinfer_harness.analysis.report import fmt, markdown, ratio_text
from deepinfer_harness.analysis.stats import positive
from deepinfer_harness.config import ConfigError
from deepinfer_harness.layout import read_json, write_json
from deepinfer_harness.strict_json import numbers

ARMS = ("A", "B")
RATE_JOIN = 0.05  # sweep points of two runs are one row when their recorded rates differ by <= 5 %
THROUGHPUT = "output_throughput"  # charts 04 and 05: output tokens / (last end − first send)


@dataclass(frozen=True)
class Run:
    """One reported run directory."""

    path: Path
    name: str
    summary: dict[str, Any]
    manifest: dict[str, Any]
    ab: dict[str, Any]

    @property
    def provenance(self) -> dict[str, Any]:
        return self.summary.get("provenance") or {}

    @property
    def labels(self) -> dict[str, str]:
        given = self.provenance.get("labels") or (self.manifest.get("profile") or {}).get("labels") or {}
        return {v: str(given.get(v, v)) for v in ARMS}

    @property
    def profile(self) -> str:
        return str(self.provenance.get("profile") or (self.manifest.get("profile") or {}).get("name") or "?")

    @property
    def topology(self) -> tuple[int, int] | None:
        """(tp, pp) from the profile the run recorded; None when the manifest does not say."""
        topo = (self.manifest.get("profile") or {}).get("topology") or {}
        tp, pp = topo.get("tp"), topo.get("pp")
        if isinstance(tp, int) and isinstance(pp, int) and tp >= 1 and pp >= 1:
            return tp, pp
        return None

    @property
    def gpus(self) -> int | None:
        """GPUs one arm's server uses: tp × pp (vLLM places one rank per GPU)."""
        return self.topology[0] * self.topology[1] if self.topology else None

    @property
    def topology_text(self) -> str:
        return f"TP{self.topology[0]}×PP{self.topology[1]}" if self.topology else "topology unknown"

    @property
    def devices(self) -> str:
        """What nvidia-smi showed the servers (the first arm that recorded it)."""
        arms = self.provenance.get("variants") or self.manifest.get("variants") or {}
        for v in ARMS:
            gpus = (arms.get(v) or {}).get("gpus")
            if gpus:
                return f"{len(gpus)}× {gpus[0].get('name', 'GPU')}"
        return "no GPU seen (CPU servers)" if arms else "not recorded"

    @property
    def aa_run(self) -> bool:
        return bool(self.summary.get("aa_run"))

    @property
    def percentiles(self) -> tuple[float, ...]:
        plan = (self.manifest.get("profile") or {}).get("plan") or {}
        return tuple(plan.get("percentiles") or DEFAULT_PERCENTILES)

    def valid(self) -> list[dict[str, Any]]:
        return [numbers(r) for r in self.summary["runs"] if (r.get("validity") or {}).get("valid")]

    def facts(self) -> dict[str, Any]:
        cert = self.summary.get("numeric_certificate") or self.ab.get("numeric_certificate") or {}
        return {
            "run": self.name,
            "path": str(self.path),
            "profile": self.profile,
            "labels": self.labels,
            "tp": self.topology[0] if self.topology else None,
            "pp": self.topology[1] if self.topology else None,
            "gpus": self.gpus,
            "devices": self.devices,
            "aa_run": self.aa_run,
            "runs": len(self.summary["runs"]),
            "valid_runs": len(self.valid()),
            "certificate": cert.get("status"),
            "date": self.provenance.get("date"),
            "git_sha": self.provenance.get("git_sha"),
        }


def _read(path: Path, what: str) -> Any:
    try:
        return read_json(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc}") from exc


def load_run(path: Path, name: str) -> Run:
    """One run directory, or a one-line ConfigError naming what is missing."""
    if not path.is_dir():
        raise ConfigError(f"{path}: no such run directory")
    if not (path / "summary.json").is_file():
        raise ConfigError(f"{path}: no summary.json (not a reported run: `report {path}` derives it)")
    summary = _read(path / "summary.json", "summary.json")
    if not isinstance(summary, dict) or not isinstance(summary.get("runs"), list):
        raise ConfigError(f"{path}/summary.json: not a harness run summary (no runs list)")
    manifest = _read(path / "manifest.json", "manifest.json") if (path / "manifest.json").is_file() else {}
    ab = _read(path / "ab.json", "ab.json") if (path / "ab.json").is_file() else {}
    return Run(path, name, summary, manifest, ab)


def load_runs(paths: list[str]) -> list[Run]:
    if len(paths) < 2:
        raise ConfigError(f"compare needs at least two run directories, got {len(paths)}")
    resolved = [Path(p).resolve() for p in paths]
    twice = sorted({str(p) for p in resolved if resolved.count(p) > 1})
    if twice:
        raise ConfigError(f"run directory given more than once: {', '.join(twice)}")
    names = [Path(p).name or str(p) for p in paths]
    if len(set(names)) < len(names):  # same directory name under different parents
        names = [str(p) for p in paths]
    return [load_run(Path(p), n) for p, n in zip(paths, names, strict=True)]


def _arm(ci: MeanCI | None) -> dict[str, Any] | None:
    if ci is None:
        return None
    return {"mean": ci.mean, "ci_low": ci.low, "ci_high": ci.high, "n": ci.n}


def _vs(r: IndependentRatio | None) -> dict[str, Any] | None:
    if r is None:
        return None
    return {
        "ratio": r.ratio,
        "ci_low": r.low,
        "ci_high": r.high,
        "n_ref": r.n_ref,
        "n": r.n_other,
        "method": r.method,
    }


def _wanted(value: str, patterns: list[str] | None) -> bool:
    return not patterns or any(fnmatch.fnmatchcase(value, p) for p in patterns)


def _sweep_rate(group: list[dict[str, Any]]) -> float | None:
    """The rate a sweep point's valid runs were sent at (their mean: the report marks a point
    sent at different rates `x`), None when none recorded one."""
    rates = [float(r["offered_rate"]) for r in group if positive(r.get("offered_rate"))]
    return sum(rates) / len(rates) if rates else None


def join_keys(runs: list[Run]) -> list[dict[str, str]]:
    """Per run: cell id → the row key it joins. Every cell joins its own id, except a sweep
    point, which joins `<family> @ <rate>/s`: the row of an earlier run's point of the same family
    whose recorded rate is within RATE_JOIN of its own, else a new row at its own rate."""
    from deepinfer_harness.analysis.charts import rate_series
    from deepinfer_harness.cells import parse_cell

    placed: list[tuple[str, float, str]] = []  # (family, rate, key)
    out = []
    for run in runs:
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in run.valid():
            groups.setdefault(str(r["cell_id"]), []).append(r)
        keys: dict[str, str] = {}
        taken: set[str] = set()
        for cell_id in sorted(groups):
            keys[cell_id] = cell_id
            if not cell_id.startswith("rate-") or not parse_cell(cell_id).is_sweep_point:
                continue
            family, rate = rate_series(cell_id), _sweep_rate(groups[cell_id])
            if family is None or rate is None:
                continue
            near = [
                k for f, x, k in placed if f == family and abs(rate / x - 1) <= RATE_JOIN and k not in taken
            ]
            key = near[0] if near else f"rate-{family} @ {rate:.4g}/s"
            if not near:
                placed.append((family, rate, key))
            keys[cell_id] = key
            taken.add(key)
        out.append(keys)
    return out


def compare_rows(
    runs: list[Run], cells: list[str] | None = None, metrics: list[str] | None = None
) -> list[dict[str, Any]]:
    """One row per (cell, metric) any run measured, in the runs' order of cells; each row holds
    one entry per run (see the module docstring); sweep points are joined by measured rate."""
    by_run: list[dict[str, list[dict[str, Any]]]] = []
    ids_of: list[dict[str, str]] = []  # per run: row key → its own cell id
    for run, keys in zip(runs, join_keys(runs), strict=True):
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in run.valid():
            if _wanted(str(r["cell_id"]), cells):
                groups.setdefault(keys[str(r["cell_id"])], []).append(r)
        by_run.append(groups)
        ids_of.append({k: str(g[0]["cell_id"]) for k, g in groups.items()})
    keys: list[tuple[str, str]] = []
    for run, groups in zip(runs, by_run, strict=True):
        for cell_id in sorted(groups):
            kind = str(groups[cell_id][0].get("kind"))
            for metric in metrics_for(kind, groups[cell_id], run.percentiles):
                if _wanted(metric, metrics) and (cell_id, metric) not in keys:
                    keys.append((cell_id, metric))
    verdicts = [{(r["cell_id"], r["metric"]): r for r in run.ab.get("rows", [])} for run in runs]
    rows = []
    for cell_id, metric in keys:
        entries = []
        for k, (run, groups) in enumerate(zip(runs, by_run, strict=True)):
            values = {v: [r.get(metric) for r in groups.get(cell_id, []) if r["variant"] == v] for v in ARMS}
            arms = {v: mean_ci(values[v]) for v in ARMS}
            if not any(arms.values()):
                entries.append({"run": run.name, "present": False})
                continue
            entry: dict[str, Any] = {"run": run.name, "present": True}
            own = ids_of[k][cell_id]
            if own != cell_id:  # a sweep point joined by its measured rate
                entry |= {"cell_id": own, "rate": _sweep_rate(groups[cell_id])}
            entry |= {v: _arm(arms[v]) for v in ARMS}
            ab = verdicts[k].get((own, metric))
            entry["ab"] = (
                {x: numbers(ab.get(x)) for x in ("ratio", "ci_low", "ci_high", "n_pairs", "mark", "why")}
                if ab
                else None
            )
            if k > 0:
                ref = by_run[0].get(cell_id, [])
                entry["vs_reference"] = {
                    v: _vs(welch_ratio([r.get(metric) for r in ref if r["variant"] == v], values[v]))
                    for v in ARMS
                }
            entries.append(entry)
        if any(e["present"] for e in entries):
            rows.append({"cell_id": cell_id, "metric": metric, "runs": entries})
    return rows


def closed_loop_frame(runs: list[Run]) -> pd.DataFrame:
    """Every valid closed-loop run summary of every run, for charts 04 and 05."""
    from deepinfer_harness.analysis.charts import CLOSED_LOOP, closed_loop_series

    out = []
    for run in runs:
        for r in run.valid():
            if r.get("kind") in CLOSED_LOOP:
                out.append(
                    {
                        "run": run.name,
                        "gpus": run.gpus,
                        "topology": run.topology_text,
                        "variant": r["variant"],
                        "series": closed_loop_series(str(r["cell_id"])),
                        "concurrency": r.get("concurrency"),
                        THROUGHPUT: r.get(THROUGHPUT),
                    }
                )
    return pd.DataFrame(
        out, columns=["run", "gpus", "topology", "variant", "series", "concurrency", THROUGHPUT]
    )


def _has(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    return frame[frame[metric].map(positive).astype(bool)] if not frame.empty else frame


def scaling_reason(frame: pd.DataFrame, runs: list[Run]) -> str | None:
    """Why chart 05 cannot be drawn (None: it can)."""
    known = [r for r in runs if r.gpus is not None]
    if len(known) < 2:
        return "fewer than two runs record their topology (manifest.json profile.topology)"
    if len({(r.gpus, r.topology) for r in known}) < 2:
        first = known[0]
        gpus = f"{first.gpus} GPU{'s' if first.gpus != 1 else ''}"
        return f"every run has the same topology ({first.topology_text}, {gpus}): nothing scales"
    d = frame[frame["gpus"].notna()]
    spread = d.groupby(["series", "concurrency"])["topology"].nunique() if not d.empty else pd.Series()
    if spread.empty or spread.max() < 2:
        return "no closed-loop cell (family and concurrency) has valid runs at two topologies"
    return None


RATE_OVERLAY = ("ttft", "tpot", "itl", "e2el")  # chart 06: the medians (p50) of these


def rate_overlay_frame(runs: list[Run]) -> pd.DataFrame:
    """Every valid rate run of every run on the rate axis (charts.rate_frame: a sweep point at
    the rate its run recorded, a duration-bounded cell at the rate it sent; no ramp or synchronous
    cell), with its run's name: chart 06's data."""
    from deepinfer_harness.analysis.charts import rate_frame

    columns = ["run", "variant", "series", "cell_id", "rate", *(f"p50_{m}_ms" for m in RATE_OVERLAY)]
    frames = []
    for run in runs:
        d = rate_frame(pd.DataFrame(run.valid()))
        if d.empty:
            continue
        d = d.assign(run=run.name)
        frames.append(d.reindex(columns=columns))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def write_charts(runs: list[Run], out: Path, notes: list[str]) -> list[Path]:
    from deepinfer_harness.analysis.charts import (
        e2e_throughput_by_run,
        latency_vs_rate_runs,
        save,
        scaling_by_gpus,
    )

    frame = _has(closed_loop_frame(runs), THROUGHPUT)
    written: list[Path] = []
    if frame.empty:
        notes.append(
            "04_e2e_output_throughput not drawn: no run has a valid decode, chat or shared-prefix cell"
        )
    else:
        labels = {r.name: r.labels for r in runs}
        without = [r.name for r in runs if not (frame["run"] == r.name).any()]
        if without:
            notes.append(f"04_e2e_output_throughput: no valid closed-loop cell in {', '.join(without)}")
        written += save(e2e_throughput_by_run(frame, labels, THROUGHPUT), out, "04_e2e_output_throughput")
    why = scaling_reason(frame, runs) if not frame.empty else "no run has a valid closed-loop cell"
    if why:
        notes.append(f"05_scaling_by_gpus not drawn: {why}")
    else:
        scaled = frame[frame["gpus"].notna()]
        written += save(scaling_by_gpus(scaled, THROUGHPUT), out, "05_scaling_by_gpus")
    overlay = rate_overlay_frame(runs)
    if overlay.empty:
        notes.append("06_latency_vs_rate not drawn: no run has a valid rate cell at a single rate")
    else:
        written += save(latency_vs_rate_runs(overlay, [r.name for r in runs]), out, "06_latency_vs_rate")
    return written


def only_in(rows: list[dict[str, Any]], runs: list[Run]) -> list[dict[str, Any]]:
    """The cells not every run has (with the runs that have them), in row order."""
    out: dict[str, list[str]] = {}
    for row in rows:
        have = [e["run"] for e in row["runs"] if e["present"]]
        if len(have) < len(runs):
            out.setdefault(row["cell_id"], [])
            out[row["cell_id"]] = sorted(
                set(out[row["cell_id"]]) | set(have), key=[r.name for r in runs].index
            )
    return [{"cell_id": c, "runs": have} for c, have in out.items()]


def only_in_lines(partial: list[dict[str, Any]]) -> list[str]:
    by: dict[tuple[str, ...], list[str]] = {}
    for item in partial:
        by.setdefault(tuple(item["runs"]), []).append(item["cell_id"])
    return [f"- only in {', '.join(have)}: {', '.join(cells)}" for have, cells in by.items()]


def _value(arm: dict[str, Any] | None) -> str:
    if not arm:
        return "—"
    if arm["ci_low"] is None:
        return f"{fmt(arm['mean'])} (n={arm['n']})"
    return f"{fmt(arm['mean'])} [{fmt(arm['ci_low'])}, {fmt(arm['ci_high'])}] (n={arm['n']})"


def _ratio(r: dict[str, Any] | None, count: str) -> str:
    if not r or not positive(r.get("ratio")):
        return "—"
    if positive(r.get("ci_low")) and positive(r.get("ci_high")):
        return f"{ratio_text(r['ratio'])}× [{ratio_text(r['ci_low'])}, {ratio_text(r['ci_high'])}]"
    return f"{ratio_text(r['ratio'])}× (no CI, {count})"


def runs_table(facts: list[dict[str, Any]]) -> str:
    return markdown(
        pd.DataFrame(
            [
                {
                    "#": k + 1,
                    "run": f["run"],
                    "profile": f["profile"],
                    "A": f["labels"]["A"],
                    "B": f["labels"]["B"],
                    "topology": "—" if f["tp"] is None else f"TP{f['tp']}×PP{f['pp']}",
                    "GPUs (tp × pp)": "—" if f["gpus"] is None else str(f["gpus"]),
                    "servers saw": f["devices"],
                    "arms": "A/A (same build)" if f["aa_run"] else "A/B",
                    "valid runs": f"{f['valid_runs']} of {f['runs']}",
                    "certificate": f["certificate"] or "—",
                    "date": f["date"] or "—",
                    "git": (f["git_sha"] or "—")[:10],
                }
                for k, f in enumerate(facts)
            ]
        )
    )


def versus(row: dict[str, Any], entry: dict[str, Any], arm: str) -> str:
    """This run's arm over the reference's, as the table prints it."""
    if entry is row["runs"][0]:
        return "(reference)"
    if not row["runs"][0]["present"]:
        return "(not in the reference)"
    r = (entry.get("vs_reference") or {}).get(arm)
    return _ratio(r, f"n {r['n_ref']} and {r['n']}") if r else "—"


def rows_table(rows: list[dict[str, Any]], reference: str) -> str:
    lines = []
    for row in rows:
        for e in row["runs"]:
            if not e["present"]:  # the cells some runs lack are listed once, above the table
                continue
            ab = e["ab"] or {}
            lines.append(
                {
                    "cell": row["cell_id"],
                    "metric": row["metric"],
                    "run": e["run"],
                    "A": _value(e["A"]),
                    "B": _value(e["B"]),
                    "B/A (paired)": _ratio(ab, f"{ab.get('n_pairs', 0)} pairs")
                    if ab
                    else "— (no ab.json row)",
                    "mark": f"`{ab['mark']}`" if ab.get("mark") else "",
                    **{f"{v} vs {reference}": versus(row, e, v) for v in ARMS},
                }
            )
    columns = [
        "cell",
        "metric",
        "run",
        "A",
        "B",
        "B/A (paired)",
        "mark",
        f"A vs {reference}",
        f"B vs {reference}",
    ]
    frame = pd.DataFrame(lines, columns=columns).fillna("")
    return markdown(frame) if not frame.empty else "(no metric with a valid run)"


LEGEND = (
    "A, B: the arm's mean over its valid runs [95 % t interval, from 5 runs] (n valid runs). "
    "B/A (paired) and mark: the run's own A/B verdict from its ab.json (paired B/A, "
    "bootstrap 95 % CI from 5 pairs; `-` better, `+` worse, `~` within noise, `?` no claim, `!` "
    "invalid or missing runs, `x` not comparable). A/B vs {ref}: this run's arm over the same arm "
    "of {ref}, ratio of geometric means with a Welch 95 % t interval (from 5 runs on each side); the "
    "runs are not paired (other sessions, maybe other machines), so no mark."
)


def compare(
    paths: list[str],
    out: Path | None = None,
    cells: list[str] | None = None,
    metrics: list[str] | None = None,
) -> tuple[str, dict[str, Any], list[str]]:
    """(markdown for stdout, the compare JSON, one-line notes); with `out`, also the files."""
    runs = load_runs(paths)
    rows = compare_rows(runs, cells, metrics)
    facts = [r.facts() for r in runs]
    reference = runs[0].name
    partial = only_in(rows, runs)
    head = [f"# {len(runs)} runs compared (reference: {reference})", "", runs_table(facts), ""]
    if partial:
        head += ["Cells not every run has (their rows list only the runs that have them):", ""]
        head += [*only_in_lines(partial), ""]
    text = "\n".join([*head, LEGEND.format(ref=reference), "", rows_table(rows, reference), ""])
    result: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": "compare",
        "reference": reference,
        "runs": facts,
        "filters": {"cells": cells or [], "metrics": metrics or []},
        "methods": {
            "arm": "mean over the arm's valid runs, Student t 95 % interval (n >= 2)",
            "ab": "the run's own ab.json row: paired bootstrap B/A, A/A floor, mark",
            "vs_reference": "ratio of geometric means over valid runs, Welch t 95 % interval on ln values; "
            "unpaired, no mark",
        },
        "cells_not_in_every_run": partial,
        "rows": rows,
    }
    notes: list[str] = []
    if out is not None:
        written = write_charts(runs, out, notes)
        result["charts"] = [p.name for p in written]
        result["not_drawn"] = list(notes)
        write_json(out / "compare.json", result)
        (out / "compare.md").write_text(text)
    return text, result, notes
