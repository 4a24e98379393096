"""Event-loop lag probe: how late the client's loop serves a socket that has become readable.

A response chunk is timestamped when the loop runs the callback of its socket, so the error in every
client timestamp is the time from "bytes readable" to "callback ran". The probe measures exactly that:
a thread writes one byte into a socket pair every PERIOD_NS (stamping the write with
`time.perf_counter_ns()` just before it), and a reader registered on the loop stamps the read; the
difference is the lag, in ns. It includes the loop's other callbacks, the GIL and the host's
scheduling of this process (what a loaded host does to the client), and not the selector's timeout
rounding: the former probe slept 5 ms on the loop and counted its overshoot, and `epoll` rounds
timeouts up to whole milliseconds, so it read up to 1 ms of lag on an idle loop (the committed smoke
run's quietest runs show that 1.0 ms floor).

The cell's validity rule (analysis/validity.py `lag_violations`) judges the p50 and p99 against the
cell's own median and p99 timing.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

from deepinfer_harness.analysis.stats import percentile

PERIOD_NS = 5_000_000


class LoopLagProbe:
    def __init__(self, period_ns: int = PERIOD_NS) -> None:
        self.period_ns = period_ns
        self.lags_ns: list[int] = []
        self._sent: list[int] = []  # write stamps, in order; the reader pairs each byte with the next
        self._read = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pair: tuple[socket.socket, socket.socket] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _writer(self, tx: socket.socket) -> None:
        next_ns = time.perf_counter_ns()
        while not self._stop.is_set():
            next_ns += self.period_ns
            pause = (next_ns - time.perf_counter_ns()) / 1e9
            if pause > 0 and self._stop.wait(pause):
                return
            self._sent.append(time.perf_counter_ns())  # list.append is atomic under the GIL
            try:
                tx.send(b"\0")
            except OSError:  # the pair was closed under us: the probe is stopping
                return

    def _on_readable(self, rx: socket.socket) -> None:
        now = time.perf_counter_ns()
        try:
            n = len(rx.recv(4096))
        except (BlockingIOError, InterruptedError):
            return
        for _ in range(n):  # bytes that queued up while the loop was busy: each waited since its write
            if self._read < len(self._sent):
                self.lags_ns.append(max(0, now - self._sent[self._read]))
                self._read += 1

    async def __aenter__(self) -> LoopLagProbe:
        rx, tx = socket.socketpair()
        rx.setblocking(False)
        self._pair = (rx, tx)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(rx.fileno(), self._on_readable, rx)
        self._thread = threading.Thread(target=self._writer, args=(tx,), name="loop-lag-probe", daemon=True)
        self._thread.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        if self._pair:
            rx, tx = self._pair
            if self._loop:
                self._loop.remove_reader(rx.fileno())
            rx.close()
            tx.close()

    def summary(self) -> dict[str, float | int | str]:
        ms = [x / 1e6 for x in self.lags_ns]
        return {
            "loop_lag_p50_ms": percentile(ms, 50),
            "loop_lag_p99_ms": percentile(ms, 99),
            "loop_lag_max_ms": max(ms, default=float("nan")),
            "loop_lag_samples": len(ms),
            "loop_lag_probe": "socket",  # readable-to-callback delay (the former probe: sleep overshoot)
        }
