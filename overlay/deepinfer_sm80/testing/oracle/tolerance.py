"""Engine-vs-oracle tolerances on the tiny V4.1 checkpoint, in bf16 epsilons (docs/ORACLE.md).

EPS = 2^-7 (torch.finfo(torch.bfloat16).eps). The engine and the oracle compute the same function with
the same rounding points (bf16 activations, fp8_ds_mla records, fp8 indexer Q/K, bf16 logits); they
differ in summation orders (and a few known choices, ORACLE.md), which flip individual rounding
decisions that then propagate. The oracle measures that kind of difference on itself by running its
GEMMs through another accumulation (`quant.fp32_gemms`, "order mode"): 4 prompts x 40 tokens of the
harness corpus per variant (scripts/oracle_calibrate.py, results/oracle/calibration-cpu.json). Worst
order-mode changes: default variant (no prompt of 40 tokens selects) 0.97 nats per token, 0.047 in a
prompt's mean NLL, 1.0 logit in a top-1 / top-2 margin; `--small-topk` variant (the indexer selects,
and its top-k picks flip too) 1.81, 0.102, 1.75. Each tolerance is about twice the worst case it covers.
"""

EPS = 2.0**-7

# per-token |NLL(engine) - NLL(oracle)|: 2.2 x the worst 1.81 (logits span ~ +-30 with the head's
# lognormal rows; ~3 % hidden-state noise moves one target logprob by up to ~1-2): gross errors only
NLL_TOKEN_TOL = 512 * EPS  # 4.0 nats

# |mean NLL(engine) - mean NLL(oracle)| over a prompt, no selecting layer: 2.7 x the worst 0.047; the
# calibration's deliberate mistakes (no sink 0.23, no fp8 KV records 0.25, no Engram 2.2, no inverse RoPE
# 3.4) all exceed it
NLL_MEAN_TOL = 16 * EPS  # 0.125 nats
# the same where the indexer selects (prompt longer than index_topk compressed states): 2.5 x the worst
# 0.102 (top-k flips add noise); it still catches "read every state" (0.73), no Engram, no inverse RoPE
# and no sink (0.36 there), not "ignore the candidate blocks" (0.06) or "no fp8 KV records" (0.10)
NLL_MEAN_TOL_SELECTING = 32 * EPS  # 0.25 nats

# greedy tokens must be equal where the oracle's top-1 / top-2 margin exceeds this: 2 x the worst
# margin change (1.0; 1.75 selecting), so the like-for-like noise cannot close such a margin
GREEDY_MARGIN = 256 * EPS  # 2.0 logits
GREEDY_MARGIN_SELECTING = 448 * EPS  # 3.5 logits


def tolerances(text_config: dict, n_tokens: int) -> dict[str, float]:
    """The tolerances for one prompt of n_tokens on a checkpoint with this text_config: the selecting
    ones once a ratio-1 layer holds more than index_topk states."""
    ratios = [r for r in text_config["compress_ratios"][: text_config["num_hidden_layers"]] if r > 0]
    selecting = bool(ratios) and n_tokens // min(ratios) > text_config["index_topk"]
    return {
        "nll_token": NLL_TOKEN_TOL,
        "nll_mean": NLL_MEAN_TOL_SELECTING if selecting else NLL_MEAN_TOL,
        "greedy_margin": GREEDY_MARGIN_SELECTING if selecting else GREEDY_MARGIN,
    }
