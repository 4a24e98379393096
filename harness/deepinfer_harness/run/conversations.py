"""The conversations of the user's ShareGPT file that the chat and rate cells send, chosen once
per run by the first server and stored (`prompts/conversations-sharegpt.json`), so both arms and
every session send the same ones (sharegpt.py says which cells send conversations).

- rate cells with an `isl` range: the first user turn of each conversation, tokenized by the
  server (`/tokenize`, no special tokens, as the windows are), kept when its length lies inside
  the range and, when `osl` is a range, its reply's token count inside that one; n + warm-up of
  them, in file order.
- chat cells: each conversation's turns up to its last user turn, kept when the server's chat
  template renders them (`/tokenize` with the messages and the pinned thinking mode) to at most
  the cell's L tokens; n + 1 of them (the warm-up included), in file order.

Later sessions reuse the stored choice after the tokenizer reproduces the canary. Too few
conversations that fit is one line naming the counts and the bounds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from deepinfer_harness.layout import read_json, write_json
from deepinfer_harness.plan import CellDef
from deepinfer_harness.prompts import CANARY
from deepinfer_harness.run.client import get_json
from deepinfer_harness.sharegpt import Conversation, conversations
from deepinfer_harness.workloads import CorpusError


@dataclass(frozen=True)
class RateNeed:
    count: int
    isl: tuple[int, int]  # the first user turn's token count must lie in [min, max]
    osl: tuple[int, int] | None  # the reply's token count, when the output length is the reply's


@dataclass(frozen=True)
class ChatNeed:
    count: int
    max_tokens: int  # the rendered prompt's most tokens (the cell's L)
    thinking: bool


@dataclass
class ConversationSet:
    """What the cells send: rate prompts (token ids) with their output lengths, chat messages."""

    rate: list[dict[str, Any]] = field(default_factory=list)  # {index, prompt_ids, reply_tokens}
    chat: list[dict[str, Any]] = field(default_factory=list)  # {index, messages}

    def rate_request(self, i: int, fixed_osl: int | None) -> tuple[list[int], int]:
        item = self.rate[i]
        return list(item["prompt_ids"]), fixed_osl if fixed_osl is not None else int(item["reply_tokens"])


def _bounds(spec: int | dict[str, Any]) -> tuple[int, int]:
    return (spec, spec) if isinstance(spec, int) else (int(spec["min"]), int(spec["max"]))


def needs(cells: list[CellDef]) -> tuple[RateNeed | None, ChatNeed | None]:
    """What the plan's conversation cells need (all rate cells share one plan, as do chat cells)."""
    rate = [c for c in cells if c.conversation_prompts and c.cell.kind == "rate"]
    chat = [c for c in cells if c.conversation_prompts and c.cell.kind == "chat"]
    rate_need = chat_need = None
    if rate:
        osl = rate[0].params["osl"]
        rate_need = RateNeed(
            max(c.n + c.warmup for c in rate),
            _bounds(rate[0].params["isl"]),
            None if isinstance(osl, int) else _bounds(osl),
        )
    if chat:
        chat_need = ChatNeed(
            max(c.n + 1 for c in chat),
            min(c.cell.isl for c in chat),
            bool(chat[0].params.get("thinking")),
        )
    return rate_need, chat_need


async def _count(http: aiohttp.ClientSession, base_url: str, body: dict[str, Any]) -> list[int]:
    return list((await get_json(http, f"{base_url}/tokenize", "POST", body))["tokens"])


async def _rate(
    http: aiohttp.ClientSession,
    base_url: str,
    model: str,
    convs: list[Conversation],
    need: RateNeed,
    path: Path,
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for conv in convs:
        exchange = conv.first_exchange()
        if exchange is None or (need.osl is not None and exchange[1] is None):
            continue
        ids = await _count(
            http, base_url, {"model": model, "prompt": exchange[0], "add_special_tokens": False}
        )
        if not need.isl[0] <= len(ids) <= need.isl[1]:
            continue
        reply = 0
        if need.osl is not None and exchange[1] is not None:
            reply = len(
                await _count(
                    http, base_url, {"model": model, "prompt": exchange[1], "add_special_tokens": False}
                )
            )
            if not need.osl[0] <= reply <= need.osl[1]:
                continue
        out.append({"index": conv.index, "prompt_ids": ids, "reply_tokens": reply})
        if len(out) == need.count:
            return out
    reply_text = f" and a reply of {need.osl[0]}–{need.osl[1]} tokens" if need.osl else ""
    raise CorpusError(
        f"--corpus {path}: {len(out)} of the {need.count} conversations the rate cells send have a first "
        f"user turn of {need.isl[0]}–{need.isl[1]} tokens{reply_text}; give a larger file or widen "
        "plan.rate.isl / plan.rate.osl"
    )


async def _chat(
    http: aiohttp.ClientSession,
    base_url: str,
    model: str,
    convs: list[Conversation],
    need: ChatNeed,
    path: Path,
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    kwargs = {"thinking": need.thinking}
    for conv in convs:
        messages = conv.chat_messages()
        body = {
            "model": model,
            "messages": messages,
            "add_generation_prompt": True,
            "chat_template_kwargs": kwargs,
        }
        if len(await _count(http, base_url, body)) <= need.max_tokens:
            out.append({"index": conv.index, "messages": messages})
            if len(out) == need.count:
                return out
    raise CorpusError(
        f"--corpus {path}: {len(out)} of the {need.count} conversations the chat cells send render to at "
        f"most {need.max_tokens} prompt tokens; give a larger file or raise plan.chat.isl"
    )


async def ensure_conversations(
    http: aiohttp.ClientSession,
    base_url: str,
    model: str,
    path: Path,
    corpus_file: Path,
    cells: list[CellDef],
) -> ConversationSet:
    """The stored choice (`path`), or choose now with this server and store it."""
    canary = await _count(http, base_url, {"model": model, "prompt": CANARY, "add_special_tokens": False})
    if path.exists():
        stored = read_json(path)
        if stored["canary_ids"] != canary:
            raise RuntimeError(
                f"tokenizer drift: canary ids {canary[:8]}… != stored {stored['canary_ids'][:8]}…"
            )
        return ConversationSet(stored.get("rate", []), stored.get("chat", []))
    rate_need, chat_need = needs(cells)
    convs = list(conversations(corpus_file))
    chosen = ConversationSet(
        await _rate(http, base_url, model, convs, rate_need, corpus_file) if rate_need else [],
        await _chat(http, base_url, model, convs, chat_need, corpus_file) if chat_need else [],
    )
    write_json(
        path,
        {
            "source": str(corpus_file),
            "file_sha256": hashlib.sha256(corpus_file.read_bytes()).hexdigest(),
            "canary_ids": canary,
            "rate": chosen.rate,
            "chat": chosen.chat,
        },
    )
    return chosen
