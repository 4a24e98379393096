"""DSpark top-k Markov drafting for DeepSeek-V4.1 (binding row `dspark_topk_bias`).

With `dspark_draft_topk` in the draft config, vLLM 0.32.0's `DSparkSpeculator._sample_sequential_topk`
(v1/worker/gpu/spec_decode/dspark/speculator.py:229) calls `self.model.apply_markov_bias_gathered`,
which `DSparkDeepseekV4ForCausalLM` (models/deepseek_v41/nvidia/dspark.py) does not define; only
`Qwen3DSparkForCausalLM` does. The row adds the method to the V4.1 class with the Qwen3 class's
semantics: the V4.1 drafter builds the same `DSparkMarkovHead` (unquantized: no quant_config is passed,
nvidia/dspark.py:145), so its `apply_bias_gathered` is the whole computation, called with the logits
processor's scale. Nothing else changes: upstream's speculator selects the k candidates once, fills the
dense buffer with -inf and samples the scattered corrections with its normal sampler.
"""

from __future__ import annotations

from typing import Any

import torch


def apply_markov_bias_gathered(
    self: Any,
    markov_embed: torch.Tensor,
    logits: torch.Tensor,
    values: torch.Tensor,
    index: torch.Tensor,
) -> torch.Tensor:
    """Scatter `values + scale * markov_w2[index] @ markov_embed` into `logits` at `index` (in place).

    markov_embed [B, r]; logits [B, V] (the caller's -inf buffer); values, index [B, k] (the top-k of
    the base logits). Returns `logits`, as upstream's head method does.
    """
    head = self.model.markov_head
    return head.apply_bias_gathered(markov_embed, logits, values, index, self.logits_processor.scale)
