"""`run`: the only stage that touches servers. Sessions in ABBA order, cells in one fixed order.

Resume: a run (cell, variant, rep) whose summary exists and is valid is skipped; an invalid or
partial one is moved to attempts/ and re-run; `resume_plan` says which and why before anything
starts. If the server dies mid-cell, the finished requests stay in the JSONL, that cell is
summarized as invalid and the session ends. A server that does not come up stops the whole run
(the next start would fail the same way): its runs are reported missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepinfer_harness.analysis.reader import RunReader
from deepinfer_harness.analysis.run_summary import limits_of, write_summary
from deepinfer_harness.config import Profile, profile_dict
from deepinfer_harness.layout import RunKey, RunLayout, write_json
from deepinfer_harness.lengths import max_length
from deepinfer_harness.manifest import model_fingerprint, record_session, recorded_sessions
from deepinfer_harness.plan import CellDef, Session
from deepinfer_harness.records import JsonlWriter
from deepinfer_harness.run.cell import CellContext
from deepinfer_harness.run.client import make_session
from deepinfer_harness.run.conversations import ConversationSet, ensure_conversations
from deepinfer_harness.run.corpus import EMPTY_CORPUS, ensure_corpus
from deepinfer_harness.run.launch import Launch, build_launch
from deepinfer_harness.run.looplag import LoopLagProbe
from deepinfer_harness.run.progress import Progress
from deepinfer_harness.run.provenance import collect_variant, gpu_facts
from deepinfer_harness.run.recipes import RECIPES
from deepinfer_harness.run.server import ServerDied, ServerHandle, serving
from deepinfer_harness.run.sweep import rate_for
from deepinfer_harness.sharegpt import corpus_use

GPU_SAMPLE_S = 2.0


@dataclass
class RunOptions:
    run_id: str
    model: str
    served_model: str
    progress: Progress = field(default_factory=lambda: Progress(enabled=False))

    def say(self, line: str) -> None:
        self.progress.say(line)


@dataclass
class RunOutcome:
    provenance: dict[str, Any]
    failures: list[str] = field(default_factory=list)  # sessions that could not run, with the cause


def corpus_needs(cells: list[CellDef]) -> dict[str, int]:
    """Per workload, the largest window any cell of the plan sends (tokens); cells that send whole
    ShareGPT conversations need no window."""
    needs: dict[str, int] = {}
    for c in cells:
        if c.conversation_prompts:
            continue
        largest = max_length(c.params["isl"]) if c.cell.kind == "rate" else c.cell.isl
        needs[c.cell.workload] = max(needs.get(c.cell.workload, 0), largest)
    return needs


def inflight_cap(cdef: CellDef) -> int:
    """Most requests a cell has in flight: its C, or for an open-loop cell its cap or every request
    (the connector must never queue a request the schedule sent: that would time the client)."""
    if cdef.cell.kind == "rate":
        return cdef.params.get("max_concurrency") or cdef.n
    return cdef.cell.concurrency


def corpus_path(profile: Profile) -> Path | None:
    return Path(profile.corpus_file).expanduser() if profile.corpus_file else None


def corpus_lines(profile: Profile, cells: list[CellDef]) -> list[str]:
    """One line per cell on the user's ShareGPT file: per conversation, or windows and why."""
    return [
        f"--corpus {profile.corpus_file} → {c.id}: "
        + corpus_use(
            c.cell.kind, c.params.get("isl", c.cell.isl), c.params.get("osl"), c.conversation_prompts
        )
        for c in cells
        if c.cell.workload == "sharegpt"
    ]


def resume_plan(layout: RunLayout, sessions: list[Session], cells: list[CellDef]) -> dict[str, list[RunKey]]:
    """Every scheduled run by what resuming will do with it: skip (valid), redo (invalid or
    partial: set aside to attempts/ first) or new."""
    plan: dict[str, list[RunKey]] = {"valid": [], "invalid": [], "partial": [], "none": []}
    for s in sessions:
        for c in cells:
            key = RunKey(c.id, s.variant, s.rep)
            plan[layout.state(key)].append(key)
    return plan


