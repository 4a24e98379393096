"""Why the engine's mean prompt NLL sits above the oracle's: full logit rows, engine vs oracle.

    python -m deepinfer_sm80.testing.e2e.logit_rows [--model DIR] [--level base] [--lengths 12,48,130]
                                                    [--extra 16] [--work .cache/e2e] [--rows FILE.pt]
                                                    [--out FILE | --evidence] [--render JSON]

One offline engine (`rows_worker.py`, in `server_env(level)`'s environment, with the main E2E engine's
settings) returns the raw logit row of every prompt position of the E2E prompts (`runner._prompt`:
"short" for 12 tokens, "long" otherwise, as `make e2e-cpu` builds them) and of `--extra` independent
prompts. The oracle computes the same rows, in its two noise modes (GEMM order, fp32 activations) and
inside a forward 4 tokens longer (its "length" mode). `nll_shift.decompose` splits each
position's NLL shift into the curvature term that any noise independent of the row predicts, the
first-order term a scale or a correlated error would move, and the label lottery; this writes
WORK/e2e-nll-shift.json, or with --evidence results/e2e-nll-shift.json (provenance + `targets`);
`--rows` reuses an earlier engine dump, `--render` prints a result's tables (docs/E2E_CPU.md).
Exit 0 when every target is met, 1 when one is not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from deepinfer_sm80.testing.e2e import DEFAULT_WORK, CheckpointError, TreeError, check_checkpoint, server_env
from deepinfer_sm80.testing.e2e.models import SELECTING, fingerprint, snapshot, variant
from deepinfer_sm80.testing.e2e.tree import ROOT, canonical_level

DEFAULT_OUT = DEFAULT_WORK / "e2e-nll-shift.json"
EVIDENCE_OUT = ROOT / "results" / "e2e-nll-shift.json"
# The E2E prompts draw their ids uniformly from [2, 1000) (runner._prompt): the label lottery is
# averaged over that support, not over the whole vocabulary.
LABEL_SUPPORT = (2, 1000)
TAIL = [445, 960, 172, 26]  # 4 tokens appended for the oracle's length mode (the short case's greedy ones)
COMPARISONS = ("engine", "oracle_order", "oracle_fp32", "oracle_length")


def prompts(lengths: list[int], extra: int = 0, extra_tokens: int = 24) -> dict[str, list[int]]:
    """The E2E prompts of these lengths (runner._prompt: "short" at 12 tokens, "long" otherwise; the
    long ones are prefixes of each other) and `extra` independent prompts of extra_tokens each."""
    from deepinfer_sm80.testing.e2e.runner import _prompt

    out = {
        f"{'short' if n == 12 else 'long'}_{n}": _prompt("short" if n == 12 else "long", n) for n in lengths
    }
    for k in range(extra):
        out[f"extra_{k}"] = _prompt(f"nll-shift-{k}", extra_tokens)
    return out


def run_rows(level: str, model: Path, work: Path, plan_prompts: dict[str, list[int]], timeout: float) -> Path:
    """The engine's rows for plan_prompts, dumped by rows_worker into WORK/runs/rows-LEVEL/rows.pt."""
    from deepinfer_sm80.testing.e2e.runner import main_engine_kwargs

    run_dir = work / "runs" / f"rows-{level}"
    run_dir.mkdir(parents=True, exist_ok=True)
    plan_path, out_path, log_path = run_dir / "plan.json", run_dir / "rows.pt", run_dir / "engine.log"
    out_path.unlink(missing_ok=True)
    plan_path.write_text(
        json.dumps({"model": str(model), "engine": main_engine_kwargs(), "prompts": plan_prompts})
    )
    env = os.environ | server_env(level, work) | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    cmd = [sys.executable, "-m", "deepinfer_sm80.testing.e2e.rows_worker", str(plan_path), str(out_path)]
    with log_path.open("w") as log:
        try:
            rc = subprocess.run(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, cwd=run_dir
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    if rc != 0 or not out_path.exists():
        tail = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()][-3:]
        raise RuntimeError(f"rows engine failed (rc {rc}, log {log_path}): {' | '.join(tail)}")
    return out_path


