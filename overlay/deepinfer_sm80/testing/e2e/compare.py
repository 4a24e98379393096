"""The engine against the oracle, for one prompt: prompt NLL and greedy tokens.

- Prompt NLL: the mean over the prompt of -log p(token | prefix) the engine reported
  (`prompt_logprobs=0`) against the oracle's fp32 value; met when |difference of the means| <=
  `NLL_MEAN_TOL` and every token's |difference| <= `NLL_TOKEN_TOL` (the oracle's tolerances,
  argued in docs/ORACLE.md from the rounding the engine does and the oracle does not).
- The mean difference as a statistic: the per-token differences' spread gives the standard error
  of their mean, and `nll_shift_z` = mean / SE. A systematic error (a scale, a missing term) shifts
  every token the same way and grows z with the prompt's length; rounding noise does not. The
  oracle's own noise on the same sequence is measured too (`noise_sd`: its GEMMs in another order,
  and with no bf16 activation rounding), so the engine's spread can be read against both.
- Greedy: the oracle is teacher-forced on the engine's own continuation, so one near-tie cannot
  shift every later position; at each generated position where the oracle's top-1/top-2 logit
  margin exceeds `GREEDY_MARGIN`, the engine's token must be the oracle's top-1. Positions under
  the margin are counted, not compared.
"""

from __future__ import annotations

import math
from typing import Any

import torch

NOISE_MODES = ("order", "fp32")  # quant.fp32_gemms(), quant.fp32_activations() (docs/ORACLE.md)


def shift_stats(diffs: list[float]) -> dict[str, float | None]:
    """Signed per-token differences -> mean, sample SD, SE of the mean and z = mean / SE (None below
    2 tokens)."""
    n = len(diffs)
    if n < 2:
        return {"mean": diffs[0] if diffs else None, "sd": None, "se": None, "z": None}
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    se = sd / math.sqrt(n)
    z = mean / se if se > 0 else (0.0 if mean == 0 else math.inf)  # no spread: any shift is systematic
    return {"mean": mean, "sd": sd, "se": se, "z": z}


def _prompt_logprobs(logits: torch.Tensor, prompt: list[int]) -> list[float]:
    logp = torch.log_softmax(logits.float(), dim=-1)
    return [float(logp[i - 1, prompt[i]]) for i in range(1, len(prompt))]


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
    want_prompt = _prompt_logprobs(logits, prompt)
    got_prompt = result["prompt_logprobs"]
    requested = got_prompt is not None  # None: the case asked for none (a prefix-cache read, runner.Case)
    pairs = [(g, w) for g, w in zip(got_prompt or [], want_prompt, strict=False) if g is not None]
    nll_diff: float | None
    max_tok: float | None
    if len(pairs) != len(want_prompt) or not pairs:
        nll_diff, max_tok = None, None  # the engine did not report every prompt logprob
    else:
        nll_diff = abs(sum(-g for g, _ in pairs) / len(pairs) - sum(-w for _, w in pairs) / len(pairs))
        max_tok = max(abs(g - w) for g, w in pairs)
    # signed: engine NLL - oracle NLL per token (positive: the engine finds the prompt less likely)
    shift = shift_stats([w - g for g, w in pairs]) if nll_diff is not None else shift_stats([])
    noise_sd: dict[str, float | None] = {"engine": shift["sd"]}
    noisy = getattr(oracle, "noise_logits", None)
    for mode in NOISE_MODES if noisy is not None and requested else ():
        other = _prompt_logprobs(noisy(seq, mode), prompt)
        noise_sd[mode] = shift_stats([a - b for a, b in zip(other, want_prompt, strict=True)])["sd"]
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
        "nll_shift": shift["mean"],
        "nll_shift_se": shift["se"],
        "nll_shift_z": shift["z"],
        "noise_sd": noise_sd,
        "nll_compared": requested,
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
