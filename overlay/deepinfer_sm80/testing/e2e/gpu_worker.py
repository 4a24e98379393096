"""One GPU engine, several cases: runs inside the env `gpu.gpu_env(level)` returns (its own interpreter).

    python -m deepinfer_sm80.testing.e2e.gpu_worker PLAN.json OUT.json

The GPU twin of `worker.py` (same PLAN and OUT shapes, so `runner`'s checks read both), plus what only a
GPU run has: the engine's scheduler and graph settings as vLLM resolved them, the CUDA graphs captured
and replayed (counted on `torch.cuda.CUDAGraph`, per case), the device, its memory peak and the CUDA
stand-ins that took effect. Counting graphs is measurement, not a stand-in: the wrapped methods call
through unchanged.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

GRAPHS: Counter[str] = Counter()  # "capture" / "replay" calls on torch.cuda.CUDAGraph in this process


def _count_graphs() -> None:
    import torch

    cls = torch.cuda.CUDAGraph
    for method in ("capture_begin", "replay"):
        original = getattr(cls, method)
        if getattr(original, "_e2e_counted", False):
            continue

        def counted(self: Any, *args: Any, __m: str = method, __o: Any = original, **kwargs: Any) -> Any:
            GRAPHS[__m] += 1
            return __o(self, *args, **kwargs)

        counted._e2e_counted = True  # type: ignore[attr-defined]
        setattr(cls, method, counted)


def _engine_facts(llm: Any) -> dict[str, Any]:
    """The settings vLLM resolved (not the ones asked for)."""
    cfg = llm.llm_engine.vllm_config
    comp = cfg.compilation_config
    facts: dict[str, Any] = {
        "async_scheduling": bool(getattr(cfg.scheduler_config, "async_scheduling", False)),
        "enforce_eager": bool(cfg.model_config.enforce_eager),
        "compilation_mode": str(getattr(comp, "mode", getattr(comp, "level", None))),
        "cudagraph_mode": str(getattr(comp, "cudagraph_mode", None)),
        "cudagraph_capture_sizes": list(getattr(comp, "cudagraph_capture_sizes", None) or []),
        "custom_ops": list(getattr(comp, "custom_ops", []) or []),
        "block_size": getattr(cfg.cache_config, "block_size", None),
        "kv_cache_dtype": str(cfg.cache_config.cache_dtype),
        "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
        "max_num_seqs": cfg.scheduler_config.max_num_seqs,
        "chunked_prefill": bool(getattr(cfg.scheduler_config, "enable_chunked_prefill", False)),
        "prefix_caching": bool(cfg.cache_config.enable_prefix_caching),
        "speculative": None if cfg.speculative_config is None else str(cfg.speculative_config.method),
        "moe_backend": str(getattr(getattr(cfg, "kernel_config", None), "moe_backend", None)),
    }
    return facts


def run(plan: dict[str, Any]) -> dict[str, Any]:
    from deepinfer_sm80.testing.e2e import coverage, standins
    from deepinfer_sm80.testing.e2e.worker import _cpu, _spec_stats, prompt_results, sampling_params

    if os.environ.get(standins.CUDA_ENV_SWITCH) != "1":
        raise RuntimeError(
            f"gpu_worker: {standins.CUDA_ENV_SWITCH}=1 is not set (run it in gpu_env's environment)"
        )
    import torch

    _count_graphs()
    t0, c0 = time.perf_counter(), _cpu()
    from vllm import LLM, SamplingParams

    t_import = time.perf_counter() - t0
    llm = LLM(model=plan["model"], **plan["engine"])
    torch.cuda.synchronize()
    start = {"wall_s": time.perf_counter() - t0, "cpu_s": _cpu() - c0, "import_wall_s": t_import}
    print(f"gpu-worker: engine up in {start['wall_s']:.1f} s", flush=True)
    load_rows = coverage.counts()
    graphs_at_load = dict(GRAPHS)
    results = []
    for case in plan["cases"]:
        params = sampling_params(SamplingParams, case)
        before, graphs_before = coverage.snapshot(), Counter(GRAPHS)
        t = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in case["prompts"]], params, use_tqdm=False)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
        print(f"gpu-worker: case {case['name']}: {wall:.2f} s", flush=True)
        results.append(
            {
                "name": case["name"],
                "prompts": prompt_results(case, outs),
                "wall_s": wall,
                "rows": coverage.since(before),
                "graph_replays": GRAPHS["replay"] - graphs_before["replay"],
            }
        )
    props = torch.cuda.get_device_properties(0)
    return {
        "start": start,
        "engine_facts": _engine_facts(llm),
        "graphs_captured_at_load": graphs_at_load.get("capture_begin", 0),
        "graphs_replayed_total": GRAPHS["replay"],
        "load_rows": load_rows,
        "bound": dict(coverage.BOUND),
        "standins": list(standins.CUDA_APPLIED),
        "cases": results,
        "spec_decode": _spec_stats(llm),
        "aux": coverage.AUX,
        "device": {
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "max_memory_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m deepinfer_sm80.testing.e2e.gpu_worker PLAN.json OUT.json", file=sys.stderr)
        return 2
    plan = json.loads(Path(args[0]).read_text())
    try:
        out = run(plan)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # engine threads left behind must not hold the process
    Path(args[1]).write_text(json.dumps(out))
    sys.stdout.flush()
    os._exit(0)  # the engine's background threads and graph pools end with the process


if __name__ == "__main__":
    sys.exit(main())