def _e2e_logprobs(files: list[Path], level: str) -> dict[tuple[int, ...], tuple[str, list[float]]]:
    """The main engine's prompt logprobs at `level` in the committed E2E results, per prompt: the rows
    must reproduce them (log-softmax at the label) if this engine is the one those runs measured."""
    found: dict[tuple[int, ...], tuple[str, list[float]]] = {}
    for path in files:
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        sha = data.get("provenance", {}).get("git_sha", "unknown")
        for eng in data.get("engines", []):
            out = eng.get("levels", {}).get(level, {}) if eng.get("name") == "main" else {}
            for case in out.get("cases", []):
                for p in case.get("prompts", []):
                    lps = p.get("prompt_logprobs")
                    if lps and all(v is not None for v in lps):
                        found.setdefault(tuple(p["prompt"]), (f"{path.relative_to(ROOT)}@{sha[:12]}", lps))
    return found


def analyse(
    engine_rows: dict[str, Any], plan_prompts: dict[str, list[int]], oracle: Any, level: str
) -> dict[str, Any]:
    """Per prompt: the engine, and the oracle's two noise modes, each against the oracle (nll_shift)."""
    import torch

    from deepinfer_sm80.testing.e2e.compare import NOISE_MODES
    from deepinfer_sm80.testing.e2e.nll_shift import decompose, summarize

    recorded = _e2e_logprobs(
        [ROOT / "results" / "e2e-cpu.json", ROOT / "results" / "e2e-cpu-full-base.json"], level
    )
    out: dict[str, Any] = {}
    for name, prompt in plan_prompts.items():
        if name not in engine_rows:
            raise ValueError(f"the engine rows hold no prompt {name!r} (have {sorted(engine_rows)})")
        y = engine_rows[name].double()
        if y.shape != (len(prompt) - 1, oracle.oracle.vocab) or not torch.isfinite(y).all():
            raise ValueError(f"{name}: engine rows {tuple(y.shape)} incomplete or non-finite")
        labels = torch.tensor(prompt[1:])
        x = oracle.logits(prompt)[:-1].double()
        entry: dict[str, Any] = {
            "tokens": len(prompt),
            "engine": summarize(decompose(x, y, labels, LABEL_SUPPORT)),
        }
        for mode in NOISE_MODES:
            z = oracle.noise_logits(prompt, mode)[:-1].double()
            entry[f"oracle_{mode}"] = summarize(decompose(x, z, labels, LABEL_SUPPORT))
        # the same rows inside a forward 4 tokens longer: same code and rounding points, only the GEMM
        # shapes differ (the oracle is causal: rows of a prefix never see later tokens' values)
        z = oracle.logits(prompt + TAIL)[: len(prompt) - 1].double()
        entry["oracle_length"] = summarize(decompose(x, z, labels, LABEL_SUPPORT))
        got = torch.log_softmax(y, dim=-1).gather(1, labels[:, None]).squeeze(1)
        if tuple(prompt) in recorded:
            src, lps = recorded[tuple(prompt)]
            entry["e2e_logprobs"] = {
                "source": src,
                "max_abs_diff": float((got - torch.tensor(lps, dtype=torch.float64)).abs().max()),
            }
        out[name] = entry
    return out


# The rows must be the engine the E2E runs measured: log-softmax at the label equal to the logprob
# those runs recorded, up to fp32 rounding of values near 30 (ulp 2e-6) in two log-softmax orders.
E2E_REPRODUCE_TOL = 1e-3  # nats (the JSON keeps 3 decimals)


