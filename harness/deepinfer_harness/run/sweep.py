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
the first usable probe run in schedule order (normally session 0, arm A rep 0) decides it, and
`manifest.json` → `sweeps.<probe>` records the maximum, the run that measured it and every
point's rate before any sweep point is sent. Every later session, both arms and every resume read
that record and never measure again, so A and B are compared at the same rates and a resumed run
sends what the interrupted one would have. Each sweep run's cell.json also records the rate it was
sent at, and the report refuses to compare runs of one point sent at different rates (`x`).
A probe run is usable when valid, or invalid for host load alone: the client's event-loop lag
moves timestamps by milliseconds but not which requests completed, so the throughput the points
are placed from stands (the decision records which it was). When no probe run is usable, the
points are not run and `unplaced` says why, naming each probe run's first violation.
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


HOST_LOAD = "host load"  # the prefix of every host-load violation (analysis/validity.py)


def usable(summary: dict[str, Any]) -> str | None:
    """How a probe run may anchor the sweep: 'valid', 'invalid for host load alone', or None."""
    validity = summary.get("validity") or {}
    value = summary.get(MEASURE)
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        return None
    if validity.get("valid"):
        return "valid"
    violations = validity.get("violations") or []
    if violations and all(str(v).startswith(HOST_LOAD) for v in violations):
        return "invalid for host load alone"
    return None


def _probe_run(
    layout: RunLayout, probe: str, schedule: list[dict[str, Any]]
) -> tuple[RunKey, float, str] | None:
    """The first usable run of the probe in schedule order."""
    for s in schedule:
        key = RunKey(probe, s["variant"], s["rep"])
        path = layout.run_file(key, "summary.json")
        if not path.exists():
            continue
        summary = read_json(path)
        how = usable(summary)
        if how is not None:
            return key, float(summary[MEASURE]), how
    return None


def unplaced(layout: RunLayout, cells: list[CellDef]) -> dict[str, str]:
    """probe id → why its points have no rate (no decision recorded), in one clause."""
    if not layout.manifest.exists():
        return {}
    decisions = recorded(layout)
    out = {}
    for probe in sorted({c.sweep_probe for c in cells if c.sweep_probe} - set(decisions)):
        runs = []
        for s in read_json(layout.manifest).get("schedule") or []:
            path = layout.run_file(RunKey(probe, s["variant"], s["rep"]), "summary.json")
            if path.exists():
                summary = read_json(path)
                first = (summary.get("validity", {}).get("violations") or [f"no {MEASURE}"])[0]
                runs.append(f"{s['variant']}.r{s['rep']}: {first}")
        out[probe] = (
            f"the sweep points of {probe} have no rate: no run of {probe} could anchor them "
            f"({'; '.join(runs[:2]) if runs else 'none ran'})"
        )
    return out


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
        key, max_rate, how = found
        decision: dict[str, Any] = {
            "probe_cell": probe,
            "probe_run": key.tag,
            "probe_run_validity": how,
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
