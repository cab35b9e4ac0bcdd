"""The stuck-worker watchdog: how long a rollout worker may go without returning a segment.

Pure bookkeeping, no Ray: the backend says when a worker starts on a segment and when it returns
one; the watchdog says which workers are overdue and how long to wait before asking again.
`rollout.segment_timeout_s` is a number of seconds, `auto` (derived from the segment times it
has measured, with a floor) or None (off).
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable, Hashable
from typing import TextIO

AUTO_FLOOR_S = 60.0  # an env with a slow reset or a GC pause is not stuck
AUTO_FIRST_S = 300.0  # before any segment is measured: start-up (imports, env creation) included
AUTO_FACTOR = 10.0  # x the slowest segment measured so far
POLL_CAP_S = 5.0  # the longest one wait lasts, so a deadline is checked at least this often


class SegmentWatchdog:
    """When each worker started on the segment it owes, and the deadline that gives it."""

    def __init__(self, setting: float | str | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.setting = setting
        self.clock = clock
        self._since: dict[Hashable, float] = {}
        self.slowest_s = 0.0

    @property
    def enabled(self) -> bool:
        return self.setting is not None

    def timeout_s(self) -> float:
        """Seconds a worker may take for one segment."""
        if isinstance(self.setting, int | float):
            return float(self.setting)
        if self.slowest_s == 0.0:
            return AUTO_FIRST_S
        return max(AUTO_FLOOR_S, AUTO_FACTOR * self.slowest_s)

    def started(self, worker: Hashable) -> None:
        """`worker` now owes a segment (it was idle, or it just returned one and has more to do)."""
        self._since[worker] = self.clock()

    def finished(self, worker: Hashable, more: bool) -> None:
        """`worker` returned a segment; with `more` it goes straight on to the next one."""
        start = self._since.pop(worker, None)
        if start is not None:
            self.slowest_s = max(self.slowest_s, self.clock() - start)
        if more:
            self.started(worker)

    def forget(self, worker: Hashable) -> None:
        self._since.pop(worker, None)

    def overdue(self) -> list[tuple[Hashable, float]]:
        """(worker, seconds it has been on its segment) of every worker past the timeout."""
        if not self.enabled:
            return []
        now, limit = self.clock(), self.timeout_s()
        return [(w, now - t) for w, t in self._since.items() if now - t > limit]

    def wait_s(self) -> float | None:
        """How long to wait before the nearest deadline needs checking (None: no deadline)."""
        if not self.enabled or not self._since:
            return None
        nearest = min(self._since.values()) + self.timeout_s()
        return min(max(nearest - self.clock(), 0.05), POLL_CAP_S)


class LocalStuckReporter:
    """Local mode samples in this process, so nothing can restart a stuck env; what can be done is
    to say so: one line when a sample takes longer than the timeout, naming where it is stuck."""

    def __init__(self, watchdog: SegmentWatchdog, stream: TextIO = sys.stderr) -> None:
        self.watchdog = watchdog
        self.stream = stream
        self._timer: threading.Timer | None = None
        self.reports = 0

    def __enter__(self) -> LocalStuckReporter:
        if self.watchdog.enabled:
            self.watchdog.started("local")
            self._timer = threading.Timer(
                self.watchdog.timeout_s(), self._report, args=(threading.get_ident(), self.watchdog.clock())
            )
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.watchdog.finished("local", more=False)

    def _report(self, thread_id: int, since: float) -> None:
        frame = sys._current_frames().get(thread_id)
        where = traceback.format_stack(frame, limit=1)[0].strip().splitlines()[0] if frame else "?"
        seconds = self.watchdog.clock() - since
        self.reports += 1
        print(
            f"relay: the env has returned no segment for {seconds:.0f} s (local mode cannot restart "
            f"it; rollout.segment_timeout_s={self.watchdog.setting}); it is at {where}",
            file=self.stream,
            flush=True,
        )
