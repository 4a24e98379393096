"""The engine against the oracle, for one prompt: prompt NLL and greedy tokens.

- Prompt NLL: the mean over the prompt of -log p(token | prefix) the engine reported
  (`prompt_logprobs=0`) against the oracle's fp32 value; met when |difference of the means| <=
  `NLL_MEAN_TOL` and every token's |difference| <= `NLL_TOKEN_TOL` (the oracle's tolerances,
  argued in docs/ORACLE.md from the rounding the engine does and the oracle does not).
- Greedy: the oracle is teacher-forced on the engine's own continuation, so one near-tie cannot
  shift every later position; at each generated position where the oracle's top-1/top-2 logit
  margin exceeds `GREEDY_MARGIN`, the engine's token must be the oracle's top-1. Positions under
  the margin are counted, not compared.
"""

from __future__ import annotations

from typing import Any

import torch


def tolerances(oracle: Any, n_tokens: int) -> tuple[float, float, float]:
    """(mean NLL, per-token logprob, greedy margin) tolerances for a prompt of n_tokens, from the
    oracle package's `tolerances(text_config, n_tokens)` (the selecting ones once the indexer selects)."""
    from deepinfer_sm80.testing import oracle as pkg

    text = getattr(oracle, "t", None) or oracle.oracle.t
    tol = pkg.tolerances(text, n_tokens)
    return float(tol["nll_mean"]), float(tol["nll_token"]), float(tol["greedy_margin"])


def compare_case(oracle: Any, result: dict[str, Any]) -> dict[str, Any]:
    """`result`: one prompt of a worker case (prompt, tokens, prompt_logprobs)."""
    nll_tol, token_tol, margin_tol = tolerances(oracle, len(result["prompt"]))
    prompt: list[int] = result["prompt"]
    tokens: list[int] = result["tokens"]
    seq = prompt + tokens
    logits = oracle.logits(seq).float()  # [T, vocab]
    logp = torch.log_softmax(logits, dim=-1)
    want_prompt = [float(logp[i - 1, prompt[i]]) for i in range(1, len(prompt))]
    got_prompt = result["prompt_logprobs"]
    pairs = [(g, w) for g, w in zip(got_prompt, want_prompt, strict=False) if g is not None]
    nll_diff: float | None
    max_tok: float | None
    if len(pairs) != len(want_prompt) or not pairs:
        nll_diff, max_tok = None, None  # the engine did not report every prompt logprob
    else:
        nll_diff = abs(sum(-g for g, _ in pairs) / len(pairs) - sum(-w for _, w in pairs) / len(pairs))
        max_tok = max(abs(g - w) for g, w in pairs)
    mismatches, compared, near_ties, margins = 0, 0, 0, []
    for j, tok in enumerate(tokens):
        row = logits[len(prompt) - 1 + j]
        top2 = torch.topk(row, 2)
        margin = float(top2.values[0] - top2.values[1])
        margins.append(round(margin, 4))
        if margin <= margin_tol:
            near_ties += 1
            continue
        compared += 1
        if tok != int(top2.indices[0]):
            mismatches += 1
    return {
        "prompt_tokens": len(prompt),
        "generated": tokens,
        "oracle_top1": [int(torch.argmax(logits[len(prompt) - 1 + j])) for j in range(len(tokens))],
        "oracle_margins": margins,
        "nll_engine": (sum(-g for g, _ in pairs) / len(pairs)) if pairs else None,
        "nll_oracle": sum(-w for w in want_prompt) / max(len(want_prompt), 1),
        "nll_abs_diff": nll_diff,
        "max_token_logprob_abs_diff": max_tok,
        "nll_tol": nll_tol,
        "token_tol": token_tol,
        "margin_tol": margin_tol,
        "nll_ok": nll_diff is not None
        and max_tok is not None
        and nll_diff <= nll_tol
        and max_tok <= token_tol,
        "greedy_compared": compared,
        "greedy_near_ties": near_ties,
        "greedy_mismatches": mismatches,
    }
