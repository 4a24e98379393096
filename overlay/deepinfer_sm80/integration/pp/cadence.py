"""Speculative decoding under PP with the synchronous scheduler (binding row `pp_spec_cadence`).

With model runner V2, pipeline parallelism and speculative decoding (DSpark), a request's next decode
step needs the token (and drafts) its previous step sampled on the last stage; the workers relay them
through a ring of `pp_size` slots (`v1/worker/gpu/pp_utils.py` `PPHandler`). vLLM 0.32.0 throttles a
request to one decode every `pp_size` scheduler steps only in `AsyncScheduler._update_after_schedule`
(`v1/core/sched/async_scheduler.py` L52-57, read at `scheduler.py` L680). The synchronous `Scheduler`
never sets `next_decode_eligible_step`, so it schedules the request again before the relay: the
first stage's worker then meets a step whose scheduled tokens are fewer than its drafts + 1 and stops
at `v1/worker/gpu/model_runner.py` L1403 (`assert (num_scheduled_tokens_np >= num_logits).all()`).
That is the path of every synchronous deployment: `--no-async-scheduling`, and executors without async
scheduling: the legacy Ray executor (`VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0`; `RayDistributedExecutor`
keeps `supports_async_scheduling() = False`, `v1/executor/abstract.py` L442) (vLLM #52071, open fix
#52179). 0.32.0's default Ray executor, `RayExecutorV2` (`envs.py` L944-945), is a `MultiprocExecutor`
and runs the asynchronous scheduler, as `mp` does: GPU deployments, the multi-node TP8 x PP2 one
included, are asynchronous unless told otherwise, and this row then calls upstream alone.

The fix is the asynchronous scheduler's own rule, applied by the synchronous one: after upstream's
bookkeeping, a scheduled request past its prefill is next eligible `pp_size` steps later. Everywhere
else (PP = 1, no speculation, model runner V1, the asynchronous scheduler) upstream's method runs alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def applies(scheduler: Any) -> bool:
    return bool(
        getattr(scheduler, "use_pp", False)
        and getattr(scheduler, "use_v2_model_runner", False)
        and getattr(scheduler, "num_spec_tokens", 0)
        and not scheduler.scheduler_config.async_scheduling
    )


def wrap_update_after_schedule(upstream: Callable[..., Any]) -> Callable[..., Any]:
    """Binding `pp_spec_cadence`: upstream's update, then the PP decode cadence for a sync scheduler."""

    def _update_after_schedule(self: Any, scheduler_output: Any) -> None:
        upstream(self, scheduler_output)
        if not applies(self):
            return
        pp = self.parallel_config.pipeline_parallel_size
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests[req_id]
            if not request.is_prefill_chunk:
                request.next_decode_eligible_step = max(
                    request.next_decode_eligible_step, self.current_step + pp
                )

    return _update_after_schedule
