"""DSpark top-k Markov drafting on DeepSeek-V4.1 (row `dspark_topk_bias`, issue 22 item 1).

Upstream's `DSparkDeepseekV4ForCausalLM` has no `apply_markov_bias_gathered`, which the speculator's
top-k chain calls (speculator.py:229): AttributeError at the first draft. With the row applied (forced
capability 8.0) upstream's own `_sample_sequential`, behind our `dspark_draft` wrapper (which hands
top-k drafting to upstream), drafts the tokens of an independent torch reference, bit for bit.

Bitwise without trusting one summation order: every weight, embedding and logit is a multiple of 2^-8
below 1 in magnitude (products 2^-8 apart, partial sums bounded by 0.82), so each sum is exact in bf16
and fp32 whatever the order; base logits are distinct, so the top-k set is unambiguous.
"""

from __future__ import annotations

import importlib
import types

import pytest
import torch
from torch import nn

pytest.importorskip("vllm.models.deepseek_v41.nvidia.dspark")

from deepinfer_sm80 import bindings
from deepinfer_sm80.integration.dspark_draft import wrap_sample_sequential
from deepinfer_sm80.testing.inputs import generator

MODULE = "vllm.models.deepseek_v41.nvidia.dspark"
ATTR = "apply_markov_bias_gathered"
V, R, K, TOPK = 384, 16, 5, 8


@pytest.fixture
def dspark(monkeypatch):
    """nvidia/dspark.py with its rows applied as patch 00's hook would at `capability` (restored after)."""
    mod = importlib.import_module(MODULE)
    cls = mod.DSparkDeepseekV4ForCausalLM
    assert ATTR not in vars(cls), "upstream's class defines the method itself now: the row is obsolete"

    def apply(capability: int):
        monkeypatch.setenv(bindings.ENV_FORCE_CAPABILITY, str(capability))
        return bindings.rebind(vars(mod), MODULE)

    yield mod, apply
    if ATTR in vars(cls):
        delattr(cls, ATTR)
    vars(mod).pop("__deepinfer_sm80_originals__", None)


def test_upstream_class_lacks_the_method(dspark) -> None:
    mod, _ = dspark
    with pytest.raises(AttributeError, match=ATTR):
        getattr(mod.DSparkDeepseekV4ForCausalLM, ATTR)


@pytest.mark.parametrize("capability", [80, 86, 89])
def test_row_adds_the_method_on_sm8x(dspark, capability: int) -> None:
    mod, apply = dspark
    chosen = apply(capability)
    assert chosen == {"dspark_topk_bias": "deepinfer_sm80.integration.dspark_topk:apply_markov_bias_gathered"}
    assert callable(getattr(mod.DSparkDeepseekV4ForCausalLM, ATTR))
    assert bindings.original(MODULE, f"DSparkDeepseekV4ForCausalLM.{ATTR}") is None  # upstream had none


def test_row_leaves_sm90_as_upstream(dspark) -> None:
    mod, apply = dspark
    assert apply(90) == {}
    assert not hasattr(mod.DSparkDeepseekV4ForCausalLM, ATTR)


def _grid(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Entries in {-1, 0, 1} / 16: products are multiples of 2^-8."""
    return (torch.randint(-1, 2, shape, generator=gen).float() / 16).bfloat16()


def _head(w1: torch.Tensor, w2: torch.Tensor):
    """Upstream's DSparkMarkovHead methods on its two weights (the module itself needs a TP group)."""
    from vllm.model_executor.models.qwen3_dspark import DSparkMarkovHead

    head = types.SimpleNamespace(
        markov_w1=nn.Embedding.from_pretrained(w1),
        markov_w2=types.SimpleNamespace(weight=w2, _retain_weight_for_gather=False, is_w4a16_nvfp4=False),
    )
    head.embed = types.MethodType(DSparkMarkovHead.embed, head)
    head.apply_bias_gathered = types.MethodType(DSparkMarkovHead.apply_bias_gathered, head)
    return head


def _speculator(mod, base: torch.Tensor, anchors: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor):
    """A DSparkSpeculator as its greedy top-k chain reads it (attributes set as __init__ sets them)."""
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    b = anchors.shape[0]
    model = mod.DSparkDeepseekV4ForCausalLM.__new__(mod.DSparkDeepseekV4ForCausalLM)
    nn.Module.__init__(model)
    model.model = types.SimpleNamespace(markov_head=_head(w1, w2))
    model.logits_processor = types.SimpleNamespace(scale=1.0)
    model.compute_draft_logits = lambda hidden: hidden.clone()  # the backbone's logits are the "hidden"

    class Spec:
        _sample_sequential = wrap_sample_sequential(DSparkSpeculator._sample_sequential)
        _sample_sequential_topk = DSparkSpeculator._sample_sequential_topk
        _sample_logits = DSparkSpeculator._sample_logits
        _maybe_predict_acceptance = DSparkSpeculator._maybe_predict_acceptance

    spec = Spec()
    spec.model, spec.num_speculative_steps, spec._draft_topk = model, K, TOPK
    spec.sample_indices = torch.arange(b * K)
    spec.sample_idx_mapping = torch.arange(b).repeat_interleave(K).int()
    spec.sample_pos = torch.arange(b * K)
    spec.input_buffers = types.SimpleNamespace(input_ids=anchors.repeat_interleave(K))
    spec._anchor_idx = torch.arange(b) * K
    spec._step_cols = torch.arange(K, dtype=torch.int32)
    spec.use_confidence_head = False
    spec.draft_logits = None  # greedy drafting (draft_sample_method "greedy")
    spec.acceptance_estimator = None
    spec.draft_watermarker = None
    spec.draft_tokens = torch.full((b, K), -7, dtype=torch.int64)
    return spec


def reference_chain(
    base: torch.Tensor, anchors: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor
) -> torch.Tensor:
    """Greedy top-k Markov chain in fp32 (exact here): candidates = top-k of U_i, token = first argmax."""
    b = anchors.shape[0]
    out = torch.empty(b, K, dtype=torch.int64)
    for r in range(b):
        prev = int(anchors[r])
        for i in range(K):
            u = base[r * K + i].float()
            cand = torch.topk(u, TOPK).indices
            dense = torch.full((V,), float("-inf"))
            dense[cand] = u[cand] + w2[cand].float() @ w1[prev].float()
            prev = int(torch.argmax(dense))
            out[r, i] = prev
    return out


@pytest.mark.parametrize("requests", [1, 4])
def test_topk_chain_matches_reference(dspark, requests: int) -> None:
    mod, apply = dspark
    apply(80)
    name = f"dspark-topk-b{requests}"
    gen = generator(name)
    w1, w2 = _grid((V, R), gen), _grid((V, R), gen)
    rows = [(torch.randperm(V, generator=gen) - V // 2).float() / 256 for _ in range(requests * K)]
    base = torch.stack(rows)
    base = base.bfloat16()  # distinct multiples of 2^-8 in [-0.75, 0.75): exact in bf16
    anchors = torch.randint(0, V, (requests,), generator=gen)
    spec = _speculator(mod, base, anchors, w1, w2)
    spec._sample_sequential(requests, base)
    want = reference_chain(base, anchors, w1, w2)
    assert torch.equal(spec.draft_tokens, want), f"{name}: {spec.draft_tokens.tolist()} != {want.tolist()}"
