"""A run directory written by hand, as the run stage would have left it (manifest, per-request
JSONL, cell.json, metrics snapshots, per-run summaries), with every value under the test's control:
the report is then derived from files no server produced. Cells: a TTFT cell (two-level percentile
rows) and an all-at-once open-loop rate cell (rate inf)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from deepinfer_harness.analysis.reader import RunReader
from deepinfer_harness.analysis.run_summary import limits_of, write_summary
from deepinfer_harness.config import load_profile, profile_dict
from deepinfer_harness.layout import RunKey, RunLayout, write_json
from deepinfer_harness.manifest import finalize_manifest, init_manifest, record_session
from deepinfer_harness.plan import abba_schedule, build_cells
from deepinfer_harness.records import RequestRecord

MS = 1_000_000
TTFT_CELL, RATE_CELL = "ttft-i16-c1", "rate-i16-o4-rinf-poisson"
PLAN = {
    "prefill": {"isls": [], "n": 2, "concurrent": []},
    "decode": {"isl": 16, "osl": 4, "concurrencies": []},
    "greedy": {"isl": 16, "osl": 4, "concurrencies": []},
    "ttft_isls": [16],
    "ttft_n": 6,
    "rate": {"rates": [float("inf")], "arrivals": ["poisson"], "isl": 16, "osl": 4, "n": 4},
}
# (variant, rep, cell_id, index) → (ttft in ms, gap between events in ms)
Timing = Callable[[str, int, str, int], tuple[float, float]]


def default_timing(variant: str, rep: int, cell_id: str, index: int) -> tuple[float, float]:
    return 10.0 + index + rep, 2.0 + 0.1 * index


def _record(
    cell_id: str, key: RunKey, session: int, index: int, isl: int, osl: int, timing: Timing
) -> RequestRecord:
    ttft_ms, gap_ms = timing(key.variant, key.rep, cell_id, index)
    first = int(ttft_ms * MS)
    events = [first + int(j * gap_ms * MS) for j in range(osl)]
    return RequestRecord(
        cell_id,
        key.variant,
        key.rep,
        session,
        index,
        phase="measure",
        prompt_len=isl,
        max_tokens=osl,
        t_send_ns=0,
        t_end_ns=events[-1] + MS,
        event_times_ns=events,
        tokens_per_chunk=[1] * osl,
        events_per_read=[1] * osl,
        http_status=200,
        done=True,
        finish_reason="length",
        prompt_tokens=isl,
        output_tokens=osl,
        cached_tokens=0,
        server_metrics={"time_to_first_token_ms": max(ttft_ms - 1.0, 0.5), "queue_time_ms": 0.2},
    )


def _prom(values: dict[str, float]) -> str:
    lines = []
    for name, value in values.items():
        base = name.partition("{")[0].removesuffix("_total")
        lines += [f"# TYPE {base} counter", f"{name} {value}"]
    return "\n".join(lines) + "\n"


def _write_gz(path: Path, text: str) -> None:
    with gzip.open(path, "wt") as fh:
        fh.write(text)


def write_run(
    root: Path,
    repetitions: int = 3,
    timing: Timing = default_timing,
    mutate: Callable[[RunKey, list[dict[str, Any]]], None] | None = None,
) -> RunLayout:
    """Every session of `repetitions` ABBA blocks, every cell, valid by every rule; `mutate` may
    change a run's records (as JSON dicts) before they are written."""
    profile_file = root.parent / f"{root.name}.yaml"
    profile_file.write_text(
        yaml.safe_dump(
            {
                "name": "synthetic",
                "served_model_name": "m",
                "max_model_len": 4096,
                "server": {"mode": "url", "urls": {"A": "http://127.0.0.1:9", "B": "http://127.0.0.1:9"}},
                "plan": PLAN,
                "ab": {"repetitions": repetitions, "bootstrap_resamples": 200, "aa": False},
            }
        )
    )
    profile = load_profile(str(profile_file))
    cells, sessions = build_cells(profile), abba_schedule(repetitions)
    layout = RunLayout(root)
    init_manifest(layout, profile, cells, sessions, root.name, "m", None)
    limits = limits_of(profile_dict(profile))
    for s in sessions:
        facts = {"vllm_version": "0.32.0", "server_info_sha256": "same", "serve_args": []}
        record_session(layout, s.index, {"variant": s.variant, "rep": s.rep, **facts}, profile, 0.0)
        for cdef in cells:
            key = RunKey(cdef.id, s.variant, s.rep)
            cell = cdef.cell
            records = [
                _record(cdef.id, key, s.index, i, cell.isl, cell.osl, timing).to_json() for i in range(cdef.n)
            ]
            if mutate:
                mutate(key, records)
            path = layout.run_file(key, "jsonl")
            path.parent.mkdir(parents=True, exist_ok=True)
            # as given: json.dumps writes NaN / Infinity tokens, as an older harness or a foreign
            # tool may have (the harness's own writer is strict)
            path.write_text("".join(json.dumps(data) + "\n" for data in records))
            prompt = sum(cell.isl for _ in range(cdef.n))
            after = {
                "vllm:request_success_total": float(cdef.n),
                "vllm:generation_tokens_total": float(cdef.n * cell.osl),
                "vllm:prompt_tokens_total": float(prompt),
                'vllm:prompt_tokens_by_source_total{source="local_compute"}': float(prompt),
            }
            _write_gz(layout.run_file(key, "metrics.before.prom.gz"), _prom(dict.fromkeys(after, 0.0)))
            _write_gz(layout.run_file(key, "metrics.after.prom.gz"), _prom(after))
            cell_facts: dict[str, Any] = {
                "session": s.index,
                "definition_sha256": cdef.definition_sha256,
                "violations": [],
                "loop_lag": {"loop_lag_p99_ms": 0.1, "loop_lag_max_ms": 0.2},
            }
            if cell.kind == "rate":
                cell_facts["arrivals"] = {
                    "offered_rate": cell.rate,
                    "arrival": cell.arrival,
                    "schedule_s": 0.0,
                    "send_late_ms_max": 0.0,
                    "max_concurrency": None,
                }
            write_json(layout.run_file(key, "cell.json"), cell_facts)
            write_summary(RunReader(layout), key, limits)
    finalize_manifest(layout, profile)
    return layout
