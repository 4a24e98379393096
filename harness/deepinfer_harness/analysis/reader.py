"""The one reader of raw run files (JSONL, cell.json, metrics .prom.gz) for the analysis stage.

Records are parsed once per run and cached, so the per-run summary, the percentile samples and
the numerics comparisons all see the same objects.
"""

from __future__ import annotations

import gzip
from typing import Any

from deepinfer_harness.layout import RunKey, RunLayout, read_json
from deepinfer_harness.prometheus import Snapshot, parse_metrics
from deepinfer_harness.records import RequestRecord, read_records
from deepinfer_harness.strict_json import numbers


class RunReader:
    def __init__(self, layout: RunLayout) -> None:
        self.layout = layout
        self._records: dict[RunKey, list[RequestRecord]] = {}

    def records(self, key: RunKey) -> list[RequestRecord]:
        if key not in self._records:
            self._records[key] = read_records(self.layout.run_file(key, "jsonl"))
        return self._records[key]

    def measured_ok(self, key: RunKey) -> list[RequestRecord]:
        return [r for r in self.records(key) if r.phase == "measure" and r.ok]

    def facts(self, key: RunKey) -> dict[str, Any]:
        path = self.layout.run_file(key, "cell.json")
        # "inf" back to a number: strict JSON writes ±inf as a string (strict_json)
        return numbers(read_json(path)) if path.exists() else {"violations": ["cell.json missing"]}

    def snapshot(self, key: RunKey, label: str) -> Snapshot:
        path = self.layout.run_file(key, f"metrics.{label}.prom.gz")
        if not path.exists():
            return Snapshot()
        with gzip.open(path, "rt") as fh:
            return parse_metrics(fh.read())
