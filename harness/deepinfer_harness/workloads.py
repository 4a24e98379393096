"""Prompt text that never repeats inside a prompt, for the seed's three workloads (issue 23 defect 8).

`prose`: English prose every Python install carries, in a fixed order: the language reference
topics `help()` prints (`pydoc_data.topics`, by name), then every triple-quoted string of at least
`MIN_PROSE_CHARS` characters that is mostly letters (docstrings) of the standard library's modules,
sorted by path; a paragraph seen before is dropped (~1.7 MB on Python 3.11).
`code`: the standard library's own Python sources, sorted by path, each headed by its path.
`sharegpt`: the human turns of a ShareGPT-style file the user points to (`--corpus FILE`: JSON
list or JSONL of `{"conversations": [{"from": "human", "value": …}, …]}`), joined, for the cells
that fix every prompt's length; chat cells and rate cells with a length range send whole
conversations instead (sharegpt.py).
Long generation is a decode cell with a long output on `prose` prompts (plan.long_decode).

A prompt is a window of the workload's token ids, never a tiling: a workload too short for a cell's
ISL is an error naming the fix. The text depends on the Python version that runs the harness; its
sha256 and source are stored with the run, and both arms read the same stored token ids.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from deepinfer_harness.cells import WORKLOADS
from deepinfer_harness.config import ConfigError
from deepinfer_harness.prompts import corpus_text
from deepinfer_harness.sharegpt import ShareGPTError, user_turns

__all__ = ["WORKLOADS", "CorpusError", "chunks", "sha256_text", "text_pieces", "workload_text"]
MIN_PROSE_CHARS = 200
_TRIPLE = re.compile(r'("""|\'\'\')(.*?)\1', re.DOTALL)
_SKIP_PARTS = {"test", "tests", "idlelib", "site-packages", "__pycache__", "lib2to3", "turtledemo"}


class CorpusError(ConfigError):
    """One line: a workload's text cannot be built or is too short."""


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[Path]:
    root = stdlib_root()
    return sorted(p for p in root.rglob("*.py") if not (set(p.relative_to(root).parts[:-1]) & _SKIP_PARTS))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def _prose_chunks() -> Iterator[str]:
    """Paragraphs seen before are dropped: the topics overlap (`compound` holds `if`, `while`, …)."""
    from pydoc_data.topics import topics  # the reference's text as data (what `help()` prints)

    seen: set[str] = set()
    strings = (topics[k] for k in sorted(topics))
    docs = (
        m.group(2)
        for p in stdlib_files()
        if p.parent.name != "pydoc_data"
        for m in _TRIPLE.finditer(_read(p))
    )
    for raw in itertools.chain(strings, docs):  # lazily: a small budget reads few files
        text = raw.strip()
        letters = sum(c.isalpha() or c.isspace() for c in text)
        if len(text) < MIN_PROSE_CHARS or letters < 0.8 * len(text):  # prose, not data tables
            continue
        kept = []
        for para in text.split("\n\n"):
            key = " ".join(para.split())
            if len(key) >= 40 and key in seen:
                continue
            seen.add(key)
            kept.append(para)
        if kept:
            yield "\n\n".join(kept)


def _code_chunks() -> Iterator[str]:
    root = stdlib_root()
    for path in stdlib_files():
        src = _read(path)
        if src.strip():
            yield f"# file: Lib/{path.relative_to(root).as_posix()}\n{src}"


def _sharegpt_chunks(path: Path) -> Iterator[str]:
    """The user turns of the file's conversations (sharegpt.py), for the window cells."""
    try:
        yield from user_turns(path)
    except ShareGPTError as exc:
        raise CorpusError(str(exc)) from exc


def chunks(workload: str, corpus_file: Path | None = None) -> Iterator[str]:
    if workload == "prose":
        return _prose_chunks()
    if workload == "code":
        return _code_chunks()
    if workload == "sharegpt":
        if corpus_file is None:
            raise CorpusError("workload sharegpt needs --corpus FILE (ShareGPT JSON or JSONL)")
        return _sharegpt_chunks(corpus_file)
    if workload == "page":
        return iter([corpus_text()])
    raise CorpusError(f"unknown workload {workload!r}; allowed {list(WORKLOADS)}")


def workload_text(workload: str, budget_chars: int, corpus_file: Path | None = None) -> str:
    """The workload's text in its fixed order, up to about `budget_chars` (whole chunks); a chunk
    seen before is skipped (the library repeats docstrings, e.g. _pyio / io, _pydecimal)."""
    out: list[str] = []
    seen: set[str] = set()
    size = 0
    for chunk in chunks(workload, corpus_file):
        digest = hashlib.sha256(chunk.encode()).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        out.append(chunk)
        size += len(chunk) + 2
        if size >= budget_chars:
            break
    return "\n\n".join(out)


def text_pieces(text: str, max_chars: int = 256 * 1024) -> list[str]:
    """Split at blank lines into pieces of at most ~max_chars, for /tokenize requests of bounded size."""
    pieces, current, size = [], [], 0
    for block in text.split("\n\n"):
        if size + len(block) > max_chars and current:
            pieces.append("\n\n".join(current) + "\n\n")
            current, size = [], 0
        current.append(block)
        size += len(block) + 2
    if current:
        pieces.append("\n\n".join(current))
    return pieces


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
