"""What a running cell needs: one client session, the arm's URL, the corpus and the JSONL writer.

Also the shared mechanics: request identity (`<run>-<cell>-<variant>-r<k>-<i>` with a salt hashed
from the same tuple), metric scrapes, and a closed loop that keeps C requests in flight.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from deepinfer_harness.layout import RunKey
from deepinfer_harness.plan import CellDef
from deepinfer_harness.prometheus import Snapshot, parse_metrics
from deepinfer_harness.prompts import TokenCorpus, sha256_ids
from deepinfer_harness.records import JsonlWriter, RequestRecord
from deepinfer_harness.run.client import chat_body, completion_body, get_json, get_text, stream_completion
from deepinfer_harness.run.conversations import ConversationSet
from deepinfer_harness.run.progress import NullBar, Progress

WARMUP_INDEX_BASE = 100_000  # warmup prompts never coincide with measured ones


def hash_text(text: str) -> int:
    """A stable integer for a message text (its prompt_sha256 hashes these, like token ids)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


@dataclass(kw_only=True)
class CellContext:
    http: aiohttp.ClientSession
    base_url: str
    model: str
    run_id: str
    variant: str
    rep: int
    session: int
    corpus: TokenCorpus
    writer: JsonlWriter
    cdef: CellDef
    progress: Progress = field(default_factory=lambda: Progress(enabled=False))
    reset_prefix_cache: bool = False
    # the ShareGPT conversations chat and rate cells send instead of windows (sharegpt.py)
    conversations: ConversationSet = field(default_factory=ConversationSet)
    facts: dict[str, Any] = field(default_factory=dict)  # cell-level facts for <variant>.r<k>.cell.json
    # a sweep point's rate (requests/s): placed from its anchors' measured rates, as the run's manifest
    # records it (run/sweep.py); None for every other cell, whose rate is in its id
    offered_rate: float | None = None
    violations: list[str] = field(default_factory=list)
    # salts hash the request id and this attempt's start: a re-run attempt against a server that
    # stayed up (url mode, resume) must not hit the prefix cache its failed attempt filled
    nonce: int = field(default_factory=time.time_ns)

    @property
    def key(self) -> RunKey:
        return RunKey(self.cdef.id, self.variant, self.rep)

    def new_record(
        self, index: int, phase: str, worker: int, prompt: list[int], max_tokens: int
    ) -> RequestRecord:
        tag = f"w{index}" if phase == "warmup" else str(index)
        request_id = f"{self.run_id}-{self.cdef.id}-{self.variant}-r{self.rep}-s{self.session}-{tag}"
        salt = hashlib.sha256(f"{request_id}-{self.nonce}".encode()).hexdigest()[:32]
        return RequestRecord(
            cell_id=self.cdef.id,
            variant=self.variant,
            rep=self.rep,
            session=self.session,
            index=index,
            worker=worker,
            phase=phase,
            request_id=request_id,
            cache_salt=salt,
            prompt_sha256=sha256_ids(prompt),
            prompt_len=len(prompt),
            max_tokens=max_tokens,
        )

    async def stream(
        self,
        index: int,
        phase: str,
        worker: int,
        prompt: list[int],
        max_tokens: int,
        token_ids: bool,
        salt: str | None = None,
    ) -> RequestRecord:
        """One streamed completion; `salt` (prefix cells) replaces the per-request cache salt."""
        rec = self.new_record(index, phase, worker, prompt, max_tokens)
        rec.cache_salt = salt or rec.cache_salt
        body = completion_body(
            self.model,
            prompt,
            max_tokens,
            salt=rec.cache_salt,
            request_id=rec.request_id,
            stream=True,
            token_ids=token_ids,
        )
        return await self._send(body, rec, want_ids=token_ids)

    async def stream_chat(
        self,
        index: int,
        phase: str,
        worker: int,
        messages: list[dict[str, str]],
        prompt_len: int,
        max_tokens: int,
    ) -> RequestRecord:
        """One streamed chat completion; `prompt_len` is the server's own count of the rendered
        prompt (/tokenize with the same messages and kwargs), so prompt_tokens is still checked."""
        rec = self.new_record(index, phase, worker, [], max_tokens)
        rec.prompt_len, rec.prompt_sha256 = (
            prompt_len,
            sha256_ids([hash_text(m["content"]) for m in messages]),
        )
        body = chat_body(
            self.model,
            messages,
            max_tokens,
            salt=rec.cache_salt,
            request_id=rec.request_id,
            thinking=bool(self.cdef.params.get("thinking")),
        )
        return await self._send(body, rec, want_ids=True, path="/v1/chat/completions")

    async def _send(
        self, body: dict[str, Any], rec: RequestRecord, *, want_ids: bool, path: str = "/v1/completions"
    ) -> RequestRecord:
        """Stream one request into `rec` and write its record (completions and chat alike)."""
        await stream_completion(self.http, self.base_url, body, rec, want_ids=want_ids, path=path)
        self.writer.write(rec)
        return rec

    async def scrape(self, label: str) -> str:
        """Fetch /metrics and keep the raw text for the .prom files; parsing (~40 ms for vLLM's
        histograms) happens in `summarize`, never on the loop while requests stream."""
        t_ns = time.perf_counter_ns()
        try:
            text = await get_text(self.http, f"{self.base_url}/metrics")
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self.violations.append(f"metrics scrape '{label}' failed: {type(exc).__name__}")
            return ""
        self.facts.setdefault("metrics_text", {})[label] = text
        self.facts.setdefault("scrape_ns", {})[label] = t_ns
        return text

    async def idle_gate(self) -> None:
        """Running = waiting = 0 before traffic starts (nothing is in flight, so parsing here is free)."""
        snap: Snapshot = parse_metrics(await self.scrape("idle"))
        running = snap.total("vllm:num_requests_running")
        waiting = snap.total("vllm:num_requests_waiting")
        if running or waiting:
            self.violations.append(f"idle gate: running={running:g} waiting={waiting:g}")
        if self.reset_prefix_cache:  # dev-mode route; false while any block is still held
            try:
                ok = (await get_json(self.http, f"{self.base_url}/reset_prefix_cache", "POST")).get("success")
            except (aiohttp.ClientError, OSError, ValueError) as exc:
                ok = f"{type(exc).__name__}"
            if ok is not True:
                self.violations.append(f"idle gate: /reset_prefix_cache answered {ok}")

    def bar(self, total: float | None, unit: str = "req") -> Any:
        bar: Any = self.progress.bar(total, unit, f"{self.variant}.r{self.rep} {self.cdef.id}")
        return bar if bar is not None else NullBar()


async def closed_loop(
    jobs: list[Callable[[int], Awaitable[RequestRecord]]],
    concurrency: int,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> list[RequestRecord]:
    """Run jobs with at most `concurrency` in flight; each worker sends its next job at once."""
    queue: asyncio.Queue = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    results: list[RequestRecord] = []

    async def worker(w: int) -> None:
        while True:
            try:
                job = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            rec = await job(w)
            results.append(rec)
            if on_done:
                on_done(rec)

    async with asyncio.TaskGroup() as group:  # Ctrl-C or one failure cancels every worker
        for w in range(concurrency):
            group.create_task(worker(w))
    return results
