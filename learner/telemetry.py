"""What a learner process reports of its device and its host memory beside an update's statistics.

One job: read the gauges (torch's allocator on the device, the device's own health readers, this
process's resident and heap memory) into metrics-line keys. The learners' updates compute learning
statistics only; each learner adds `sample()` to the line it hands back.
"""

from __future__ import annotations

import resource
import sys
from typing import Any

from ..learner.device import DeviceContext
from ..learner.device_health import DeviceHealth
from ..learner.heap import HeapGauge


def peak_rss_bytes() -> int:
    """Peak resident memory of this process (Linux reports ru_maxrss in KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def rss_bytes() -> int:
    """Resident memory of this process now: growth shows here long before an OOM."""
    with open("/proc/self/statm", "rb") as f:  # one read, no psutil object per line
        return int(f.read().split()[1]) * resource.getpagesize()


class LearnerTelemetry:
    """The gauges of one learner process. `num_cpus`: the CPUs the learner may use (the CPU
    device's utilization is read over them). A health reader that cannot start says why once,
    on stderr, and the run goes on without its keys."""

    def __init__(self, dev: DeviceContext, num_cpus: int) -> None:
        self.dev = dev
        self.health = DeviceHealth(dev, num_cpus)  # utilization, memory, temperature, power
        self.heap = HeapGauge()  # live heap vs freed-but-kept: tells a leak from the allocator's swing
        if self.health.problem:
            print(f"relay learner: {self.health.problem}", file=sys.stderr, flush=True)

    def sample(self) -> dict[str, Any]:
        """device, device_memory_bytes / _peak_bytes (torch's allocator), host_memory_peak_bytes,
        learner_rss_bytes, learner_heap_in_use_bytes / _free_bytes (glibc) and the device's health."""
        mem = self.dev.memory_stats()
        return {
            "device": str(self.dev),
            "device_memory_bytes": mem["allocated"],
            "device_memory_peak_bytes": mem["peak"],
            "host_memory_peak_bytes": peak_rss_bytes(),
            "learner_rss_bytes": rss_bytes(),
            **{f"learner_{k}": v for k, v in self.heap.sample().items()},
            **self.health.sample(),
        }
