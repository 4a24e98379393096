"""Per-request export and the speculation-on/off greedy check, both read from run files only.

`export`: one row per request of every run (warm-ups included, marked by `phase`) with the
timings `vllm bench serve --save-detailed` and AIPerf's profile export give, computed by the
formulas of metrics.py from the raw JSONL (`cells/<cell>/<arm>.r<k>.jsonl` holds the raw
nanosecond stamps; this is the flat view of it).

`spec_greedy`: speculative decoding must not change greedy output (the verifier accepts a draft
token only where it equals the target's argmax), so two runs of the same plan, one with
`speculative` set and one without, must produce identical greedy tokens for every prompt of
every greedy cell, arm by arm. A divergence names the cell, arm, prompt and first position.
"""

from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path
from typing import Any

from deepinfer_harness.analysis.metrics import e2el_ns, gaps_ns, tpot_ns, ttft_ns
from deepinfer_harness.cells import parse_cell
from deepinfer_harness.config import ConfigError
from deepinfer_harness.layout import RunLayout, read_json
from deepinfer_harness.records import RequestRecord, read_records
from deepinfer_harness.strict_json import dumps

EXPORT_COLUMNS = [
    "run_id",
    "cell_id",
    "kind",
    "variant",
    "rep",
    "session",
    "index",
    "worker",
    "phase",
    "request_id",
    "ok",
    "error",
    "start_time",
    "prompt_tokens",
    "output_tokens",
    "cached_tokens",
    "finish_reason",
    "ttft_ms",
    "tpot_ms",
    "e2el_ms",
    "mean_itl_ms",
    "n_events",
    "server_ttft_ms",
    "queue_time_ms",
]


def _ms(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e6


def request_row(run_id: str, kind: str, r: RequestRecord, with_itl: bool) -> dict[str, Any]:
    gaps = [g / 1e6 for g in gaps_ns(r)]
    server = r.server_metrics or {}
    row: dict[str, Any] = {
        "run_id": run_id,
        "cell_id": r.cell_id,
        "kind": kind,
        "variant": r.variant,
        "rep": r.rep,
        "session": r.session,
        "index": r.index,
        "worker": r.worker,
        "phase": r.phase,
        "request_id": r.request_id,
        "ok": r.ok,
        "error": r.error,
        "start_time": r.start_time,
        "prompt_tokens": r.prompt_tokens,
        "output_tokens": r.output_tokens,
        "cached_tokens": r.cached_tokens,
        "finish_reason": r.finish_reason,
        "ttft_ms": _ms(ttft_ns(r)),
        "tpot_ms": _ms(tpot_ns(r)),
        "e2el_ms": _ms(e2el_ns(r)),
        "mean_itl_ms": statistics.fmean(gaps) if gaps else None,
        "n_events": len(r.event_times_ns),
        "server_ttft_ms": server.get("time_to_first_token_ms"),
        "queue_time_ms": server.get("queue_time_ms"),
    }
    if with_itl:  # JSONL keeps every gap and each event's token count
        row |= {"itl_ms": gaps, "tokens_per_chunk": r.tokens_per_chunk}
    return row


def _run_files(layout: RunLayout) -> list[Path]:
    return sorted((layout.root / "cells").glob("*/[AB].r*.jsonl"))


def export_requests(root: Path, fmt: str) -> str:
    """Every request of a run directory as CSV or JSONL text."""
    layout = RunLayout(root)
    if not layout.manifest.exists():
        raise ConfigError(f"{root} is not a run directory (no manifest.json)")
    run_id = read_json(layout.manifest).get("run_id", root.name)
    rows = [
        request_row(run_id, parse_cell(r.cell_id).kind, r, fmt == "jsonl")
        for path in _run_files(layout)
        for r in read_records(path)
    ]
    if fmt == "jsonl":
        return "".join(dumps(row, separators=(",", ":")) + "\n" for row in rows)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=EXPORT_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _greedy_tokens(layout: RunLayout) -> dict[tuple[str, str], dict[int, list[list[int]]]]:
    """(greedy cell, arm) → prompt index → every measured run's output token ids."""
    out: dict[tuple[str, str], dict[int, list[list[int]]]] = {}
    for path in _run_files(layout):
        cell_id = path.parent.name
        if parse_cell(cell_id).kind != "greedy":
            continue
        for r in read_records(path):
            if r.phase == "measure" and r.ok and r.output_token_ids is not None:
                out.setdefault((cell_id, r.variant), {}).setdefault(r.index, []).append(r.output_token_ids)
    return out


def _first_divergence(x: list[int], y: list[int]) -> int | None:
    for j, (p, q) in enumerate(zip(x, y, strict=False)):
        if p != q:
            return j
    return None if len(x) == len(y) else min(len(x), len(y))


def spec_greedy(spec_root: Path, plain_root: Path) -> dict[str, Any]:
    """Compare the greedy tokens of a run with speculation (`spec_root`) and one without."""
    runs = {}
    for label, root in (("spec", spec_root), ("plain", plain_root)):
        layout = RunLayout(root)
        if not layout.manifest.exists():
            raise ConfigError(f"{root} is not a run directory (no manifest.json)")
        runs[label] = (layout, read_json(layout.manifest))
    spec_cfg = runs["spec"][1]["profile"].get("speculative")
    plain_cfg = runs["plain"][1]["profile"].get("speculative")
    if not spec_cfg:
        raise ConfigError(
            f"{spec_root}: its profile has no speculative config; give the speculative run first"
        )
    if plain_cfg:
        raise ConfigError(
            f"{plain_root}: its profile runs speculation too ({plain_cfg}); "
            "run it with --set speculative=null"
        )
    a, b = _greedy_tokens(runs["spec"][0]), _greedy_tokens(runs["plain"][0])
    checks = []
    for key in sorted(set(a) & set(b)):
        cell_id, variant = key
        compared, diverged = 0, []
        for index in sorted(set(a[key]) & set(b[key])):
            reference = b[key][index][0]
            for tokens in a[key][index] + b[key][index][1:]:
                compared += 1
                first = _first_divergence(tokens, reference)
                if first is not None:
                    diverged.append({"prompt": index, "first_divergence": first})
        checks.append(
            {
                "cell_id": cell_id,
                "variant": variant,
                "outputs_compared": compared,
                "diverged": diverged,
                "identical": not diverged and compared > 0,
            }
        )
    status = "none" if not checks else ("ok" if all(c["identical"] for c in checks) else "fail")
    return {
        "check": "greedy output identical with speculative decoding on and off",
        "spec_run": runs["spec"][1].get("run_id"),
        "plain_run": runs["plain"][1].get("run_id"),
        "speculative": spec_cfg,
        "provenance": {
            label: {
                "run_id": m.get("run_id"),
                "git_sha": (m.get("harness") or {}).get("git_sha"),
                "started_at": m.get("started_at"),
                "model": m.get("model"),
            }
            for label, (_, m) in runs.items()
        },
        "status": status,
        "checks": checks,
        "targets": [
            {
                "name": f"greedy tokens identical, speculation on vs off: {c['cell_id']} {c['variant']}",
                "measured": len(c["diverged"]),
                "goal": 0,
                "unit": "diverged outputs",
                "direction": "<=",
                "met": c["identical"],
            }
            for c in checks
        ],
    }
