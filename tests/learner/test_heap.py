"""The learner's heap trimming: freed memory trapped in glibc's heap goes back to the OS, at most
once an interval (learner/heap.py)."""

import resource
import sys

import numpy as np
import pytest

from relay_rl.learner.heap import HeapGauge, HeapTrimmer


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim is Linux's")
def test_trimming_returns_freed_heap_trapped_below_live_chunks():
    """7 of 8 small arrays freed (~140 MB), every 8th kept alive: the heap cannot shrink from its
    top, so the memory stays resident until trimmed."""
    keep, freed = [], []
    for i in range(200_000):
        (keep if i % 8 == 0 else freed).append(np.empty(100, dtype=np.float64))  # 800 B: heap, not mmap
    freed.clear()
    before = rss_mb()
    trimmer = HeapTrimmer(interval_s=0.0)
    assert trimmer.available and trimmer.maybe_trim()
    assert before - rss_mb() > 20, (before, rss_mb())
    assert len(keep) == 25_000


def test_it_trims_at_most_once_an_interval():
    trimmer = HeapTrimmer(interval_s=3600.0)
    assert not trimmer.maybe_trim()  # the interval starts when the trimmer does
    trimmer._last -= 3601
    assert trimmer.maybe_trim() and not trimmer.maybe_trim()
    assert trimmer.trims == 1


HEAP_PROBE = """
import resource
import numpy as np
from relay_rl.learner.heap import HeapTrimmer, heap_stats

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20

start = heap_stats()
arrays = [np.empty(100, dtype=np.float64) for _ in range(100_000)]
live = heap_stats()
arrays.clear()
freed = heap_stats()
rss_freed = rss_mb()
HeapTrimmer(interval_s=0.0).maybe_trim()
used, free = "heap_in_use_bytes", "heap_free_bytes"
print(live[used] - start[used], live[used] - freed[used], freed[free] - live[free], rss_freed - rss_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallinfo2 is glibc's")
def test_heap_stats_tell_live_chunks_from_freed_ones():
    """80 MB of 800-byte arrays: in use while they live, then free (kept by glibc), until trimmed.

    Measured in a process of its own: in the suite's process, other tests' threads (Ray's, the
    trackers') allocate and free between the readings, and a full CI run saw 48 MB of the 80 freed."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", HEAP_PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    grew, fell, free_grew, rss_fell = (float(x) for x in done.stdout.split())
    assert grew > 80e6 and fell > 80e6 and free_grew > 80e6, (grew, fell, free_grew)
    # Trimming hands the freed pages back: from the heap's top (its free bytes fall) or, where a
    # live chunk sits above them, by madvise from its middle (the pages leave RSS while glibc's
    # free list still counts them).
    assert rss_fell > 40, rss_fell


def test_the_gauge_reads_the_heap_at_most_once_an_interval():
    gauge = HeapGauge(interval_s=3600.0)
    first = gauge.sample()
    arrays = [np.empty(100, dtype=np.float64) for _ in range(50_000)]
    assert gauge.sample() is first  # within the interval: the last reading
    gauge._last -= 3601
    assert gauge.sample()["heap_in_use_bytes"] - first["heap_in_use_bytes"] > 35e6
    assert len(arrays) == 50_000