def build_report(per_prompt: dict[str, Any]) -> dict[str, Any]:
    """Targets and the across-prompt statistics of the independent (extra_*) prompts."""
    from deepinfer_sm80.testing.e2e.nll_shift import across
    from deepinfer_sm80.testing.e2e.runner import NLL_SHIFT_Z, _target

    targets: list[dict[str, Any]] = []
    for name, entry in per_prompt.items():
        rep = entry.get("e2e_logprobs")
        if rep is not None:
            targets.append(
                _target(
                    f"engine/{name}/rows_reproduce_e2e_logprobs",
                    rep["max_abs_diff"],
                    E2E_REPRODUCE_TOL,
                    "nats",
                    "max",
                    True,
                    f"the dumped rows are not the engine that {rep['source']} measured",
                )
            )
        if name.startswith("extra_"):
            continue
        z = entry["engine"]["residual"]["z"]
        targets.append(
            _target(
                f"engine/{name}/residual_shift_abs_z",
                None if z is None else abs(z),
                NLL_SHIFT_Z,
                "standard errors",
                "max",
                True,
                "observed minus predicted NLL shift beyond NLL_SHIFT_Z per-position standard errors",
            )
        )
    extra = [e for n, e in per_prompt.items() if n.startswith("extra_")]
    independent: dict[str, Any] = {}
    if len(extra) >= 2:
        independent = {c: across([e[c] for e in extra]) for c in COMPARISONS}
        for c in COMPARISONS:  # how often |z| in per-position standard errors > NLL_SHIFT_Z flags it
            zs = [e[c]["observed"]["z"] for e in extra]
            independent[c]["prompts_positive"] = sum(1 for e in extra if e[c]["observed"]["mean"] > 0)
            independent[c]["prompts_abs_z_above_gate"] = sum(
                1 for z in zs if z is not None and abs(z) > NLL_SHIFT_Z
            )
        eng = independent["engine"]
        for key, what in (
            ("residual", "observed minus predicted mean NLL shift"),
            ("scale", "logit scale - 1"),
        ):
            z = eng[key]["z"]
            targets.append(
                _target(
                    f"engine/independent_prompts/{key}_abs_z",
                    None if z is None else abs(z),
                    NLL_SHIFT_Z,
                    "standard errors",
                    "max",
                    True,
                    f"{what} beyond NLL_SHIFT_Z standard errors across independent prompts",
                )
            )
    return {"per_prompt": per_prompt, "independent": independent, "targets": targets}


def _pm(s: dict[str, Any], digits: int = 3) -> str:
    z = f" (z {s['z']:+.1f})" if s.get("z") is not None else ""
    return f"{s['mean']:+.{digits}f} ± {s['se']:.{digits}f}{z}"