def describe_resume(run_id: str, plan: dict[str, list[RunKey]]) -> list[str]:
    total = sum(len(v) for v in plan.values())
    if len(plan["valid"]) == total:
        return [
            f"run {run_id} is complete: all {total} runs are finished and valid, none is re-run; "
            "the report is re-derived from its files"
        ]
    lines = [
        f"resuming run {run_id}: {len(plan['valid'])} of {total} runs finished and valid (skipped), "
        f"{len(plan['invalid'])} invalid and {len(plan['partial'])} partial (set aside to attempts/ "
        f"and re-run), {len(plan['none'])} not started"
    ]
    lines += [
        f"  re-run {k}: {why}"
        for why, keys in (("invalid", plan["invalid"]), ("partial", plan["partial"]))
        for k in keys[:10]
    ]
    return lines


async def _sample_gpus(samples: list[list[dict[str, str]]]) -> None:
    """nvidia-smi every GPU_SAMPLE_S during the cell (in a thread: it takes ~50 ms)."""
    while True:
        samples.append(await asyncio.to_thread(gpu_facts))
        await asyncio.sleep(GPU_SAMPLE_S)


async def _heartbeat(ctx: CellContext) -> None:
    """In a log (no terminal): one line every `every_s` while the cell runs (a 649K prefill or a
    CPU-interpreter request takes minutes; silence would look like a hang)."""
    t0 = time.monotonic()
    total = f"/{ctx.cdef.n}" if ctx.cdef.cell.kind != "decode" else ""
    while True:
        await asyncio.sleep(ctx.progress.every_s)
        ctx.progress.say(
            f"  {ctx.key}: {time.monotonic() - t0:.0f} s in the cell, "
            f"{ctx.writer.count}{total} requests finished (warm-up included)"
        )


async def _run_cell(ctx: CellContext) -> None:
    gpu_samples: list[list[dict[str, str]]] = []
    sampler = asyncio.create_task(_sample_gpus(gpu_samples)) if shutil.which("nvidia-smi") else None
    beat = asyncio.create_task(_heartbeat(ctx)) if ctx.progress.heartbeat else None
    try:
        await ctx.idle_gate()  # parses /metrics (~40 ms of CPU): done before the lag probe starts
        async with LoopLagProbe() as probe:
            try:
                await RECIPES[ctx.cdef.cell.kind](ctx)
            finally:
                ctx.facts["loop_lag"] = probe.summary()
    finally:
        for task in (beat, sampler):
            if task:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if sampler:
            ctx.facts["gpus"] = gpu_samples


def _save_cell(ctx: CellContext, layout: RunLayout, profile: Profile) -> dict:
    key = ctx.key
    for label, text in ctx.facts.pop("metrics_text", {}).items():
        with gzip.open(layout.run_file(key, f"metrics.{label}.prom.gz"), "wt") as fh:
            fh.write(text)  # ~50 KB of histogram buckets per scrape; gzip keeps results/ small
    facts = ctx.facts | {
        "violations": ctx.violations,
        "session": ctx.session,
        "definition_sha256": ctx.cdef.definition_sha256,
        "min_steps": ctx.cdef.min_steps,
    }
    write_json(layout.run_file(key, "cell.json"), facts)
    return write_summary(RunReader(layout), key, limits_of(profile_dict(profile)))


