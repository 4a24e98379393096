"""Result layout and the run key; every stage finds its inputs through these paths only.

<run>/{manifest.json, summary.json, ab.json, ab.md, ab.csv, runs.csv, prompts/corpus-<workload>.json}
<run>/prompts/conversations-sharegpt.json   (the --corpus conversations chat/rate cells send)
<run>/logs/<variant>.s<session>.server.{log,pid}  (the pid file while the server runs)
<run>/cells/<cell_id>/<variant>.r<k>.{jsonl, cell.json, summary.json, metrics.{idle,before,after}.prom.gz}
<run>/cells/<cell_id>/attempts/<variant>.r<k>.a<n>.*   (set-aside invalid or partial runs)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepinfer_harness.strict_json import dumps

_RUN_FILE = re.compile(r"^([AB])\.r(\d+)\.")


def write_json(path: Path, data: Any) -> None:
    """Atomic and strict (strict_json: NaN → null, ±inf → "inf"/"-inf", never a NaN token)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


class ResultFileError(ValueError):
    """A results file that cannot be read as written (truncated, garbled): one line naming it."""


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except UnicodeDecodeError as exc:
        raise ResultFileError(f"{path}: not UTF-8 text ({exc.reason}); {_AWAY}") from exc
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise ResultFileError(f"{path}: not valid JSON at {where} ({exc.msg}: truncated?); {_AWAY}") from exc


_AWAY = "nothing was changed: move the file aside (its run is re-run on resume) or use --fresh"


def jsonl_objects(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file. Only a torn last line (a write cut off by a kill: no
    newline after it) is skipped; any other line that is not a JSON object is an error."""
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):  # the last piece, with no newline after it: torn
                continue
            raise ResultFileError(f"{path}: line {number} is not JSON ({exc.msg}); {_AWAY}") from exc
        if not isinstance(value, dict):
            raise ResultFileError(f"{path}: line {number} is not a JSON object; {_AWAY}")
        out.append(value)
    return out


def check_run_files(root: Path) -> None:
    """Every input file a resume or report reads parses (attempts/ excepted: never read again;
    summary.json, ab.json: outputs, rewritten); the first that does not is one ResultFileError
    line, before anything runs."""
    if not root.is_dir():
        return
    inputs = [root / "manifest.json", *sorted((root / "prompts").glob("*.json"))]
    for path in [p for p in inputs if p.exists()] + sorted((root / "cells").glob("*/*.json")):
        read_json(path)
    for path in sorted((root / "cells").glob("*/*.jsonl")):
        jsonl_objects(path)


@dataclass(frozen=True, order=True)
class RunKey:
    """One run: a cell measured once by one variant in its k-th session (rep k)."""

    cell_id: str
    variant: str
    rep: int

    @property
    def tag(self) -> str:
        return f"{self.variant}.r{self.rep}"

    def __str__(self) -> str:
        return f"{self.cell_id}/{self.tag}"


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

    def corpus(self, workload: str) -> Path:
        return self.root / "prompts" / f"corpus-{workload}.json"

    def conversations(self) -> Path:
        """The ShareGPT conversations the chat and rate cells send (run/conversations.py)."""
        return self.root / "prompts" / "conversations-sharegpt.json"

    def server_log(self, variant: str, session: int) -> Path:
        return self.root / "logs" / f"{variant}.s{session}.server.log"

    def cell_dir(self, cell_id: str) -> Path:
        return self.root / "cells" / cell_id

    def run_file(self, key: RunKey, suffix: str) -> Path:
        return self.cell_dir(key.cell_id) / f"{key.tag}.{suffix}"

    def run_files(self, key: RunKey) -> list[Path]:
        return sorted(self.cell_dir(key.cell_id).glob(f"{key.tag}.*"))

    def state(self, key: RunKey) -> str:
        """'valid' (summary says so), 'invalid' (summary says not), 'partial' (files, no summary), 'none'."""
        path = self.run_file(key, "summary.json")
        if path.exists():
            return "valid" if read_json(path).get("validity", {}).get("valid") else "invalid"
        return "partial" if self.run_files(key) else "none"

    def finished(self, key: RunKey) -> bool:
        """A run is finished when its summary exists and says valid; invalid runs are re-run."""
        return self.state(key) == "valid"

    def retire(self, key: RunKey) -> None:
        """Move an unfinished or invalid run's files to attempts/ (kept, never deleted)."""
        files = self.run_files(key)
        if not files:
            return
        attempts = self.cell_dir(key.cell_id) / "attempts"
        attempt = len({p.name.split(".")[2] for p in attempts.glob(f"{key.tag}.a*.*")})
        attempts.mkdir(parents=True, exist_ok=True)
        for path in files:
            rest = path.name.split(".", 2)[2]
            path.replace(attempts / f"{key.tag}.a{attempt}.{rest}")

    def keys(self) -> list[RunKey]:
        """Every run with a summary, in (cell, variant, rep) order."""
        out = []
        for path in (self.root / "cells").glob("*/[AB].r*.summary.json"):
            m = _RUN_FILE.match(path.name)
            if m:
                out.append(RunKey(path.parent.name, m.group(1), int(m.group(2))))
        return sorted(out)
