"""The rates of a sweep to saturation (plan.rate.sweep), decided once per run and recorded.

GuideLLM's sweep first measures what the server completes when every request is sent at once,
then samples rates below that. Here the probe is the plan's all-at-once rate cell (`rinf`, capped
by max_concurrency when set: a closed loop at that cap), and sweep point k of N (`r{k}of{N}max`)
sends at k/N of the probe's measured `request_throughput` (completed requests / first send → last
end).

How this fits "cell definitions hashed, resume refuses changed ones": a sweep point's definition
is what the profile declares — the point k/N, its probe's cell id, n, lengths, seed — never the
measured rate, so its sha256 is known before any server starts and a resume compares it like any
other. The measured rate is a fact of the run, like the corpus token ids the first server makes:
the first valid probe run in schedule order (normally session 0, arm A rep 0) decides it, and
`manifest.json` → `sweeps.<probe>` records the maximum, the run that measured it and every
point's rate before any sweep point is sent. Every later session, both arms and every resume read
that record and never measure again, so A and B are compared at the same rates and a resumed run
sends what the interrupted one would have. Each sweep run's cell.json also records the rate it was
sent at, and the report refuses to compare runs of one point sent at different rates (`x`).
"""

from __future__ import annotations

import math
import time
from typing import Any

from deepinfer_harness.cells import parse_cell
from deepinfer_harness.layout import RunKey, RunLayout, read_json, write_json
from deepinfer_harness.plan import CellDef

MANIFEST_KEY = "sweeps"
MEASURE = "request_throughput"


def recorded(layout: RunLayout) -> dict[str, Any]:
    """probe cell id → its recorded decision (empty before any)."""
    if not layout.manifest.exists():
        return {}
    return dict(read_json(layout.manifest).get(MANIFEST_KEY) or {})


def point_rate(decision: dict[str, Any], cell_id: str) -> float:
    cell = parse_cell(cell_id)
    return cell.sweep_k / cell.sweep_of * float(decision["max_rate"])


def _probe_run(layout: RunLayout, probe: str, schedule: list[dict[str, Any]]) -> tuple[RunKey, float] | None:
    """The first valid run of the probe in schedule order with a positive finite throughput."""
    for s in schedule:
        key = RunKey(probe, s["variant"], s["rep"])
        path = layout.run_file(key, "summary.json")
        if not path.exists():
            continue
        summary = read_json(path)
        value = summary.get(MEASURE)
        if summary.get("validity", {}).get("valid") and isinstance(value, int | float):
            if math.isfinite(value) and value > 0:
                return key, float(value)
    return None


def decide(layout: RunLayout, cells: list[CellDef]) -> dict[str, Any]:
    """Record a decision for every probe that has none yet and has a valid run; returns every
    recorded decision (probe id → record). Never changes a decision once recorded."""
    manifest = read_json(layout.manifest)
    decisions = dict(manifest.get(MANIFEST_KEY) or {})
    points: dict[str, list[str]] = {}
    for c in cells:
        if c.sweep_probe:
            points.setdefault(c.sweep_probe, []).append(c.id)
    changed = False
    for probe, ids in sorted(points.items()):
        if probe in decisions:
            continue
        found = _probe_run(layout, probe, manifest.get("schedule") or [])
        if found is None:
            continue
        key, max_rate = found
        decision: dict[str, Any] = {
            "probe_cell": probe,
            "probe_run": key.tag,
            "measured": f"{MEASURE} of {key} (completed requests / first send → last end)",
            "max_rate": max_rate,
            "rate_unit": "requests/s",
            "decided_at": time.time(),
        }
        decision["rates"] = {cid: point_rate(decision, cid) for cid in sorted(ids)}
        decisions[probe] = decision
        changed = True
    if changed:
        manifest[MANIFEST_KEY] = decisions
        write_json(layout.manifest, manifest)
    return decisions


def rate_for(layout: RunLayout, cdef: CellDef, cells: list[CellDef]) -> float | None:
    """A sweep point's rate: from the recorded decision, deciding it now if its probe has a valid
    run; None while no valid probe run exists (the point is then not run, and reported missing)."""
    probe = cdef.sweep_probe
    if probe is None:
        return None
    decisions = recorded(layout)
    if probe not in decisions:
        decisions = decide(layout, cells)
    return point_rate(decisions[probe], cdef.id) if probe in decisions else None
