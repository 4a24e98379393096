"""`run`: the only stage that touches servers. Sessions in ABBA order, cells in one fixed order.

Resume is free: a (cell, variant, rep) whose summary exists and is valid is skipped; an invalid
or partial one is moved to attempts/ and re-run. If the server dies mid-cell, the finished
requests stay in the JSONL, the cell is summarized as invalid, and the session ends cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from deepinfer_harness.cellctx import CellContext
from deepinfer_harness.client import make_session
from deepinfer_harness.config import Profile
from deepinfer_harness.launch import Launch, build_launch
from deepinfer_harness.layout import RunLayout, read_json, write_json
from deepinfer_harness.looplag import LoopLagProbe
from deepinfer_harness.plan import CellDef, Session
from deepinfer_harness.provenance import collect_variant, ensure_corpus, gpu_facts
from deepinfer_harness.records import JsonlWriter
from deepinfer_harness.scenarios import RECIPES
from deepinfer_harness.server import ServerDied, ServerHandle, start, stop, wait_healthy
from deepinfer_harness.summarize import summarize_from_files

GPU_SAMPLE_S = 2.0


@dataclass
class RunOptions:
    run_id: str
    model: str
    served_model: str
    progress: bool = True
    log: list[str] = field(default_factory=list)

    def say(self, line: str) -> None:
        self.log.append(line)
        print(line, file=sys.stderr, flush=True)


def limits_of(profile: Profile) -> dict[str, float]:
    return asdict(profile.validity)


@contextlib.contextmanager
def servers_up(launches: list[Launch], layout: RunLayout, session: int,
               timeout_s: float) -> Iterator[dict[str, ServerHandle]]:
    """Start every launch at once, then wait for each; tear all down on exit (Ctrl-C included)."""
    handles: dict[str, ServerHandle] = {}
    try:
        for launch in launches:
            handles[launch.variant] = start(launch, layout.server_log(launch.variant, session))
        for handle in handles.values():
            wait_healthy(handle, timeout_s)
        yield handles
    finally:
        for handle in handles.values():
            stop(handle)


async def _sample_gpus(samples: list[list[dict[str, str]]]) -> None:
    """nvidia-smi every GPU_SAMPLE_S during the cell (in a thread: it takes ~50 ms)."""
    while True:
        samples.append(await asyncio.to_thread(gpu_facts))
        await asyncio.sleep(GPU_SAMPLE_S)


async def _run_cell(ctx: CellContext, layout: RunLayout, handle: ServerHandle) -> None:
    cdef = ctx.cdef
    gpu_samples: list[list[dict[str, str]]] = []
    sampler = asyncio.create_task(_sample_gpus(gpu_samples)) if shutil.which("nvidia-smi") else None
    await ctx.idle_gate()  # parses /metrics (~40 ms of CPU): done before the lag probe starts
    async with LoopLagProbe() as probe:
        try:
            await RECIPES[cdef.cell.kind](ctx)
        finally:
            ctx.facts["loop_lag"] = probe.summary()
            if sampler:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
                ctx.facts["gpus"] = gpu_samples
    if not handle.alive():
        ctx.violations.append("server died during the cell")


def _save_cell(ctx: CellContext, layout: RunLayout, profile: Profile) -> dict:
    cell_id, variant, rep = ctx.cdef.id, ctx.variant, ctx.rep
    for label, text in ctx.facts.pop("metrics_text", {}).items():
        with gzip.open(layout.run_file(cell_id, variant, rep, f"metrics.{label}.prom.gz"), "wt") as fh:
            fh.write(text)  # ~50 KB of histogram buckets per scrape; gzip keeps results/ small
    facts = ctx.facts | {"violations": ctx.violations, "session": ctx.session,
                         "definition_sha256": ctx.cdef.definition_sha256, "min_steps": ctx.cdef.min_steps}
    write_json(layout.run_file(cell_id, variant, rep, "cell.json"), facts)
    summary = summarize_from_files(layout, cell_id, variant, rep, limits_of(profile))
    write_json(layout.run_file(cell_id, variant, rep, "summary.json"), summary)
    return summary


async def run_session(profile: Profile, layout: RunLayout, session: Session, cells: list[CellDef],
                      handle: ServerHandle, opts: RunOptions) -> dict:
    """Run every unfinished cell of one session against one healthy server; returns provenance."""
    todo = [c for c in cells if not layout.finished(c.id, session.variant, session.rep)]
    async with make_session(max(c.cell.concurrency for c in cells) + 2, profile.read_timeout_s) as http:
        facts = await collect_variant(http, handle, opts.served_model)
        corpus = await ensure_corpus(http, handle.base_url, opts.served_model, layout.corpus)
        for cdef in todo:
            layout.retire(cdef.id, session.variant, session.rep)
            path = layout.run_file(cdef.id, session.variant, session.rep, "jsonl")
            with JsonlWriter(path) as writer:
                ctx = CellContext(http, handle.base_url, opts.served_model, opts.run_id, session.variant,
                                  session.rep, session.index, corpus, writer, cdef, opts.progress,
                                  profile.validity.reset_prefix_cache)
                await _run_cell(ctx, layout, handle)
            summary = _save_cell(ctx, layout, profile)
            facts.setdefault("system_fingerprint", summary.get("system_fingerprint"))
            state = "valid" if summary["validity"]["valid"] else "INVALID " + "; ".join(
                summary["validity"]["violations"][:2])
            opts.say(f"{session.variant}.r{session.rep} {cdef.id}: {state}")
            if not handle.alive():
                opts.say(f"server {session.variant} died; session {session.index} ends early")
                break
    return facts


def run_all(profile: Profile, layout: RunLayout, sessions: list[Session], cells: list[CellDef],
            opts: RunOptions) -> dict:
    """Run (or resume) every session; returns per-session provenance for the manifest."""
    timeout = profile.server.health_timeout_s
    provenance: dict = read_json(layout.manifest).get("sessions", {}) if layout.manifest.exists() else {}

    def pending(s: Session) -> bool:
        return any(not layout.finished(c.id, s.variant, s.rep) for c in cells)

    def record(s: Session, launch: Launch, facts: dict) -> None:
        provenance[str(s.index)] = {"variant": s.variant, "rep": s.rep, "started_at": time.time(),
                                    "argv": launch.argv, "serve_args": launch.serve_args, "env": launch.env,
                                    "base_url": launch.base_url, **facts}

    todo = [s for s in sessions if pending(s)]
    if not todo:
        return provenance
    if profile.server.schedule == "concurrent":
        launches = {v: build_launch(profile, v, opts.model, opts.run_id, 0) for v in ("A", "B")}
        with servers_up(list(launches.values()), layout, 0, timeout) as handles:
            for s in todo:
                if not handles[s.variant].alive():
                    opts.say(f"server {s.variant} is down; session {s.index} not run")
                    continue
                facts = asyncio.run(run_session(profile, layout, s, cells, handles[s.variant], opts))
                record(s, launches[s.variant], facts)
        return provenance
    for s in todo:
        launch = build_launch(profile, s.variant, opts.model, opts.run_id, s.index)
        try:
            with servers_up([launch], layout, s.index, timeout) as handles:
                facts = asyncio.run(run_session(profile, layout, s, cells, handles[s.variant], opts))
                record(s, launch, facts)
        except (ServerDied, TimeoutError) as exc:  # its cells stay missing and are reported as such
            opts.say(f"session {s.index} ({s.variant}) not run: {str(exc).splitlines()[0]}")
    return provenance


def dry_run_lines(profile: Profile, sessions: list[Session], cells: list[CellDef], model: str,
                  run_id: str, out: Path) -> list[str]:
    lines = [f"# run {run_id} → {out}", f"# cells (one fixed order): {' '.join(c.id for c in cells)}"]
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
            lines.append(f"  client: {c.id} → POST {launch.base_url}/v1/completions "
                         f"(C={c.cell.concurrency}, n={c.n}, def {c.definition_sha256[:12]})")
    return lines