def render(report: dict[str, Any]) -> str:
    """The two markdown tables of docs/E2E_CPU.md's section on the shift, from a results JSON."""
    from deepinfer_sm80.testing.e2e.runner import NLL_SHIFT_Z

    lines = [
        "| prompt (tokens) | observed shift | predicted (curvature) | first order | residual z | logit scale"
        " | oracle order / fp32 / length: observed |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, e in report["per_prompt"].items():
        if name.startswith("extra_"):
            continue
        g = e["engine"]
        modes = " / ".join(f"{e[c]['observed']['mean']:+.3f}" for c in COMPARISONS[1:])
        lines.append(
            f"| {name} ({e['tokens']}) | {_pm(g['observed'])} | {g['curvature']['mean']:+.3f} "
            f"| {g['first_order']['mean']:+.3f} | {g['residual']['z']:+.1f} "
            f"| {g['scale']['mean_scale']:.4f} ± {g['scale']['se']:.4f} | {modes} |"
        )
    ind = report.get("independent") or {}
    if ind:
        n = ind["engine"]["prompts"]
        lines += [
            "",
            f"| {n} independent prompts, vs the oracle | mean shift ± SE over prompts | predicted | residual"
            f" | prompts > 0 | prompts with per-position abs z > {NLL_SHIFT_Z:g} | SD of per-prompt z"
            " | logit scale - 1 |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for c in COMPARISONS:
            a = ind[c]
            lines.append(
                f"| {c} | {_pm(a['observed'])} | {a['curvature']['mean']:+.3f} | {_pm(a['residual'])} "
                f"| {a['prompts_positive']} of {n} | {a['prompts_abs_z_above_gate']} of {n} "
                f"| {a['residual_z_sd']:.2f} | {_pm(a['scale'], 4)} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(
        prog="python -m deepinfer_sm80.testing.e2e.logit_rows", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--model", type=Path, default=ROOT / ".cache" / "tiny-v41")
    ap.add_argument("--level", default="base")
    ap.add_argument(
        "--lengths", default="12,48,130", help="E2E prompt lengths (12: the short prompt, else the long)"
    )
    ap.add_argument("--extra", type=int, default=16, help="independent prompts besides the E2E ones")
    ap.add_argument("--extra-tokens", type=int, default=24)
    ap.add_argument("--work", type=Path, default=DEFAULT_WORK)
    ap.add_argument(
        "--rows", type=Path, default=None, help="an earlier rows.pt instead of running the engine"
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--evidence", action="store_true", help=f"write {EVIDENCE_OUT.relative_to(ROOT)}")
    ap.add_argument("--engine-timeout", type=float, default=3600.0)
    ap.add_argument("--render", type=Path, default=None, help="print a results JSON's tables and stop")
    args = ap.parse_args(argv)
    if args.render is not None:
        try:
            print(render(json.loads(args.render.read_text())))
        except (OSError, ValueError, KeyError) as err:
            print(
                f"logit_rows: --render {args.render}: not a logit_rows result ({type(err).__name__}: {err})",
                file=sys.stderr,
            )
            return 2
        return 0
    try:
        level = canonical_level(args.level)
        lengths = [int(x) for x in args.lengths.split(",") if x]
        if (
            min(lengths, default=3) < 3
            or args.extra < 0
            or args.extra_tokens < 3
            or not (lengths or args.extra)
        ):
            raise ValueError("need prompts of at least 3 tokens (--lengths, --extra, --extra-tokens)")
        if args.rows is not None and not (args.rows.is_file() and args.rows.with_suffix(".json").is_file()):
            raise ValueError(
                f"--rows {args.rows}: no such file, or no {args.rows.with_suffix('.json').name} next to it"
            )
        check_checkpoint(args.model)
        server_env(level, args.work.resolve())
    except (CheckpointError, TreeError, ValueError) as err:
        print(f"logit_rows: {err}", file=sys.stderr)
        return 2
    import torch

    from deepinfer_sm80.testing.e2e.runner import CachedOracle, _provenance
    from deepinfer_sm80.testing.oracle import V41Oracle

    if args.evidence:
        args.out = EVIDENCE_OUT
    work = args.work.resolve()
    ckpt = snapshot(args.model.resolve(), work)
    model = variant(ckpt, work, SELECTING)
    plan_prompts = prompts(lengths, args.extra, args.extra_tokens)
    prov = _provenance(argv) | {
        "command": "python -m deepinfer_sm80.testing.e2e.logit_rows " + " ".join(argv)
    }
    t0 = time.perf_counter()
    if args.rows is None:
        rows_path = run_rows(level, model, work, plan_prompts, args.engine_timeout)
        meta = {"provenance": prov, "level": level, "model": str(model), "fingerprint": fingerprint(ckpt)}
        rows_path.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    else:
        rows_path = args.rows
    meta = json.loads(rows_path.with_suffix(".json").read_text())
    if meta.get("level") != level:
        print(f"logit_rows: {rows_path} holds level {meta.get('level')!r}, not {level!r}", file=sys.stderr)
        return 2
    dump = torch.load(rows_path)
    engine_s = time.perf_counter() - t0
    print(f"logit_rows: engine rows in {rows_path} ({engine_s:.0f} s)", flush=True)
    try:
        per_prompt = analyse(dump["rows"], plan_prompts, CachedOracle(V41Oracle.load(model)), level)
    except ValueError as err:
        print(f"logit_rows: {err}", file=sys.stderr)
        return 2
    report = build_report(per_prompt)
    report = {
        "provenance": prov,
        "engine_rows": {
            "file": str(rows_path),
            "provenance": meta["provenance"],
            "start_s": dump.get("start_s"),
            "wall_s": dump.get("wall_s"),
        },
        "level": level,
        "checkpoint": {"snapshot": str(ckpt), "variant": str(model), "overrides": SELECTING},
        "label_support": list(LABEL_SUPPORT),
        "prompts": {k: len(v) for k, v in plan_prompts.items()},
    } | report
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    failed = [t["name"] for t in report["targets"] if not t["met"]]
    met = len(report["targets"]) - len(failed)
    print(f"logit_rows: {met}/{len(report['targets'])} targets met -> {args.out}")
    for name in failed:
        print(f"logit_rows: NOT MET {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
