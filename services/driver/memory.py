"""Host memory of the run's processes for the metrics lines: the driver's own resident memory and
the largest rollout worker's on this node (the learner reports its own), sampled at most every
few seconds, so a user sees growth on the dashboard long before an OOM; and what glibc holds in the
driver (allocated, and freed but kept), which tells a leak from the allocator's swing."""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil

from ...learner.heap import heap_stats

SAMPLE_EVERY_S = 10.0


class HostMemory:
    """`driver_rss_bytes`, `driver_heap_in_use_bytes`, `driver_heap_free_bytes` (absent without
    glibc's mallinfo2) and `rollout_rss_bytes` (absent when no worker runs on this node)."""

    def __init__(self, worker_pids: Callable[[], list[int]], every_s: float = SAMPLE_EVERY_S) -> None:
        self.worker_pids = worker_pids
        self.every_s = every_s
        self._me = psutil.Process()
        self._last = -float("inf")
        self._values: dict[str, int] = {}

    def sample(self) -> dict[str, int]:
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self._values = {"driver_rss_bytes": self._me.memory_info().rss}
            self._values.update({f"driver_{k}": v for k, v in heap_stats().items()})
            workers = []
            for pid in self.worker_pids():
                try:
                    workers.append(psutil.Process(pid).memory_info().rss)
                except (psutil.Error, ValueError):
                    continue  # restarting, or gone
            if workers:
                self._values["rollout_rss_bytes"] = max(workers)
        return self._values
