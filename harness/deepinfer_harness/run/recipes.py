"""Cell recipes (docs/AB_METHOD.md): cold prefill / TTFT, closed-loop decode, prompt-logprob NLL, greedy,
open-loop request rate, shared prefix (cache on) and chat-template prompts.

The runner applies the idle gate first. Each recipe only drives traffic and records raw facts
(request JSONL, metric scrapes labelled `before`/`after`, the decode window, loop lag); every
check and metric is computed later from those files by `summarize`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from typing import Any

from deepinfer_harness.arrivals import schedule
from deepinfer_harness.lengths import draw, stable_seed
from deepinfer_harness.records import RequestRecord
from deepinfer_harness.run.cell import WARMUP_INDEX_BASE, CellContext, closed_loop
from deepinfer_harness.run.client import completion_body, get_json, prompt_logprobs

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


TIMELINE_BINS = 20  # a ramp's schedule is charted in this many bins (analysis/run_summary.py)


def ramp_bins(offsets: list[float], duration_s: float = 0.0) -> dict[str, Any]:
    """A ramp's offered load over time: the schedule's span (its duration bound, or the last
    send time) in TIMELINE_BINS bins of `bin_s` seconds, and how many arrivals each one holds."""
    span = duration_s or (offsets[-1] if offsets else 0.0)
    width = span / TIMELINE_BINS if span > 0 else 1.0
    counts = [0] * TIMELINE_BINS
    for t in offsets:
        counts[min(int(t / width), TIMELINE_BINS - 1)] += 1
    return {"bin_s": width, "scheduled": counts}


async def run_rate(ctx: CellContext) -> None:
    """Open loop (vllm bench serve --request-rate): request i is sent at its seeded arrival time
    whether or not earlier ones finished (at most max_concurrency in flight when set), so queueing
    shows up in TTFT once the rate passes what the server sustains. Arrival times come from
    arrivals.py (poisson, constant, or vllm bench serve's gamma process with its burstiness, a
    ramp-up, a duration bound); a sweep point's rate is the run's recorded one (ctx.offered_rate).
    Lengths are drawn per request (lengths.py) from the same seed in both arms, or with a ShareGPT
    corpus and an ISL range are each conversation's own (run/conversations.py); the warm-up runs
    first, closed loop, at C = 1."""
    cell, cdef, prm = ctx.cdef.cell, ctx.cdef, ctx.cdef.params
    seed = stable_seed(prm.get("seed", 0), cell.id)
    total = cdef.n + cdef.warmup
    if cdef.conversation_prompts:  # one ShareGPT conversation per request: its own lengths
        osl = prm.get("osl", cell.osl)
        fixed = osl if isinstance(osl, int) else None
        requests = [ctx.conversations.rate_request(i, fixed) for i in range(total)]
    else:
        isls = draw(prm.get("isl", cell.isl), total, seed)
        osls = draw(prm.get("osl", cell.osl), total, seed + 1)
        requests = [
            (ctx.corpus.prompt(isls[i], i if i < cdef.n else WARMUP_INDEX_BASE + i - cdef.n), osls[i])
            for i in range(total)
        ]
    for i in range(cdef.warmup):
        prompt, max_tokens = requests[cdef.n + i]
        await ctx.stream(WARMUP_INDEX_BASE + i, "warmup", 0, prompt, max_tokens, True)
    rate = ctx.offered_rate if cell.is_sweep_point else cell.rate
    offsets = schedule(cell, cdef.n, seed + 2, rate=rate)
    if len(offsets) != cdef.n:  # a duration cell's count is its schedule's, fixed by the plan
        ctx.violations.append(f"schedule has {len(offsets)} arrivals, the plan counted {cdef.n}")
        offsets = offsets[: cdef.n]
    cap = 1 if cell.synchronous else prm.get("max_concurrency")  # synchronous: one at a time
    gate = asyncio.Semaphore(cap) if cap else contextlib.nullcontext()
    late_ms: list[float] = []
    sent_s: list[float] = []
    await ctx.scrape("before")
    with ctx.bar(len(offsets)) as bar:
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            await asyncio.sleep(max(0.0, t0 + offsets[i] - time.perf_counter()))
            async with gate:
                now = time.perf_counter() - t0
                late_ms.append(1e3 * (now - offsets[i]))
                sent_s.append(now)
                await ctx.stream(i, "measure", 0, requests[i][0], requests[i][1], True)
            bar.update()

        async with asyncio.TaskGroup() as group:  # Ctrl-C or one failure cancels every request
            for i in range(len(offsets)):
                group.create_task(one(i))
    await ctx.scrape("after")
    ctx.facts["arrivals"] = {
        "t0_ns": round(t0 * 1e9),  # perf_counter at the schedule's t = 0 (records stamp the same clock)
        "timeline": ramp_bins(offsets, cell.duration_s) if cell.ramp else None,
        "offered_rate": rate,
        "arrival": cell.arrival,
        "schedule_s": offsets[-1] - offsets[0] if len(offsets) > 1 else 0.0,
        "first_offset_s": offsets[0] if offsets else 0.0,
        "send_late_ms_max": max(late_ms, default=0.0),
        "max_concurrency": cap,
        "synchronous": cell.synchronous or None,
        "burstiness": cell.burstiness or None,
        "ramp": (
            {"strategy": cell.ramp, "start_rps": cell.rate, "end_rps": cell.ramp_end} if cell.ramp else None
        ),
        "bound": "duration" if cell.duration_s else "count",
        "duration_s": cell.duration_s or None,
        "scheduled": len(offsets),
        "sent": len(sent_s),
        # a request held back by max_concurrency past the duration is still sent (both arms send
        # the same scheduled requests); this many were
        "sent_after_duration": sum(1 for t in sent_s if t >= cell.duration_s) if cell.duration_s else 0,
        "sweep": (
            {"k": cell.sweep_k, "of": cell.sweep_of, "probe": cdef.sweep_probe, "sync": cdef.sweep_sync}
            if cell.sweep_of
            else None
        ),
    }


async def run_prefix(ctx: CellContext) -> None:
    """Shared prefix, prefix cache on: every measured prompt starts with the same `prefix` ids and
    the requests of one run share one cache salt (salts seed the block hashes), so all but the
    first read the prefix from the cache; suffixes are disjoint windows after the prefix's text.
    The warm-up uses its own salt (a cold prefix), so the first measured request is cold too."""
    cell, cdef = ctx.cdef.cell, ctx.cdef
    shared = ctx.corpus.prompt(cell.prefix, 0)
    tail = cell.isl - cell.prefix
    skip = -(-cell.prefix // tail) + 1  # suffix windows start past the prefix's own window

    def prompt(i: int) -> list[int]:
        return shared + ctx.corpus.prompt(tail, skip + i)

    run_salt = hashlib.sha256(
        f"{ctx.run_id}-{cell.id}-{ctx.key.tag}-s{ctx.session}-{ctx.nonce}".encode()
    ).hexdigest()[:32]
    await ctx.stream(WARMUP_INDEX_BASE, "warmup", 0, prompt(WARMUP_INDEX_BASE), cell.osl, True)
    await ctx.scrape("before")
    with ctx.bar(cdef.n) as bar:
        jobs = [
            lambda w, i=i: ctx.stream(i, "measure", w, prompt(i), cell.osl, True, salt=run_salt)
            for i in range(cdef.n)
        ]
        await closed_loop(jobs, cell.concurrency, on_done=lambda _r: bar.update())
    await ctx.scrape("after")
    ctx.facts["shared_prefix"] = {"prefix_tokens": cell.prefix, "salt": run_salt}


async def run_chat(ctx: CellContext) -> None:
    """Chat-template prompts: each user message is the text of one corpus window (/detokenize), or
    with a ShareGPT corpus one conversation's own turns (run/conversations.py); the rendered
    prompt's length is the server's (/tokenize with the same messages and kwargs), and the request
    pins V4.1's thinking mode (chat_body)."""
    cell, cdef = ctx.cdef.cell, ctx.cdef
    kwargs = {"thinking": bool(cdef.params.get("thinking"))}
    prepared: list[tuple[list[dict[str, str]], int]] = []
    for j, i in enumerate([*range(cdef.n), WARMUP_INDEX_BASE]):
        if cdef.conversation_prompts:  # one ShareGPT conversation per request, its own turns
            messages = ctx.conversations.chat[j]["messages"]
        else:
            text = (
                await get_json(
                    ctx.http,
                    f"{ctx.base_url}/detokenize",
                    "POST",
                    {"model": ctx.model, "tokens": ctx.corpus.prompt(cell.isl, i)},
                )
            )["prompt"]
            messages = [{"role": "user", "content": text}]
        body = {
            "model": ctx.model,
            "messages": messages,
            "add_generation_prompt": True,
            "chat_template_kwargs": kwargs,
        }
        count = (await get_json(ctx.http, f"{ctx.base_url}/tokenize", "POST", body))["count"]
        prepared.append((messages, count))
    warm_messages, warm_len = prepared.pop()
    await ctx.stream_chat(WARMUP_INDEX_BASE, "warmup", 0, warm_messages, warm_len, cell.osl)
    await ctx.scrape("before")
    with ctx.bar(cdef.n) as bar:
        jobs = [
            lambda w, i=i: ctx.stream_chat(i, "measure", w, prepared[i][0], prepared[i][1], cell.osl)
            for i in range(cdef.n)
        ]
        await closed_loop(jobs, cell.concurrency, on_done=lambda _r: bar.update())
    await ctx.scrape("after")
    ctx.facts["chat"] = {"chat_template_kwargs": kwargs}


RECIPES = {
    "prefill-cold": run_prefill,
    "ttft": run_prefill,
    "decode": run_decode,
    "nll": run_nll,
    "greedy": run_greedy,
    "rate": run_rate,
    "prefix": run_prefix,
    "chat": run_chat,
}
