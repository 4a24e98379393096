"""`DSparkSpeculator._sample_sequential` with fused draft kernels (docs/DSPARK.md, "Wiring").

By default each position runs upstream's Markov-bias GEMM and one `draft_step` launch. With
DEEPINFER_SM80_DSPARK_ONE_LAUNCH=1, all K positions run in one `draft_chain` launch where its in-kernel
bias equals upstream's GEMM bit for bit on this GPU and these weights (checked once, eagerly).
Configurations neither covers fall back to upstream's method.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch

from deepinfer_sm80.ops.dspark_draft import DraftScratch, chain, draft_step
from deepinfer_sm80.ops.dspark_draft.kernel import LOGIT_DTYPES

_SCRATCH_ATTR = "_deepinfer_dspark_scratch"
_CHAIN_ATTR = "_deepinfer_dspark_chain"  # (ChainScratch, bias check passed) once decided
PATH_ATTR = "_deepinfer_dspark_path"  # "chain" or "step": what the last call ran (for tests and logs)
# "1": the one-launch chain (bitwise vs upstream on the H200, not yet timed: docs/DSPARK.md); else per step
ENV_ONE_LAUNCH = "DEEPINFER_SM80_DSPARK_ONE_LAUNCH"


def markov_table(spec: Any) -> torch.Tensor | None:
    """markov_w1's weight [V, R] when the draft model exposes DSpark's Markov head, else None."""
    head = getattr(getattr(getattr(spec, "model", None), "model", None), "markov_head", None)
    weight = getattr(getattr(head, "markov_w1", None), "weight", None)
    return weight if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None


def markov_head_w2(spec: Any) -> torch.Tensor | None:
    """markov_w2's plain weight [V, R] (None when quantized or absent: the chain needs it in-kernel)."""
    head = getattr(getattr(getattr(spec, "model", None), "model", None), "markov_head", None)
    weight = getattr(getattr(head, "markov_w2", None), "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.dtype != torch.bfloat16:
        return None
    return weight if weight.is_contiguous() else None


def _chain(spec: Any, vocab: int, w1: torch.Tensor, w2: torch.Tensor | None) -> chain.ChainScratch | None:
    """The one-launch chain's scratch where it applies, after a one-time bitwise bias check (eager)."""
    if w2 is None or w2.shape != w1.shape or not w1.is_contiguous():
        return None
    if w1.dtype != torch.bfloat16 or w1.shape[1] < 16:
        return None
    held = getattr(spec, _CHAIN_ATTR, None)
    if held is None:
        if w1.is_cuda and torch.cuda.is_current_stream_capturing():
            return None  # decide (and allocate) outside graph capture only
        probe = torch.linspace(0, vocab - 1, chain.ROW_TILE, device=w1.device).long()  # [16] token ids
        embed = spec.model.markov_embed(probe).contiguous()
        # the one host sync of this module, once per speculator, outside any graph
        same = bool(torch.equal(spec.model.markov_bias(embed), chain.markov_bias(embed, w2)))
        scratch = chain.ChainScratch.allocate(spec.max_num_reqs, spec.num_speculative_steps, vocab, w1.device)
        held = (scratch, same)
        setattr(spec, _CHAIN_ATTR, held)
    scratch, same = held
    return scratch if same and scratch.logits.shape[1] == vocab else None


def unsupported(spec: Any, head_hidden: torch.Tensor) -> str | None:
    """Why upstream's method must run instead (None: the fused step applies)."""
    if getattr(spec, "_draft_topk", None) is not None:
        return "top-k Markov drafting"
    if getattr(spec, "use_confidence_head", False):
        return "confidence head consumes the Markov embeddings"
    if getattr(spec, "acceptance_estimator", None) is not None:
        return "acceptance estimator reads every position's logits"
    if getattr(spec, "draft_watermarker", None) is not None:
        return "watermarked draft sampling"
    if (
        getattr(spec, "_d2t_scatter_index", None) is not None
        or getattr(spec.model, "draft_id_to_target_id", None) is not None
    ):
        return "reduced draft vocabulary"
    if spec.draft_logits is not None and getattr(spec, "use_fp64_gumbel", False):
        return "fp64 Gumbel noise"
    if not (head_hidden.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        return "not a CUDA tensor"
    table = markov_table(spec)
    if table is None or table.stride(1) != 1 or table.shape[1] & (table.shape[1] - 1):
        return "no plain Markov embedding table"
    return None


def _scratch(spec: Any, vocab: int, table: torch.Tensor) -> tuple[DraftScratch, torch.Tensor] | None:
    rows = spec.max_num_reqs
    held = getattr(spec, _SCRATCH_ATTR, None)
    if held is not None and held[0].part_val.shape[1] * 1024 >= vocab and held[1].dtype == table.dtype:
        return held
    if table.is_cuda and torch.cuda.is_current_stream_capturing():
        return None  # never allocate persistent buffers from a graph's private pool
    held = (
        DraftScratch.allocate(rows, vocab, table.device),
        torch.empty(rows, table.shape[1], dtype=table.dtype, device=table.device),
    )
    setattr(spec, _SCRATCH_ATTR, held)
    return held


def sample_sequential(
    spec: Any, num_reqs: int, head_hidden: torch.Tensor, one_launch: bool | None = None
) -> bool:
    """The fused chain; False (nothing written) where upstream's method has to run instead.

    one_launch: try the one-launch chain (None: DEEPINFER_SM80_DSPARK_ONE_LAUNCH == "1").
    """
    if unsupported(spec, head_hidden) is not None:
        return False
    n_spec = spec.num_speculative_steps
    num_sample = num_reqs * n_spec
    sample_hidden = head_hidden[spec.sample_indices[:num_sample]]
    base_logits = spec.model.compute_draft_logits(sample_hidden)
    vocab = base_logits.shape[-1]
    table = markov_table(spec)
    cache = spec.draft_logits
    if base_logits.dtype not in LOGIT_DTYPES or (cache is not None and cache.dtype != base_logits.dtype):
        return False
    held = _scratch(spec, vocab, table)
    if held is None or table.shape[0] != vocab:
        return False
    scratch, rows = held
    base_logits = base_logits.view(num_reqs, n_spec, vocab)
    idx_map = spec.sample_idx_mapping[:num_sample].view(num_reqs, n_spec)
    sample_pos = spec.sample_pos[:num_sample].view(num_reqs, n_spec)
    gumbel = cache is not None
    if one_launch is None:
        one_launch = os.environ.get(ENV_ONE_LAUNCH) == "1"
    held_chain = (
        _chain(spec, vocab, table, markov_head_w2(spec))
        if one_launch and base_logits.dtype == torch.bfloat16
        else None
    )
    if held_chain is not None:
        setattr(spec, PATH_ATTR, "chain")
        chain.draft_chain(
            base_logits,
            spec.input_buffers.input_ids,
            spec._anchor_idx[:num_reqs],
            table,
            markov_head_w2(spec),
            spec.draft_tokens[:num_reqs],
            held_chain,
            gumbel=gumbel,
            idx_map=idx_map if gumbel else None,
            temperature=spec.temperature if gumbel else None,
            seeds=spec.seeds if gumbel else None,
            sample_pos=sample_pos if gumbel else None,
            logits_cache=cache,
        )
        return True
    embed = spec.model.markov_embed(spec.input_buffers.input_ids[spec._anchor_idx[:num_reqs]])
    for i in range(n_spec):
        bias = spec.model.markov_bias(embed)  # upstream's GEMM: bitwise the bias it would add
        if bias.dtype != base_logits.dtype or embed.dtype != rows.dtype:
            return False  # position 0, nothing written yet: upstream's chain adds the mixed dtypes
        setattr(spec, PATH_ATTR, "step")
        embed = rows[:num_reqs]
        draft_step(
            base_logits[:, i],
            bias,
            spec.draft_tokens[:num_reqs, i],
            scratch,
            gumbel=gumbel,
            idx_map=idx_map[:, i] if gumbel else None,
            temperature=spec.temperature if gumbel else None,
            seeds=spec.seeds if gumbel else None,
            sample_pos=sample_pos[:, i] if gumbel else None,
            logits_cache=cache,
            cache_col=i,
            markov_w1=table,
            row_out=embed,
        )
    return True


def wrap_sample_sequential(upstream: Callable[..., None]) -> Callable[..., None]:
    """Binding factory: the fused chain where it applies, upstream's `_sample_sequential` elsewhere."""

    @functools.wraps(upstream)
    def _sample_sequential(self: Any, num_reqs: int, head_hidden: torch.Tensor) -> None:
        if not sample_sequential(self, num_reqs, head_hidden):
            upstream(self, num_reqs, head_hidden)

    return _sample_sequential
