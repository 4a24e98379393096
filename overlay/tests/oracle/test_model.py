"""The oracle on the tiny V4.1 checkpoint: API shapes, causality, selection, the margin distribution."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import torch

from deepinfer_sm80.testing.oracle import GREEDY_MARGIN, V41Oracle

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The checkpoint, and the --small-topk variant's config changes (the bytes are the same)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import make_tiny_v41 as T

    out = tmp_path_factory.mktemp("tiny-v41")
    T.build(out)
    return out, dict(T.SMALL_TOPK)


@pytest.fixture(scope="module")
def oracle(ckpts: tuple[Path, dict]) -> V41Oracle:
    return V41Oracle.load(ckpts[0])


@pytest.fixture(scope="module")
def prompt(ckpts: tuple[Path, dict]) -> list[int]:
    from tokenizers import Tokenizer

    from deepinfer_harness.prompts import corpus_text

    return Tokenizer.from_file(str(ckpts[0] / "tokenizer.json")).encode(corpus_text()[:2000]).ids[:40]


@pytest.fixture(scope="module")
def base_logits(oracle: V41Oracle, prompt: list[int]) -> torch.Tensor:
    return oracle.logits(prompt)


def test_bad_input_is_one_clear_error(tmp_path: Path, oracle: V41Oracle) -> None:
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        V41Oracle.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="model_type 'llama'"):
        V41Oracle.load(tmp_path)
    with pytest.raises(ValueError, match="empty"):
        oracle.logits([])
    with pytest.raises(ValueError, match="outside"):
        oracle.logits([1, 1024])


def test_logits_signal_and_margin_distribution(
    oracle: V41Oracle, prompt: list[int], base_logits: torch.Tensor
) -> None:
    lg = base_logits
    assert lg.shape == (40, 1024) and lg.dtype == torch.float32 and torch.isfinite(lg).all()
    assert torch.equal(lg.bfloat16().float(), lg)  # bf16 logits, as the engine's lm_head returns them
    top = lg.topk(2, dim=-1).values
    margin = top[:, 0] - top[:, 1]
    # far from a near-uniform random model (top logprob ~ -3.5 of ln 1024 = 6.9): peaked next-token choices
    assert torch.log_softmax(lg, -1).amax(-1).mean() > -2.0
    assert float((margin > GREEDY_MARGIN).float().mean()) >= 0.5, margin.tolist()
    lp = oracle.prompt_logprobs(prompt)
    assert lp.shape == (39,) and (lp <= 0).all()
    assert torch.allclose(
        lp, torch.log_softmax(lg[:-1], -1).gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    )


def test_causal_later_tokens_do_not_reach_earlier_logits(
    oracle: V41Oracle, prompt: list[int], base_logits: torch.Tensor
) -> None:
    other = prompt[:30] + [(t + 101) % 1000 for t in prompt[30:]]
    a, b = base_logits, oracle.logits(other)
    # rows 0..29 see the same tokens: only GEMM blocking may differ (the changed rows route to other
    # experts, so expert batches differ), far below a leak, which moves logits by whole units
    assert (a[:30] - b[:30]).abs().max() <= GREEDY_MARGIN / 4
    assert (a[30:] - b[30:]).abs().amax(-1).min() > 1.0


def test_indexer_selects_only_past_topk(
    ckpts: tuple[Path, dict], oracle: V41Oracle, prompt: list[int], base_logits: torch.Tensor
) -> None:
    variant = copy.copy(oracle.ck)  # shares the decoded weights; only the config differs
    variant.text = {**oracle.ck.text, **ckpts[1]}
    small = V41Oracle(variant)
    short = prompt[:14]  # at most 14 compressed states per layer < index_topk 16: every state is read
    assert torch.equal(small.logits(short), oracle.logits(short))
    # 40 tokens: ratio-1 layers hold up to 40 states, so the top-16 and layer 5's 4 candidate blocks select
    long_small, long_full = small.logits(prompt), base_logits
    early, late = (long_small - long_full).abs().amax(-1).split([14, 26])
    assert early.max() <= GREEDY_MARGIN / 4  # the same states read (GEMM blocking aside, as above)
    assert late[6:].min() > GREEDY_MARGIN, late.tolist()  # from 20 tokens on the selection changes logits


def test_greedy_and_draft(oracle: V41Oracle, prompt: list[int]) -> None:
    ids = prompt[:10]
    toks, margins = oracle.greedy(ids, 1)
    lg = oracle.logits(ids)[-1]  # the same computation greedy's step ran
    top = lg.topk(2).values
    assert toks == [int(lg.argmax())] and margins == [float(top[0] - top[1])]
    anchor, drafts = oracle.draft(ids, 3)
    assert anchor == toks[0] and len(drafts) == 3 and all(0 <= d < 1024 for d in drafts)
