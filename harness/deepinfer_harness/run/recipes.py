"""Cell recipes (docs/AB_METHOD.md): cold prefill / TTFT, closed-loop decode, prompt-logprob NLL, greedy.

The runner applies the idle gate first. Each recipe only drives traffic and records raw facts
(request JSONL, metric scrapes labelled `before`/`after`, the decode window, loop lag); every
check and metric is computed later from those files by `summarize`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from deepinfer_harness.records import RequestRecord
from deepinfer_harness.run.cell import WARMUP_INDEX_BASE, CellContext, closed_loop
from deepinfer_harness.run.client import completion_body, prompt_logprobs

NLL_TOP_K = 1
DECODE_EXTENSION_FACTOR = 3  # the window may grow to 3× window_s to reach min_steps


async def run_prefill(ctx: CellContext) -> None:
    """prefill-cold and ttft cells: warmup at the same ISL, scrape, n requests, scrape."""
    cell, cdef = ctx.cdef.cell, ctx.cdef
    warm = [
        lambda w, i=i: ctx.stream(
            WARMUP_INDEX_BASE + i, "warmup", w, ctx.corpus.prompt(cell.isl, WARMUP_INDEX_BASE + i), 1, False
        )
        for i in range(cdef.warmup * cell.concurrency)
    ]
    await closed_loop(warm, cell.concurrency)
    await ctx.scrape("before")
    with ctx.bar(cdef.n) as bar:
        jobs = [
            lambda w, i=i: ctx.stream(i, "measure", w, ctx.corpus.prompt(cell.isl, i), 1, False)
            for i in range(cdef.n)
        ]
        await closed_loop(jobs, cell.concurrency, on_done=lambda _r: bar.update())
    await ctx.scrape("after")


async def run_greedy(ctx: CellContext) -> None:
    cell, cdef = ctx.cdef.cell, ctx.cdef
    await ctx.scrape("before")
    with ctx.bar(cdef.n) as bar:
        jobs = [
            lambda w, i=i: ctx.stream(i, "measure", w, ctx.corpus.prompt(cell.isl, i), cell.osl, True)
            for i in range(cdef.n)
        ]
        await closed_loop(jobs, cell.concurrency, on_done=lambda _r: bar.update())
    await ctx.scrape("after")


async def run_nll(ctx: CellContext) -> None:
    cell, cdef = ctx.cdef.cell, ctx.cdef

    async def score(index: int, phase: str) -> None:
        prompt = ctx.corpus.prompt(cell.isl, index)
        rec = ctx.new_record(index, phase, 0, prompt, 1)
        body = completion_body(
            ctx.model,
            prompt,
            1,
            salt=rec.cache_salt,
            request_id=rec.request_id,
            stream=False,
            token_ids=False,
            prompt_logprobs=NLL_TOP_K,
        )
        await prompt_logprobs(ctx.http, ctx.base_url, body, rec)
        ctx.writer.write(rec)

    await score(WARMUP_INDEX_BASE, "warmup")  # the first prompt-logprob request pays one-time setup
    await ctx.scrape("before")
    with ctx.bar(cdef.n, "doc") as bar:
        for i in range(cdef.n):
            await score(i, "measure")
            bar.update()
    await ctx.scrape("after")


async def wait_event(event: asyncio.Event, timeout_s: float) -> None:
    """Wait for `event` or `timeout_s`, whichever comes first (timed windows, not synchronization)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)


class _DecodeState:
    def __init__(self, concurrency: int) -> None:
        self.completed_first: set[int] = set()
        self.all_warm = asyncio.Event()
        self.stop = asyncio.Event()
        self.concurrency = concurrency
        self.window_events = 0
        self.t_open_ns: int | None = None

    def done(self, rec: RequestRecord) -> None:
        self.completed_first.add(rec.worker)
        if len(self.completed_first) == self.concurrency:
            self.all_warm.set()
        if self.t_open_ns is not None:
            self.window_events += sum(1 for t in rec.event_times_ns[1:] if t >= self.t_open_ns)


async def run_decode(ctx: CellContext) -> None:
    """Closed loop of C workers; prompts pre-assigned per slot (w, w+C, …) so both arms see the same.

    The window opens when every worker finished one request and warmup_s passed, and closes
    after window_s (extended up to 3× to reach min_steps); dispatch stops at close.
    """
    cell, cdef = ctx.cdef.cell, ctx.cdef
    c = cell.concurrency
    state = _DecodeState(c)
    t_start = time.perf_counter_ns()

    async def worker(w: int) -> None:
        j = 0
        while not state.stop.is_set():
            index = w + j * c
            phase = "warmup" if state.t_open_ns is None else "measure"
            rec = await ctx.stream(index, phase, w, ctx.corpus.prompt(cell.isl, index), cell.osl, True)
            state.done(rec)
            if not rec.ok:
                ctx.violations.append(f"worker {w} request {index} failed: {rec.error}")
                state.stop.set()
                state.all_warm.set()
            j += 1

    t_close_ns = 0
    # the group cancels every worker on Ctrl-C or on an error, so no request outlives the cell
    async with asyncio.TaskGroup() as group:
        for w in range(c):
            group.create_task(worker(w))
        with ctx.bar(cdef.window_s, "s") as bar:
            await state.all_warm.wait()
            remaining_s = cdef.warmup_s - (time.perf_counter_ns() - t_start) / 1e9
            if remaining_s > 0 and not state.stop.is_set():
                await wait_event(state.stop, remaining_s)
            await ctx.scrape("before")
            state.t_open_ns = time.perf_counter_ns()
            deadline_ns = state.t_open_ns + int(cdef.window_s * DECODE_EXTENSION_FACTOR * 1e9)
            window_end_ns = state.t_open_ns + int(cdef.window_s * 1e9)
            while not state.stop.is_set():
                now = time.perf_counter_ns()
                if now >= deadline_ns or (now >= window_end_ns and state.window_events >= cdef.min_steps):
                    break
                await wait_event(state.stop, 0.25)
                bar.update(0.25)
            t_close_ns = time.perf_counter_ns()
            state.stop.set()
            await ctx.scrape("after")
    ctx.facts["window"] = {"t_open_ns": state.t_open_ns, "t_close_ns": t_close_ns, "t_start_ns": t_start}


RECIPES = {
    "prefill-cold": run_prefill,
    "ttft": run_prefill,
    "decode": run_decode,
    "nll": run_nll,
    "greedy": run_greedy,
}
