"""Cases of the DSpark draft chain (ops/dspark_draft.py): the stand-in speculator that runs upstream
vLLM 0.32.0's own `DSparkSpeculator._sample_sequential` on our inputs (its model hooks are the eager ops
of the real draft model), used by bench/dspark_draft.py and tests/ops/test_dspark_draft.py, and the
poison its outputs start from. The inputs themselves are `testing.inputs.draft_inputs`."""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

from deepinfer_sm80.testing.inputs import DraftInputs

POISON_TOKEN = -0x5A5A5A5A  # draft tokens not written by the chain keep it
POISON_LOGIT = -3.25  # likewise the logits cache (Gumbel mode)


class DraftModel:
    """The draft-model hooks `_sample_sequential` calls, as eager ops (nn.Embedding, a bf16 linear)."""

    draft_id_to_target_id = None

    def __init__(self, w1: torch.Tensor, w2: torch.Tensor):
        self.w1, self.w2 = w1, w2
        head = SimpleNamespace(markov_w1=SimpleNamespace(weight=w1), markov_w2=SimpleNamespace(weight=w2))
        self.model = SimpleNamespace(markov_head=head)

    def compute_draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden  # the stand-in's "hidden states" are the base logits rows themselves

    def map_draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids

    def markov_embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.w1)

    def markov_bias(self, embed: torch.Tensor) -> torch.Tensor:
        return F.linear(embed, self.w2)


def stand_in(cls: Any, inp: DraftInputs, gumbel: bool) -> tuple[SimpleNamespace, torch.Tensor]:
    """A speculator carrying exactly the state `_sample_sequential` reads, and its head_hidden."""
    b, k, v = inp.base_logits.shape
    slots = inp.temperature.shape[0]
    dev = inp.base_logits.device
    extra = 3  # padding rows past the last sample, as the speculator's buffers have
    order = torch.randperm(b * k, generator=torch.Generator().manual_seed(b * k)).to(dev)
    head_hidden = torch.full((b * k + extra, v), 7.0, dtype=inp.base_logits.dtype, device=dev)
    head_hidden[order] = inp.base_logits.reshape(b * k, v)
    input_ids = torch.full((slots * k,), 5, dtype=torch.int32, device=dev)  # int32, as InputBuffers
    input_ids[torch.arange(b, device=dev) * k] = inp.anchor.int()
    ns = SimpleNamespace(
        num_speculative_steps=k,
        max_num_reqs=slots,
        model=DraftModel(inp.markov_w1, inp.markov_w2),
        sample_indices=torch.cat([order, torch.zeros(extra, dtype=torch.long, device=dev)]),
        sample_idx_mapping=torch.cat([inp.idx_map.reshape(-1), torch.full((extra,), -1, device=dev)]),
        sample_pos=torch.cat([inp.sample_pos.reshape(-1), torch.zeros(extra, dtype=torch.long, device=dev)]),
        input_buffers=SimpleNamespace(input_ids=input_ids),
        _anchor_idx=torch.arange(slots, device=dev) * k,
        temperature=inp.temperature,
        seeds=inp.seeds,
        draft_tokens=torch.full((slots, k), POISON_TOKEN, dtype=torch.long, device=dev),
        draft_logits=torch.full((slots, k, v), POISON_LOGIT, dtype=inp.base_logits.dtype, device=dev)
        if gumbel
        else None,
        _draft_topk=None,
        use_confidence_head=False,
        _d2t_scatter_index=None,
        _draft_scatter_buf=None,
        draft_watermarker=None,
        use_fp64_gumbel=False,
        acceptance_estimator=None,
        _step_cols=torch.arange(k, dtype=torch.int32, device=dev),
    )
    ns._sample_logits = functools.partial(cls._sample_logits, ns)
    ns._maybe_predict_acceptance = functools.partial(cls._maybe_predict_acceptance, ns)
    return ns, head_hidden
