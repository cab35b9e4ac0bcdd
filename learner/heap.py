"""Returning freed heap to the OS, so a learner's resident memory stays flat for days.

A long run's learner allocates and frees the same buffers every round (segments fetched, staged
and copied in, the update's temporaries). glibc keeps freed chunks for reuse and returns memory
to the OS only from the top of each heap, so with several threads' arenas (Ray's core worker,
the prefetch thread, torch's pool) freed memory trapped below live chunks accumulates: measured
on CartPole, about 1 KB a round, which one `malloc_trim(0)` gave back at once (383.4 -> 381.5 MB
after 3,000 rounds that had grown 1.4 MB). The learner trims at most once an `interval_s`, which
costs about a millisecond. (The rest of the learner's growth was Ray's bookkeeping of the weights
it used to publish by `ray.put`; they now leave as a call's return value, which the driver owns:
see learner/actor.py and docs/benchmarks.md, "Long runs".)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable


def _libc_function(symbol: str) -> Callable[..., object] | None:
    """A glibc function by name, or None where the C library has none (macOS, musl)."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), symbol) if name else None
    except (OSError, AttributeError):
        return None


def _malloc_trim() -> Callable[[int], int] | None:
    return _libc_function("malloc_trim")  # type: ignore[return-value]


class _Mallinfo2(ctypes.Structure):
    """glibc >= 2.33's `struct mallinfo2`: every field a size_t, summed over all arenas."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in [
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        ]
    ]


def _mallinfo2() -> Callable[[], _Mallinfo2] | None:
    fn = _libc_function("mallinfo2")
    if fn is not None:
        fn.restype = _Mallinfo2  # type: ignore[attr-defined]
    return fn  # type: ignore[return-value]


_MALLINFO2 = _mallinfo2()


def heap_stats() -> dict[str, int]:
    """What glibc's allocator holds, over all arenas: `heap_in_use_bytes` (chunks the process has
    allocated and not freed, mmapped ones included) and `heap_free_bytes` (freed chunks glibc keeps
    for reuse). Growth of the first is the process's own (a leak); of the second, the allocator's
    (bounded by the largest working set; a trim gives their pages back to the OS, though chunks
    below live ones still count here). Empty without glibc >= 2.33."""
    if _MALLINFO2 is None:
        return {}
    info = _MALLINFO2()
    return {"heap_in_use_bytes": int(info.uordblks + info.hblkhd), "heap_free_bytes": int(info.fordblks)}


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


class HeapGauge:
    """`heap_stats()` at most once an `interval_s`, the last reading in between: mallinfo2 walks
    every arena's free lists, ~12 ms on a heap of 50,000 free chunks, too dear for every update."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._last = -float("inf")
        self._values: dict[str, int] = {}

    def sample(self) -> dict[str, int]:
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._values = heap_stats()
            self._last = now
        return self._values