async def run_session(
    profile: Profile,
    layout: RunLayout,
    session: Session,
    cells: list[CellDef],
    handle: ServerHandle,
    opts: RunOptions,
    record: Callable[[dict], None] | None = None,
) -> dict:
    """Run every unfinished cell of one session against one healthy server; returns provenance.

    `record` is called with the session's provenance as soon as it is known (before the first
    cell) and again at the end, so an interrupted run keeps what each finished run was measured on."""
    todo = [c for c in cells if not layout.finished(RunKey(c.id, session.variant, session.rep))]
    async with make_session(max(map(inflight_cap, cells)) + 2, profile.read_timeout_s) as http:
        facts = await collect_variant(http, handle, opts.served_model)
        if record:
            record(facts)
        corpora = {
            w: await ensure_corpus(
                http, handle.base_url, opts.served_model, layout.corpus(w), w, need, corpus_path(profile)
            )
            for w, need in sorted(corpus_needs(cells).items())
        }
        convs = ConversationSet()
        source = corpus_path(profile)
        if source is not None and any(c.conversation_prompts for c in cells):
            convs = await ensure_conversations(
                http, handle.base_url, opts.served_model, layout.conversations(), source, cells
            )
        for i, cdef in enumerate(todo):
            key = RunKey(cdef.id, session.variant, session.rep)
            if not await asyncio.to_thread(handle.alive):
                opts.say(
                    f"server {session.variant} is down before {key}; session {session.index} ends, "
                    f"{len(todo) - i} runs not run"
                )
                break
            offered = None
            if cdef.cell.is_sweep_point:  # its rate: the run's recorded sweep decision (run/sweep.py)
                offered = rate_for(layout, cdef, cells)
                if offered is None:
                    anchors = " and ".join(a for a in (cdef.sweep_sync, cdef.sweep_probe) if a)
                    opts.say(
                        f"{key}: not run: its rate is placed from the measured rates of {anchors}, and "
                        "one has no valid run yet, nor one invalid for host load alone (resume runs it "
                        "once one exists)"
                    )
                    continue
            layout.retire(key)
            t0 = time.monotonic()
            with JsonlWriter(layout.run_file(key, "jsonl")) as writer:
                ctx = CellContext(
                    http=http,
                    base_url=handle.base_url,
                    model=opts.served_model,
                    run_id=opts.run_id,
                    variant=session.variant,
                    rep=session.rep,
                    session=session.index,
                    corpus=corpora.get(cdef.cell.workload, EMPTY_CORPUS),
                    conversations=convs,
                    writer=writer,
                    cdef=cdef,
                    progress=opts.progress,
                    reset_prefix_cache=profile.validity.reset_prefix_cache,
                    offered_rate=offered,
                )
                await _run_cell(ctx)
            alive = await asyncio.to_thread(handle.alive)  # health, not only the (lagging) process status
            if not alive:
                ctx.violations.append("server died during the cell")
            summary = _save_cell(ctx, layout, profile)
            facts.setdefault("system_fingerprint", summary.get("system_fingerprint"))
            state = (
                "valid"
                if summary["validity"]["valid"]
                else "INVALID: " + "; ".join(summary["validity"]["violations"][:2])
            )
            opts.say(f"{key} ({i + 1}/{len(todo)}, {time.monotonic() - t0:.1f} s): {state}")
            if not alive:
                opts.say(
                    f"server {session.variant} died: {handle.death_report()}"
                    f"; session {session.index} ends, {len(todo) - i - 1} runs not run"
                )
                break
    if record:
        record(facts)
    return facts


def run_all(
    profile: Profile, layout: RunLayout, sessions: list[Session], cells: list[CellDef], opts: RunOptions
) -> RunOutcome:
    """Run (or resume) every session; returns per-session provenance for the manifest."""
    timeout = profile.server.health_timeout_s
    outcome = RunOutcome(recorded_sessions(layout))

    def pending(s: Session) -> bool:
        return any(not layout.finished(RunKey(c.id, s.variant, s.rep)) for c in cells)

    def recorder(s: Session, launch: Launch) -> Callable[[dict], None]:
        """Writes this session's provenance into manifest.json (atomically) each time it is called."""
        started = time.time()

        def record(facts: dict) -> None:
            entry = {
                "variant": s.variant,
                "rep": s.rep,
                "started_at": started,
                "argv": launch.argv,
                "serve_args": launch.serve_args,
                "env": launch.recorded_env(),
                "base_url": launch.base_url,
                "image": launch.image,
                "model_fingerprint": model_fingerprint(opts.model),  # a checkpoint rebuilt mid-run
                **launch.arm_facts(),
                **facts,
            }
            outcome.provenance = record_session(layout, s.index, entry, profile, started)

        return record

    def log_for(session: int) -> Any:
        return lambda launch: layout.server_log(launch.variant, session) if launch.kind != "url" else None

    todo = [s for s in sessions if pending(s)]
    if profile.server.schedule == "concurrent" and todo:
        launches = {v: build_launch(profile, v, opts.model, opts.run_id, 0) for v in ("A", "B")}
        opts.say(f"starting servers A and B (health timeout {timeout:.0f} s)")
        try:
            with serving(list(launches.values()), log_for(0), timeout, opts.progress.waiting) as handles:
                opts.say("servers A and B healthy")
                for s in todo:
                    opts.say(f"session {s.index} ({s.variant}.r{s.rep}): traffic to the running server")
                    rec = recorder(s, launches[s.variant])
                    asyncio.run(run_session(profile, layout, s, cells, handles[s.variant], opts, rec))
        except (ServerDied, TimeoutError) as exc:
            outcome.failures.append(str(exc))
            opts.say(f"servers not up: {exc}")
        return outcome
    for n, s in enumerate(todo):
        launch = build_launch(profile, s.variant, opts.model, opts.run_id, s.index)
        what = "attaching to" if launch.kind == "url" else "starting"
        opts.say(
            f"session {s.index} ({s.variant}.r{s.rep}, {n + 1}/{len(todo)}): {what} server {s.variant} "
            f"at {launch.base_url}"
        )
        t0 = time.monotonic()
        try:
            with serving([launch], log_for(s.index), timeout, opts.progress.waiting) as handles:
                opts.say(f"server {s.variant} healthy after {time.monotonic() - t0:.0f} s")
                rec = recorder(s, launch)
                asyncio.run(run_session(profile, layout, s, cells, handles[s.variant], opts, rec))
        except (ServerDied, TimeoutError) as exc:  # its cells stay missing and are reported as such
            outcome.failures.append(f"session {s.index} ({s.variant}): {exc}")
            rest = len(todo) - n - 1
            opts.say(f"session {s.index} ({s.variant}) not run: {exc}")
            if rest:
                opts.say(
                    f"stopping: the other {rest} sessions would start the same way; fix the cause and "
                    f"resume with --run-id {opts.run_id}"
                )
            break
    return outcome


