"""One engine, several cases: runs inside the env `server_env(level)` returns (its own interpreter).

    python -m deepinfer_sm80.testing.e2e.worker PLAN.json OUT.json

PLAN: {"model": dir, "engine": {LLM kwargs}, "cases": [{"name", "prompts": [[ids]], "max_tokens",
"logprobs"}]}. Each case's prompts go through one `LLM.generate` call in order (a later prompt can hit
the prefix cache an earlier one filled). OUT: per case and prompt the generated tokens and logprobs,
the prompt logprobs of the prompt's own tokens, the cached-token count, the wall and CPU seconds, and
the binding rows the case reached with their call counts (coverage.py); plus engine start times.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _prompt_logprobs(prompt: list[int], entries: list[Any] | None) -> list[float | None]:
    """logprob of prompt[i] given prompt[:i], i = 1..T-1 (vLLM's entry 0 is None)."""
    if entries is None:
        return []
    out: list[float | None] = []
    for i in range(1, len(prompt)):
        entry = entries[i] if i < len(entries) else None
        lp = entry.get(prompt[i]) if entry else None
        out.append(float(lp.logprob) if lp is not None else None)
    return out


def _step_logprobs(tokens: list[int], entries: list[Any] | None) -> list[dict[str, float]]:
    out: list[dict[str, float]] = []
    for entry in entries or []:
        out.append({str(tok): float(lp.logprob) for tok, lp in entry.items()})
    return out


def sampling_params(cls: Any, case: dict[str, Any]) -> Any:
    """Greedy sampling for one case (the caller passes vLLM's SamplingParams: it imports vLLM)."""
    return cls(
        max_tokens=case["max_tokens"],
        temperature=0.0,
        logprobs=case.get("logprobs", 2),
        prompt_logprobs=0 if case.get("prompt_logprobs", True) else None,
    )


def prompt_results(case: dict[str, Any], outs: list[Any]) -> list[dict[str, Any]]:
    """Per prompt of a case: its generated tokens and logprobs, its prompt logprobs, its cached tokens."""
    prompts = []
    for prompt, out in zip(case["prompts"], outs, strict=True):
        gen = out.outputs[0]
        prompts.append(
            {
                "prompt": prompt,
                "tokens": list(gen.token_ids),
                "logprobs": _step_logprobs(list(gen.token_ids), gen.logprobs),
                "prompt_logprobs": _prompt_logprobs(prompt, out.prompt_logprobs)
                if case.get("prompt_logprobs", True)
                else None,
                "num_cached_tokens": int(out.num_cached_tokens or 0),
            }
        )
    return prompts


def run(plan: dict[str, Any], finish: Callable[[Any, bool], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The plan's cases on one engine. `finish(llm, ok)` runs once the engine is up, after the cases or
    when one raised (ok False), and adds its dict to the output (the Ray case's driver, ray_engine.py: the
    stage actors' row dumps, then the engine's and Ray's shutdown before the interpreter's exit)."""
    from deepinfer_sm80.testing.e2e import coverage, standins

    if os.environ.get(standins.ENV_SWITCH) != "1":
        raise RuntimeError(f"worker: {standins.ENV_SWITCH}=1 is not set (run it in server_env's environment)")
    t0, c0 = time.perf_counter(), _cpu()
    from vllm import LLM, SamplingParams

    t_import = time.perf_counter() - t0
    llm = LLM(model=plan["model"], **plan["engine"])
    start = {"wall_s": time.perf_counter() - t0, "cpu_s": _cpu() - c0, "import_wall_s": t_import}
    print(f"e2e-worker: engine up in {start['wall_s']:.1f} s wall, {start['cpu_s']:.1f} s CPU", flush=True)
    load_rows = coverage.counts()
    results: list[dict[str, Any]] = []
    try:
        _run_cases(llm, plan, results, SamplingParams)
    except BaseException:
        if finish is not None:
            finish(llm, False)
        raise
    spec = _spec_stats(llm)
    finished = finish(llm, True) if finish is not None else {}
    return finished | {
        "scheduler": _scheduler(llm),
        "start": start,
        "load_rows": load_rows,
        "bound": dict(coverage.BOUND),
        "standins": list(standins.APPLIED),
        "cases": results,
        "spec_decode": spec,
        "aux": coverage.AUX,
    }


def _run_cases(llm: Any, plan: dict[str, Any], results: list[dict[str, Any]], params_cls: Any) -> None:
    """Each case of the plan through one `generate`, its record appended to `results`."""
    from deepinfer_sm80.testing.e2e import coverage

    for case in plan["cases"]:
        params = sampling_params(params_cls, case)
        before, aux_before, spec_before = coverage.snapshot(), len(coverage.AUX), _spec_stats(llm) or {}
        t, c = time.perf_counter(), _cpu()
        outs = llm.generate([{"prompt_token_ids": p} for p in case["prompts"]], params, use_tqdm=False)
        wall, cpu = time.perf_counter() - t, _cpu() - c
        print(f"e2e-worker: case {case['name']}: {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)
        results.append(
            {
                "name": case["name"],
                "prompts": prompt_results(case, outs),
                "wall_s": wall,
                "cpu_s": cpu,
                "rows": coverage.since(before),
                "aux_count": len(coverage.AUX) - aux_before,  # this process's drafter inputs (one stage)
                "spec_decode": {k: v - spec_before.get(k, 0.0) for k, v in (_spec_stats(llm) or {}).items()},
            }
        )


def _scheduler(llm: Any) -> str | None:
    """The scheduler the engine runs ("async" / "sync"), from its own config; None if unreadable."""
    try:
        on = llm.llm_engine.vllm_config.scheduler_config.async_scheduling
    except AttributeError:
        return None
    return "async" if on else "sync"


def _spec_stats(llm: Any) -> dict[str, float] | None:
    """Draft / accepted token totals from the engine's metrics (None without speculation)."""
    try:
        metrics = llm.get_metrics()
    except Exception:  # metrics are optional evidence; their absence is reported as None
        return None
    found: dict[str, float] = {}
    for m in metrics:
        name = getattr(m, "name", "")
        if "spec_decode" in name and hasattr(m, "value"):
            found[name] = float(m.value)
    return found or None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m deepinfer_sm80.testing.e2e.worker PLAN.json OUT.json", file=sys.stderr)
        return 2
    plan = json.loads(Path(args[0]).read_text())
    out = run(plan)
    Path(args[1]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
