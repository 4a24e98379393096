"""The rates of a sweep to saturation (plan.rate.sweep), decided once per run and recorded.

GuideLLM's sweep runs the synchronous strategy first (one request at a time, each sent when the
one before ends), then the throughput strategy (every request at once), and places its remaining
rates evenly between the two measured request rates. Here the anchors are two cells of the plan:
the synchronous cell (`rsync`: S, its completed requests / first send → last end) and the
all-at-once probe (`rinf`, capped by max_concurrency when set: T). Sweep point k of N
(`r{k}of{N}sweep`, N = points + 1) sends at S + k/N·(T − S): strictly between the anchors, as the
anchors themselves are measured cells. (GuideLLM's last point is T itself, sent at rate T; here
the top of the curve is the all-at-once cell.) When T ≤ S (a server that completes no more at
once than one at a time) the points still lie between them, and the decision says so.

Runs recorded with the former anchor (`r{k}of{N}max`: k/N of T, no synchronous cell) keep their
decision and are read as recorded; a resume of such a run is refused (manifest.py: the plan's cells
differ from the recorded ones).

How this fits "cell definitions hashed, resume refuses changed ones": a sweep point's definition
is what the profile declares — the point k/N, its anchors' cell ids, n, lengths, seed — never the
measured rate, so its sha256 is known before any server starts and a resume compares it like any
other. The measured rates are facts of the run, like the corpus token ids the first server makes:
the first usable run of each anchor in schedule order (normally session 0, arm A rep 0) decides
them, and `manifest.json` → `sweeps.<probe>` records S, T, the runs that measured them and every
point's rate before any point is sent. Every later session, both arms and every resume read that
record and never measure again, so A and B are compared at the same rates and a resumed run sends
what the interrupted one would have. Each sweep run's cell.json also records the rate it was sent
at, and the report refuses to compare runs of one point sent at different rates (`x`).

An anchor run is usable when valid, or invalid for host load alone: the client's event-loop lag
moves timestamps by milliseconds but not which requests completed, so the rate the points are
placed from stands (the decision records which it was). When no run of an anchor is usable, the
points are not run and `unplaced` says why, in its true terms: the anchor's runs that broke a rule
other than host load (named), or that no run of it finished (a session that could not start, with
its cause, or a server that died before the anchor ran).
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
HOST_LOAD = "host load"  # the prefix of every host-load violation (analysis/validity.py)
ANCHOR = "GuideLLM: synchronous rate S, then all-at-once throughput T, points S + k/N·(T − S)"


def recorded(layout: RunLayout) -> dict[str, Any]:
    """probe cell id → its recorded decision (empty before any)."""
    if not layout.manifest.exists():
        return {}
    return dict(read_json(layout.manifest).get(MANIFEST_KEY) or {})


def point_rate(decision: dict[str, Any], cell_id: str) -> float | None:
    """A point's rate from its decision: S + k/N·(T − S), or k/N·T for a point of the former
    anchor; None for a between-point whose decision has no S (recorded by the former anchor)."""
    cell = parse_cell(cell_id)
    top = float(decision["max_rate"])
    if not cell.sweep_between:
        return cell.sweep_k / cell.sweep_of * top
    if decision.get("sync_rate") is None:
        return None
    low = float(decision["sync_rate"])
    return low + cell.sweep_k / cell.sweep_of * (top - low)


def blocking(summary: dict[str, Any]) -> list[str]:
    """Why a run cannot anchor: its violations other than host load, or a missing measure."""
    validity = summary.get("validity") or {}
    violations = [str(v) for v in validity.get("violations") or [] if not str(v).startswith(HOST_LOAD)]
    value = summary.get(MEASURE)
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        return violations or ["no request completed"]
    if validity.get("valid"):
        return []
    return violations or ([] if validity.get("violations") else ["invalid"])


def usable(summary: dict[str, Any]) -> str | None:
    """How a run may anchor the sweep: 'valid', 'invalid for host load alone', or None."""
    if blocking(summary):
        return None
    return "valid" if (summary.get("validity") or {}).get("valid") else "invalid for host load alone"


def _schedule(layout: RunLayout) -> list[dict[str, Any]]:
    return list(read_json(layout.manifest).get("schedule") or []) if layout.manifest.exists() else []


def _anchor_run(layout: RunLayout, cell_id: str) -> tuple[RunKey, float, str] | None:
    """The first usable run of an anchor cell in schedule order."""
    for s in _schedule(layout):
        key = RunKey(cell_id, s["variant"], s["rep"])
        path = layout.run_file(key, "summary.json")
        if not path.exists():
            continue
        summary = read_json(path)
        how = usable(summary)
        if how is not None:
            return key, float(summary[MEASURE]), how
    return None


def _why_not(layout: RunLayout, cell_id: str, failures: list[str]) -> str:
    """Why an anchor cell has no usable run, in its true terms."""
    broken = []
    for s in _schedule(layout):
        path = layout.run_file(RunKey(cell_id, s["variant"], s["rep"]), "summary.json")
        if path.exists():
            broken.append(f"{s['variant']}.r{s['rep']}: {'; '.join(blocking(read_json(path)))}")
    if broken:  # host load never blocks: what is named here is what did
        return f"every run of {cell_id} broke a rule other than host load ({'; '.join(broken[:2])})"
    if failures:
        return f"no run of {cell_id} finished: {failures[0].splitlines()[0]}"
    return f"no run of {cell_id} finished: its server died before it ran"


def _anchors(cells: list[CellDef]) -> dict[str, tuple[str | None, list[str]]]:
    """probe id → (its synchronous anchor's id or None, the ids of its points)."""
    out: dict[str, tuple[str | None, list[str]]] = {}
    for c in cells:
        if c.sweep_probe:
            sync, ids = out.get(c.sweep_probe, (c.sweep_sync, []))
            out[c.sweep_probe] = (sync or c.sweep_sync, [*ids, c.id])
    return out


def unplaced(layout: RunLayout, cells: list[CellDef], failures: list[str] | None = None) -> dict[str, str]:
    """probe id → why its points have no rate (no decision recorded), in one clause."""
    if not layout.manifest.exists():
        return {}
    decisions = recorded(layout)
    out = {}
    for probe, (sync, _) in sorted(_anchors(cells).items()):
        if probe in decisions:
            continue
        missing = [a for a in (sync, probe) if a and _anchor_run(layout, a) is None]
        why = "; ".join(_why_not(layout, a, failures or []) for a in missing) or "not decided yet"
        out[probe] = f"the sweep points of {probe} have no rate: {why}"
    return out


def decide(layout: RunLayout, cells: list[CellDef]) -> dict[str, Any]:
    """Record a decision for every probe that has none yet and whose anchors have usable runs;
    returns every recorded decision (probe id → record). Never changes a decision once recorded."""
    manifest = read_json(layout.manifest)
    decisions = dict(manifest.get(MANIFEST_KEY) or {})
    changed = False
    for probe, (sync, ids) in sorted(_anchors(cells).items()):
        if probe in decisions:
            continue
        top = _anchor_run(layout, probe)
        low = _anchor_run(layout, sync) if sync else None
        if top is None or (sync and low is None):
            continue
        key, max_rate, how = top
        decision: dict[str, Any] = {
            "probe_cell": probe,
            "probe_run": key.tag,
            "probe_run_validity": how,
            "measured": f"{MEASURE} of {key} (completed requests / first send → last end)",
            "max_rate": max_rate,
            "rate_unit": "requests/s",
            "decided_at": time.time(),
        }
        if low is not None:
            sync_key, sync_rate, sync_how = low
            decision |= {
                "anchor": ANCHOR,
                "sync_cell": sync,
                "sync_run": sync_key.tag,
                "sync_run_validity": sync_how,
                "sync_rate": sync_rate,
            }
            if max_rate <= sync_rate:
                decision["note"] = (
                    f"T {max_rate:.4g} <= S {sync_rate:.4g} requests/s: the server completes no more "
                    "at once than one at a time; the points lie between them, from S down to T"
                )
        decision["rates"] = {cid: point_rate(decision, cid) for cid in sorted(ids)}
        decisions[probe] = decision
        changed = True
    if changed:
        manifest[MANIFEST_KEY] = decisions
        write_json(layout.manifest, manifest)
    return decisions


def rate_for(layout: RunLayout, cdef: CellDef, cells: list[CellDef]) -> float | None:
    """A sweep point's rate: from the recorded decision, deciding it now if its anchors have
    usable runs; None while one has none (the point is then not run, and reported missing)."""
    probe = cdef.sweep_probe
    if probe is None:
        return None
    decisions = recorded(layout)
    if probe not in decisions:
        decisions = decide(layout, cells)
    return point_rate(decisions[probe], cdef.id) if probe in decisions else None
