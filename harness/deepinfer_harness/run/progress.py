"""Progress a person can follow: plain lines in a log, one live line on a terminal.

Every state change (session start, server healthy, cell done, resume decisions) is a plain line
on stderr. While a server starts, its elapsed time and last log line are shown (a live line on a
terminal, a plain line every `every_s` otherwise). Per-request bars are tqdm on a terminal; in a
log, a cell prints a heartbeat line every `every_s` (elapsed time, requests finished), so a
long prefill is never silence.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm

from deepinfer_harness.run.launch import Launch

WAIT_EVERY_S = 15.0  # plain-line cadence while a server starts (a GPU start can take an hour)


class NullBar:
    def update(self, n: float = 1) -> None:
        pass

    def __enter__(self) -> NullBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class Progress:
    def __init__(
        self, enabled: bool = True, stream: TextIO | None = None, every_s: float = WAIT_EVERY_S
    ) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()
        self.every_s = every_s
        self._last_wait = 0.0
        self._live = False

    @property
    def heartbeat(self) -> bool:
        """Plain in-cell lines: enabled, and not a terminal (which has live bars)."""
        return self.enabled and not self.tty

    def say(self, line: str) -> None:
        if self._live:
            self.stream.write("\n")
            self._live = False
        print(line, file=self.stream, flush=True)

    def waiting(self, launch: Launch, elapsed_s: float, last_line: str) -> None:
        """Called on every health poll while a server starts."""
        if not self.enabled:
            return
        text = f"server {launch.variant} starting: {elapsed_s:4.0f} s" + (
            f" | {last_line}" if last_line else ""
        )
        if self.tty:
            self.stream.write("\r\033[K" + text[:200])
            self.stream.flush()
            self._live = True
        elif time.monotonic() - self._last_wait >= self.every_s:
            self._last_wait = time.monotonic()
            print(text, file=self.stream, flush=True)

    def bar(self, total: float | None, unit: str, desc: str) -> tqdm | NullBar:
        if not self.tty:
            return NullBar()
        if unit == "s":  # a timed window: show seconds done of the window, no rate ("s/s")
            return tqdm(
                total=total,
                desc=desc,
                leave=False,
                file=self.stream,
                bar_format="{desc}: {n:.0f}/{total:.0f} s of window {bar}",
            )
        return tqdm(total=total, unit=unit, desc=desc, leave=False, file=self.stream)
