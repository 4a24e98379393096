"""DSpark's aux states across pipeline stages (integration/pp/aux.py, rows `dspark_pp_aux` + `pp_forward`).

A toy V4.1 model keeps upstream's capture convention (a layer L with start < L < end captures its entry
in its own boundary; the stage's final `_collapse` captures L = end; the stage's first layer captures
nothing) and vLLM 0.32.0's own relay pieces (EagleModelMixin's slot numbering, pack and collect; the
model runner's middle-stage `relay_aux_hidden_states`). Each stage of 4,2 / 3,3 / 3,1,2 runs its layers,
what crosses each boundary is checked key by key, and the last stage's aux list must equal the
single-stage one: the drafter's input, bit for bit.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")

from vllm.model_executor.models.interfaces import EagleModelMixin
from vllm.sequence import IntermediateTensors
from vllm.v1.worker.gpu.pp_utils import PPHandler

from deepinfer_sm80.integration.pp import aux
from deepinfer_sm80.integration.pp.engine import wrap_forward

AUX_LAYERS = (3, 4, 5)  # the tiny checkpoint's dspark_target_layer_ids
T, H, LAYERS = 5, 8, 6


class ToyV41(EagleModelMixin):
    """Layers add their own constant; aux of L = the stream entering L (upstream's capture points)."""

    def __init__(self, start: int, end: int, stages: int, rank: int, monkeypatch) -> None:
        self.start_layer, self.end_layer = start, end
        group = SimpleNamespace(world_size=stages, rank_in_group=rank, is_first_rank=rank == 0,
                                is_last_rank=rank == stages - 1)  # fmt: skip
        import vllm.distributed.parallel_state as ps

        monkeypatch.setattr(ps, "get_pp_group", lambda: group)
        monkeypatch.setattr(ps, "model_parallel_is_initialized", lambda: True)
        monkeypatch.setattr(aux, "_pp", lambda: (rank, stages))
        self._set_aux_hidden_state_layers(AUX_LAYERS)

    def _run_layers(self, ids: range, x: torch.Tensor, by_layer: dict[int, torch.Tensor]) -> torch.Tensor:
        for i in ids:
            if i in self.aux_hidden_state_layers and i != self.start_layer:
                by_layer[i] = x.clone()  # captured inside layer i's fused boundary
            x = x * 1.5 + i
        return x

    def _collapse(self, x, residual, post_mix, res_mix, by_layer, full_num_tokens):  # upstream's order
        if self.end_layer in self.aux_hidden_state_layers:
            by_layer[self.end_layer] = x.clone()
        return x

    def forward(
        self, input_ids, positions, intermediate_tensors, inputs_embeds=None, lookback_token_ids=None
    ):
        """Upstream's shape of V4.1's forward: local aux only, a non-last stage returns hidden states."""
        x = inputs_embeds if intermediate_tensors is None else intermediate_tensors["hidden_states"]
        by_layer: dict[int, torch.Tensor] = {}
        x = self._run_layers(range(self.start_layer, self.end_layer), x, by_layer)
        x = self._collapse(x, None, None, None, by_layer, T)
        local = [by_layer[L] for L in self.aux_hidden_state_layers if L in by_layer]
        if self.end_layer < LAYERS:
            return IntermediateTensors({"hidden_states": x})
        return (x, local) if local else x


def _embeds() -> torch.Tensor:
    return torch.randn(T, H, generator=torch.Generator().manual_seed(41))


def _pipeline(partition: tuple[int, ...], monkeypatch, crossed: list[set[str]]) -> tuple:
    from deepinfer_sm80.integration.pp import engine

    monkeypatch.setattr(engine, "_RUNTIMES", {})  # no replicating stage in this process (other tests' runs)
    forward = wrap_forward(ToyV41.forward)
    x = _embeds()
    received = None
    bounds = [sum(partition[:i]) for i in range(len(partition) + 1)]
    for rank in range(len(partition)):
        model = ToyV41(bounds[rank], bounds[rank + 1], len(partition), rank, monkeypatch)
        out = forward(model, None, torch.arange(T), received, inputs_embeds=x if rank == 0 else None)
        if rank < len(partition) - 1:
            handler = SimpleNamespace(aux_hidden_state_relay_keys=())
            if rank > 0:  # the model runner's middle-stage relay, upstream's code
                from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import aux_hidden_state_relay_keys

                monkeypatch.setattr(model, "model", model, raising=False)
                keys = aux_hidden_state_relay_keys(SimpleNamespace(model=model))
                handler.aux_hidden_state_relay_keys = keys
            out = PPHandler.relay_aux_hidden_states(handler, received, out)
            crossed.append(set(out.tensors))
            received = out
    return out


@pytest.mark.parametrize("partition", [(4, 2), (3, 3), (3, 1, 2), (2, 2, 2)])
def test_drafter_sees_the_single_stage_inputs(partition, monkeypatch) -> None:
    single = _pipeline((LAYERS,), monkeypatch, [])
    crossed: list[set[str]] = []
    hidden, got = _pipeline(partition, monkeypatch, crossed)
    assert torch.equal(hidden, single[0])
    assert len(got) == len(single[1]) == len(AUX_LAYERS)
    for a, b in zip(got, single[1], strict=True):
        assert torch.equal(a, b)
    # what crosses each boundary: every aux layer at or before the boundary, once, by vLLM's slot numbers
    bounds = [sum(partition[: i + 1]) for i in range(len(partition) - 1)]
    for keys, cut in zip(crossed, bounds, strict=True):
        n = sum(1 for L in AUX_LAYERS if L <= cut)
        assert keys == {"hidden_states"} | {f"aux_hidden_states_{i}" for i in range(n)}, (cut, keys)


def test_the_flag_row_turns_upstreams_false_into_true() -> None:
    assert aux.supports_aux_over_pp(EagleModelMixin.supports_aux_hidden_states_over_pp) is True


def test_upstream_forward_alone_loses_the_remote_aux(monkeypatch) -> None:
    """Without the relay ends (upstream's V4.1 forward), the last stage of 4,2 hands the drafter only its
    own aux state: the list the drafter would index is short (the failure the row answers)."""
    model = ToyV41(4, 6, 2, 1, monkeypatch)
    received = IntermediateTensors({"hidden_states": _embeds(), "aux_hidden_states_0": _embeds(),
                                    "aux_hidden_states_1": _embeds()})  # fmt: skip
    out = ToyV41.forward(model, None, torch.arange(T), received)
    assert len(out[1]) == 1


class ToyCapturingFirst(ToyV41):
    """A model off the convention: its first layer captures its entry too (the previous stage did)."""

    def _run_layers(self, ids: range, x: torch.Tensor, by_layer: dict[int, torch.Tensor]) -> torch.Tensor:
        if ids.start in self.aux_hidden_state_layers:
            by_layer[ids.start] = x.clone()
        return super()._run_layers(ids, x, by_layer)


def test_a_stage_capturing_other_layers_is_refused(monkeypatch) -> None:
    from deepinfer_sm80.integration.pp import engine

    monkeypatch.setattr(engine, "_RUNTIMES", {})
    model = ToyCapturingFirst(3, 4, 3, 1, monkeypatch)  # the middle stage of 3,1,2
    received = IntermediateTensors({"hidden_states": _embeds(), "aux_hidden_states_0": _embeds()})
    with pytest.raises(aux.AuxRelayError, match=r"captured aux states of layers \[3, 4\]"):
        wrap_forward(ToyV41.forward)(model, None, torch.arange(T), received)
