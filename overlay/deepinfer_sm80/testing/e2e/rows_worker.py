"""The engine's full prompt logit rows: one offline `LLM`, run in `server_env(level)`'s environment.

    python -m deepinfer_sm80.testing.e2e.rows_worker PLAN.json OUT.pt

PLAN: {"model": dir, "engine": {LLM kwargs}, "prompts": {name: [ids]}}. The engine is asked for
`prompt_logprobs=-1` (every vocabulary entry; `max_logprobs=-1` lets it, sampling_params.py:921) with
`logprobs_mode="raw_logits"`, so each prompt position returns the raw logit row the LM head produced
(`sample/logprob.py:compute_topk_scores` gathers it in fp32) instead of log-softmax values.
OUT (torch.save): {"rows": {name: fp32 [T-1, V]}, "start_s", "wall_s": {name: s}}; row i is the
engine's logits at position i, the distribution of prompt[i + 1].
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch


def _rows(prompt: list[int], entries: list[Any] | None, vocab: int) -> torch.Tensor:
    """vLLM's prompt-logprob entries 1..T-1 (entry 0 is None) -> fp32 [T-1, vocab]; NaN where the
    engine returned no value (never expected with prompt_logprobs=-1; the reader checks)."""
    out = torch.full((len(prompt) - 1, vocab), float("nan"), dtype=torch.float32)
    for i in range(1, len(prompt)):
        entry = entries[i] if entries is not None and i < len(entries) else None
        for tok, lp in (entry or {}).items():
            out[i - 1, int(tok)] = float(lp.logprob)
    return out


def run(plan: dict[str, Any]) -> dict[str, Any]:
    from deepinfer_sm80.testing.e2e import standins

    if os.environ.get(standins.ENV_SWITCH) != "1":
        raise RuntimeError(
            f"rows_worker: {standins.ENV_SWITCH}=1 is not set (run it in server_env's environment)"
        )
    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams

    engine = dict(plan["engine"]) | {"max_logprobs": -1, "logprobs_mode": "raw_logits"}
    llm = LLM(model=plan["model"], **engine)
    start_s = time.perf_counter() - t0
    vocab = int(llm.llm_engine.model_config.get_vocab_size())
    print(f"rows_worker: engine up in {start_s:.1f} s, vocab {vocab}", flush=True)
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=-1)
    rows: dict[str, torch.Tensor] = {}
    walls: dict[str, float] = {}
    for name, prompt in plan["prompts"].items():
        t = time.perf_counter()
        (out,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        walls[name] = time.perf_counter() - t
        rows[name] = _rows(prompt, out.prompt_logprobs, vocab)
        print(f"rows_worker: {name} ({len(prompt)} tokens): {walls[name]:.1f} s", flush=True)
    return {"rows": rows, "start_s": start_s, "wall_s": walls, "vocab": vocab}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m deepinfer_sm80.testing.e2e.rows_worker PLAN.json OUT.pt", file=sys.stderr)
        return 2
    out = run(json.loads(Path(args[0]).read_text()))
    torch.save(out, args[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
