"""Result layout (HARNESS.md §6); every stage finds its inputs through these paths only.

    <run>/{manifest.json, summary.json, ab.json, ab.md, ab.csv, runs.csv, prompts/corpus.json}
    <run>/logs/<variant>.s<session>.server.log
    <run>/cells/<cell_id>/<variant>.r<k>.{jsonl, cell.json, summary.json, metrics.{idle,before,after}.prom.gz}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    tmp.replace(path)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


@dataclass(frozen=True)
class RunLayout:
    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def ab(self) -> Path:
        return self.root / "ab.json"

    @property
    def corpus(self) -> Path:
        return self.root / "prompts" / "corpus.json"

    def server_log(self, variant: str, session: int) -> Path:
        return self.root / "logs" / f"{variant}.s{session}.server.log"

    def cell_dir(self, cell_id: str) -> Path:
        return self.root / "cells" / cell_id

    def run_file(self, cell_id: str, variant: str, rep: int, suffix: str) -> Path:
        return self.cell_dir(cell_id) / f"{variant}.r{rep}.{suffix}"

    def run_files(self, cell_id: str, variant: str, rep: int) -> list[Path]:
        return sorted(self.cell_dir(cell_id).glob(f"{variant}.r{rep}.*"))

    def finished(self, cell_id: str, variant: str, rep: int) -> bool:
        """A run is finished when its summary exists and says valid; invalid runs are re-run."""
        path = self.run_file(cell_id, variant, rep, "summary.json")
        return path.exists() and bool(read_json(path).get("validity", {}).get("valid"))

    def retire(self, cell_id: str, variant: str, rep: int) -> None:
        """Move an unfinished or invalid run's files to attempts/ (kept, never deleted)."""
        files = self.run_files(cell_id, variant, rep)
        if not files:
            return
        attempts = self.cell_dir(cell_id) / "attempts"
        attempt = len({p.name.split(".")[2] for p in attempts.glob(f"{variant}.r{rep}.a*.*")})
        attempts.mkdir(parents=True, exist_ok=True)
        for path in files:
            rest = path.name.split(".", 2)[2]
            path.replace(attempts / f"{variant}.r{rep}.a{attempt}.{rest}")

    def summaries(self) -> list[Path]:
        return sorted((self.root / "cells").glob("*/[AB].r*.summary.json"))
