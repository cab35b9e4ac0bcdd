"""The driver's host-memory readings for the metrics lines (services/driver/memory.py): its own
resident memory and glibc heap, the largest live rollout worker's, sampled at most every few
seconds."""

import os
import sys

import numpy as np
import pytest

from relay_rl.services.driver.memory import HostMemory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallinfo2 is glibc's")
def test_the_driver_reports_its_heap_beside_its_resident_memory():
    memory = HostMemory(lambda: [os.getpid(), 2**22 + 7], every_s=0.0)  # a pid that does not exist is skipped
    first = memory.sample()
    arrays = [np.empty(100, dtype=np.float64) for _ in range(100_000)]  # 80 MB of heap chunks
    later = memory.sample()
    assert later["driver_heap_in_use_bytes"] - first["driver_heap_in_use_bytes"] > 80e6
    assert later["driver_heap_in_use_bytes"] < later["driver_rss_bytes"]
    assert later["rollout_rss_bytes"] > 80e6  # this process, read as a worker; the missing pid skipped
    assert len(arrays) == 100_000


def test_between_samples_the_last_reading_stands():
    memory = HostMemory(lambda: [], every_s=3600.0)
    first = memory.sample()
    assert memory.sample() is first and "rollout_rss_bytes" not in first