def describe_load(c: CellDef) -> str:
    """A rate cell's load in words: its rate (or ramp, or sweep point), process and bound."""
    cell = c.cell
    if cell.is_sweep_point and c.sweep_sync:
        rate = f"S + {cell.sweep_k}/{cell.sweep_of}·(T − S) (S: {c.sweep_sync}, T: {c.sweep_probe}, measured)"
    elif cell.is_sweep_point:
        rate = f"{cell.sweep_k}/{cell.sweep_of} of {c.sweep_probe}'s measured requests/s"
    elif cell.synchronous:
        rate = "one request at a time (synchronous)"
    elif cell.ramp:
        rate = f"{cell.ramp} ramp {cell.rate:g}→{cell.ramp_end:g}/s"
    else:
        rate = f"{cell.rate:g}/s"
    process = f"gamma burstiness {cell.burstiness:g}" if cell.arrival == "gamma" else cell.arrival
    bound = f", the {c.n} arrivals of the first {cell.duration_s:g} s" if cell.duration_s else ""
    return f"{rate} {process}{bound}"


def dry_run_lines(
    profile: Profile, sessions: list[Session], cells: list[CellDef], model: str, run_id: str, out: Path
) -> list[str]:
    lines = [
        f"# run {run_id} → {out}",
        f"# cells (one fixed order): {' '.join(c.id for c in cells)}",
        f"# {'A/A (declared: ab.aa)' if profile.ab.aa else 'A/B'}; only the env shown (and PATH, HOME, "
        "locale, TMPDIR, LD_LIBRARY_PATH) reaches a local server",
    ]
    lines += [f"# {line}" for line in corpus_lines(profile, cells)]  # one per cell on --corpus
    concurrent = profile.server.schedule == "concurrent"
    if concurrent:
        lines.append("# schedule concurrent: both arms start once; sessions alternate traffic")
        lines += [build_launch(profile, v, model, run_id, 0).describe() for v in ("A", "B")]
    for s in sessions:
        launch = build_launch(profile, s.variant, model, run_id, 0 if concurrent else s.index)
        lines.append(f"# session {s.index}: variant {s.variant} rep {s.rep}")
        if not concurrent:
            lines.append(launch.describe())
        for c in cells:
            load = (
                f"open loop {describe_load(c)}, ≤{inflight_cap(c)} in flight"
                if c.cell.kind == "rate"
                else f"C={c.cell.concurrency}"
            )
            route = "/v1/chat/completions" if c.cell.kind == "chat" else "/v1/completions"
            lines.append(
                f"  client: {c.id} → POST {launch.base_url}{route} "
                f"({load}, n={c.n}, def {c.definition_sha256[:12]})"
            )
    return lines
