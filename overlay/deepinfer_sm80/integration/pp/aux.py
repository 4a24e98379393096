"""DSpark's target-hidden inputs across pipeline stages (binding rows `dspark_pp_aux` and `pp_forward`).

DSpark reads the residual stream's mean at the entry of its target layers (the tiny checkpoint's 3, 4,
5; V4.1-Flash's 37, 38, 39) as "aux hidden states". vLLM 0.32.0 refuses DSpark with PP > 1 at model
load: `v1/worker/gpu/model_runner.py` L408-414 calls `verify_supports_aux_hidden_states_over_pp`
(`spec_decode/eagle/eagle3_utils.py` L44-50), and V4.1's `DeepseekV4Model` inherits
`supports_aux_hidden_states_over_pp = False` from `EagleModelMixin` (`models/interfaces.py` L1572).
The flag alone would not do: V4.1's forward (`models/deepseek_v41/nvidia/model.py` L1046-1077) keeps
its aux states local, returning only `hidden_states` and `pre_mix` from a non-last stage, and the last
stage returns only the aux states it captured itself.

vLLM's relay convention (EagleModelMixin, `models/interfaces.py` L1583-1641, and
`v1/worker/gpu/pp_utils.py` L102-124): aux layer L belongs to the stage with start < L <= end (the
entry of a stage's first layer is the previous stage's output, so the previous stage captures it);
a stage ships its own aux states under `aux_hidden_states_<slot>` keys numbered after the aux layers of
earlier stages (`pack_local_aux_hidden_states`), a middle stage forwards the earlier keys unchanged
(the model runner's `relay_aux_hidden_states`), the receive buffers gain those keys
(`reserve_aux_intermediate_tensor_slots`) and the last stage puts the received states before its own
(`collect_remote_aux_hidden_states`). V4.1's layers already capture by that convention: a layer L
with start < L < end captures its entry inside its fused mHC boundary, and the stage's final collapse
captures L = end (`_collapse`, L1153-1157); the stage's first layer captures nothing.

What this module adds (ours): the flag, and around upstream's forward the two ends of the relay. On a
non-last stage the aux states upstream computed are read from the dict `_collapse` receives (the one
`_run_layers` filled: on a non-last stage decoder replay is off, L1211-1215, so `_collapse` always runs
with it) and packed into the returned IntermediateTensors; on the last stage the received states are
put in front of the local ones. The drafter then sees the list it sees without PP: every target layer
in order, each computed by the same kernel call on the same stream values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def supports_aux_over_pp(upstream: bool) -> bool:
    """Binding `dspark_pp_aux` (a wrap row on the class flag vLLM checks before it relays aux states over
    PP): upstream's inherited False becomes True, with the relay's two ends in `pp_forward`."""
    del upstream
    return True


def _pp() -> tuple[int, int]:
    from vllm.distributed.parallel_state import get_pp_group

    g = get_pp_group()
    return g.rank_in_group, g.world_size


def local_aux_layers(model: Any) -> tuple[int, ...]:
    """The aux layers this stage captures: start < L <= end (vLLM's relay convention)."""
    return tuple(L for L in model.aux_hidden_state_layers if model.start_layer < L <= model.end_layer)


def active(model: Any) -> bool:
    """PP > 1 with aux layers set (DSpark/EAGLE3 on): the relay's two ends are ours to add."""
    if not getattr(model, "aux_hidden_state_layers", ()):
        return False
    return _pp()[1] > 1


class AuxRelayError(RuntimeError):
    """The aux states a stage captured are not the ones the relay convention assigns it."""


def run(model: Any, call: Callable[[], Any], intermediate_tensors: Any) -> Any:
    """Run upstream's forward (`call`) with the relay's two ends around it."""
    rank, size = _pp()
    if rank < size - 1:
        return _send_local(model, call)
    return _prepend_remote(model, call(), intermediate_tensors)


def _send_local(model: Any, call: Callable[[], Any]) -> Any:
    captured: dict[int, torch.Tensor] = {}
    collapse = type(model)._collapse

    def capturing_collapse(*args: Any, **kwargs: Any) -> Any:
        out = collapse(model, *args, **kwargs)
        by_layer = kwargs.get("aux_hidden_by_layer", args[4] if len(args) > 4 else None)
        if by_layer is not None:
            captured.update(by_layer)
        return out

    model.__dict__["_collapse"] = capturing_collapse  # this call only: upstream's method again below
    try:
        out = call()
    finally:
        model.__dict__.pop("_collapse", None)
    want = local_aux_layers(model)
    if tuple(sorted(captured)) != want:
        raise AuxRelayError(
            f"pipeline stage layers {model.start_layer}-{model.end_layer - 1}: captured aux states of "
            f"layers {sorted(captured)}, the relay expects {list(want)}"
        )
    out.tensors.update(model.pack_local_aux_hidden_states([captured[L] for L in want]))
    return out


def _prepend_remote(model: Any, out: Any, intermediate_tensors: Any) -> Any:
    remote = model.collect_remote_aux_hidden_states(intermediate_tensors)
    if not remote:
        return out
    if isinstance(out, tuple):
        hidden, local = out
        return hidden, [*remote, *local]
    return out, remote
