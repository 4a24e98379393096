"""The shared prompt corpus: one workload's text tokenized once by the first server and stored
with the run; every later session checks the tokenizer against a canary before using it."""

from __future__ import annotations

import sys
from pathlib import Path

import aiohttp

from deepinfer_harness.prompts import CANARY, TokenCorpus
from deepinfer_harness.run.client import get_json
from deepinfer_harness.workloads import CorpusError, sha256_text, text_pieces, workload_text

EMPTY_CORPUS = TokenCorpus(ids=[], canary_ids=[], text_sha256="")  # cells sending conversations


async def tokenize(http: aiohttp.ClientSession, base_url: str, model: str, text: str) -> list[int]:
    body = {"model": model, "prompt": text, "add_special_tokens": False}
    return list((await get_json(http, f"{base_url}/tokenize", "POST", body))["tokens"])


async def ensure_corpus(
    http: aiohttp.ClientSession,
    base_url: str,
    model: str,
    path: Path,
    workload: str,
    need_tokens: int,
    corpus_file: Path | None = None,
) -> TokenCorpus:
    """Tokenize one workload's text once (first server, in pieces of bounded size) and store it;
    later sessions must reproduce the canary. Too few tokens for the largest prompt is one line."""
    canary = await tokenize(http, base_url, model, CANARY)
    if path.exists():
        corpus = TokenCorpus.load(path)
        if corpus.canary_ids != canary:
            raise RuntimeError(
                f"tokenizer drift: canary ids {canary[:8]}… != stored {corpus.canary_ids[:8]}…"
            )
        return corpus
    text = workload_text(workload, budget_chars(need_tokens), corpus_file)
    ids: list[int] = []
    for piece in text_pieces(text):
        ids += await tokenize(http, base_url, model, piece)
    if len(ids) < need_tokens:
        raise CorpusError(
            f"workload {workload}: its text ({len(text):,} characters) is {len(ids):,} tokens, fewer than "
            f"the largest prompt ({need_tokens:,}); "
            + ("give a larger --corpus file" if workload == "sharegpt" else "use workload code for it")
        )
    source = (
        str(corpus_file) if workload == "sharegpt" else f"Python {sys.version.split()[0]} standard library"
    )
    corpus = TokenCorpus(
        ids=ids, canary_ids=canary, text_sha256=sha256_text(text), workload=workload, source=source
    )
    corpus.save(path)
    return corpus


def budget_chars(need_tokens: int) -> int:
    """Text to take for `need_tokens`: 8 characters per token (BPE tokens average 3–5 on English and
    code; the tiny models' 1,024-entry vocabulary about 2–3) plus 64 K, never the whole library."""
    return 8 * need_tokens + 65_536
