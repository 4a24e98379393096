"""Event-loop lag probe: a task sleeps 5 ms and records the overshoot in ns.

If the client's loop is late, its timestamps are late; a cell whose lag p99 > 5 ms or max > 50 ms
is invalid (validity rule in analysis/validity.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from deepinfer_harness.analysis.stats import percentile

PERIOD_NS = 5_000_000


class LoopLagProbe:
    def __init__(self) -> None:
        self.lags_ns: list[int] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            t0 = time.perf_counter_ns()
            await asyncio.sleep(PERIOD_NS / 1e9)
            self.lags_ns.append(max(0, time.perf_counter_ns() - t0 - PERIOD_NS))

    async def __aenter__(self) -> LoopLagProbe:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def summary(self) -> dict[str, float]:
        ms = [x / 1e6 for x in self.lags_ns]
        return {
            "loop_lag_p99_ms": percentile(ms, 99),
            "loop_lag_max_ms": max(ms, default=float("nan")),
            "loop_lag_samples": len(ms),
        }
