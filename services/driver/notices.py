"""Warnings that repeat are aggregated: the first of a kind is said at once, later ones at most once
per interval as a count, so a failing worker never floods the terminal with one line per segment."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

INTERVAL_S = 30.0


class Notices:
    """One line per kind of event and interval: `say(kind, text, n)` counts n events of a kind."""

    def __init__(
        self,
        interval_s: float = INTERVAL_S,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self.stream = stream
        self.clock = clock
        self._last: dict[str, float] = {}  # kind -> when it was last said
        self._pending: dict[str, tuple[int, str]] = {}  # kind -> (events not said yet, newest text)

    def _print(self, line: str) -> None:
        print(f"relay: {line}", file=self.stream or sys.stderr, flush=True)

    def say(self, kind: str, text: str, n: int = 1) -> None:
        now = self.clock()
        if kind not in self._last:
            self._last[kind] = now
            self._print(text)
            if n > 1:
                self._pending[kind] = (n - 1, text)
            return
        count, _ = self._pending.get(kind, (0, text))
        self._pending[kind] = (count + n, text)
        if now - self._last[kind] >= self.interval_s:
            self._flush(kind, now)

    def _flush(self, kind: str, now: float) -> None:
        count, text = self._pending.pop(kind, (0, ""))
        if count:
            span = now - self._last[kind]
            self._print(f"{text} (x{count} in the last {span:.0f} s)")
        self._last[kind] = now

    def close(self) -> None:
        """Say what is still counted (at the end of a run)."""
        now = self.clock()
        for kind in list(self._pending):
            self._flush(kind, now)
