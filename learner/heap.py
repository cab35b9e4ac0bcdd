"""Returning freed heap to the OS, so a learner's resident memory stays flat for days.

A long run's learner allocates and frees the same buffers every round (segments fetched, staged
and copied in, the update's temporaries). glibc keeps freed chunks for reuse and returns memory
to the OS only from the top of each heap, so with several threads' arenas (Ray's core worker,
the prefetch thread, torch's pool) freed memory trapped below live chunks accumulates: measured
on CartPole, about 1 KB a round, which one `malloc_trim(0)` gave back at once (383.4 -> 381.5 MB
after 3,000 rounds that had grown 1.4 MB). The learner trims at most once an `interval_s`, which
costs about a millisecond. (The rest of the learner's growth was Ray's bookkeeping of the weights
it published by `ray.put`: see learner/actor.py and docs/benchmarks.md, "Long runs".)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (macOS, musl)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


class HeapTrimmer:
    """`maybe_trim()` returns freed heap to the OS when `interval_s` have passed since it last did."""

    def __init__(self, interval_s: float = 60.0) -> None:
        self.interval_s = interval_s
        self._trim = _malloc_trim()
        self._last = time.monotonic()
        self.trims = 0

    @property
    def available(self) -> bool:
        return self._trim is not None

    def maybe_trim(self) -> bool:
        """True when it trimmed now."""
        now = time.monotonic()
        if self._trim is None or now - self._last < self.interval_s:
            return False
        self._trim(0)
        self._last = now
        self.trims += 1
        return True
