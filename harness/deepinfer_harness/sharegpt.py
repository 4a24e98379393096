"""A ShareGPT file (`--corpus FILE`) as conversations, and how each cell kind can use it.

The file is a JSON list or JSONL of `{"conversations": [{"from": "human", "value": …}, …]}`.
Roles: `human`/`user` → user, `gpt`/`assistant`/`chatgpt`/`bard`/`bing`/`model` → assistant,
`system` → system; other turns are skipped.

Cells use it in one of two ways (`corpus_use`, one line per cell at the start of a run):
- per conversation, with its own turns and lengths: a chat cell sends one conversation per request
  (its turns up to its last user turn, through the chat template; the cell's L is the most prompt
  tokens a request may have, longer conversations are passed over); an open-loop rate cell whose
  `isl` is a range sends one conversation's first user turn per request (its own length, within
  the range) and, when `osl` is a range too, asks for its reply's length (within that range), as
  `vllm bench serve --dataset-name sharegpt` does;
- as windows of the joined user turns (never tiled), where a cell fixes every prompt's length:
  cold prefill, TTFT, decode, NLL, greedy, shared-prefix, and a rate cell with a fixed `isl`. A
  conversation's own length cannot be a fixed ISL; the line says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepinfer_harness.config import ConfigError

ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
}
CONVERSATIONS = "conversations"  # a CellDef's params["prompts"] when it sends whole conversations


class ShareGPTError(ConfigError):
    """One line (exit 2): the file cannot be read or holds no usable conversation."""


@dataclass(frozen=True)
class Conversation:
    index: int  # position in the file
    turns: tuple[tuple[str, str], ...]  # (role, text) in order, roles mapped as ROLES says

    def first_exchange(self) -> tuple[str, str | None] | None:
        """The first user turn and the assistant turn that answers it (None if none does)."""
        for i, (role, text) in enumerate(self.turns):
            if role == "user":
                nxt = self.turns[i + 1] if i + 1 < len(self.turns) else None
                return text, (nxt[1] if nxt and nxt[0] == "assistant" else None)
        return None

    def chat_messages(self) -> list[dict[str, str]]:
        """Its turns up to and including its last user turn (the prompt a chat request sends)."""
        last = max((i for i, (role, _) in enumerate(self.turns) if role == "user"), default=-1)
        return [{"role": role, "content": text} for role, text in self.turns[: last + 1]]


def _rows(path: Path) -> list[Any]:
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ShareGPTError(f"--corpus {path}: cannot read it ({exc})") from exc
    try:
        if raw.lstrip().startswith("["):
            rows = json.loads(raw)
        else:
            rows = [json.loads(ln) for ln in raw.splitlines() if ln.strip()]
    except json.JSONDecodeError as exc:
        raise ShareGPTError(f"--corpus {path}: not ShareGPT JSON or JSONL ({exc})") from exc
    return rows if isinstance(rows, list) else []


def conversations(path: Path) -> Iterator[Conversation]:
    """Every conversation of the file with at least one user turn, in file order."""
    found = 0
    for index, row in enumerate(_rows(path)):
        raw_turns = row.get("conversations") if isinstance(row, dict) else None
        turns = tuple(
            (ROLES[turn["from"]], str(turn.get("value", "")).strip())
            for turn in raw_turns or []
            if isinstance(turn, dict) and turn.get("from") in ROLES and str(turn.get("value", "")).strip()
        )
        if any(role == "user" for role, _ in turns):
            found += 1
            yield Conversation(index, turns)
    if not found:
        raise ShareGPTError(
            f'--corpus {path}: no human turns (expected {{"conversations": [{{"from": "human", …}}]}})'
        )


def user_turns(path: Path) -> Iterator[str]:
    """The user turns of every conversation, in order: the text the window cells cut."""
    for conv in conversations(path):
        yield from (text for role, text in conv.turns if role == "user")


def corpus_use(kind: str, isl: Any, osl: Any, conversation_prompts: bool) -> str:
    """How a sharegpt cell uses the file, in words: per conversation, or windows and why."""
    if conversation_prompts and kind == "chat":
        return (
            "one conversation per request: its own turns up to its last user turn, through the chat "
            "template, at most the cell's L prompt tokens (longer ones passed over)"
        )
    if conversation_prompts:
        reply = "and its reply's length as the output length" if isinstance(osl, dict) else "and a fixed OSL"
        return f"one conversation per request: its first user turn with its own length {reply}"
    return (
        f"windows of the joined user turns, not one conversation per request: every prompt of this "
        f"cell has exactly {isl} tokens, which a conversation's own length is not"
    )
