"""Reading data a user downloaded under a memory budget: a small Parquet file whose dictionary-
or compression-encoded column expands to gigabytes, read by native code (Arrow) that no Python
check runs inside of, must fail at once, not page the host to death.

`memory_cap` lowers the process's address-space limit (RLIMIT_AS) to what it maps now plus a
budget for the length of a block, so an allocation past it fails (MemoryError, Arrow's
ArrowMemoryError) where it is asked for. The limit is the whole process's while the block runs:
budgets are generous (other threads still allocate their usual amounts) and blocks short.
"""

from __future__ import annotations

import resource
from collections.abc import Iterator
from contextlib import contextmanager


def address_space() -> int:
    """This process's virtual memory size now, in bytes (Linux's /proc/self/statm)."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def cap_memory(extra_bytes: int) -> tuple[int, int] | None:
    """Set this process's soft RLIMIT_AS to its size now plus `extra_bytes` (never above a lower
    limit already in force); returns the limits to put back, or None where nothing changed."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = address_space() + extra_bytes
    except (OSError, ValueError):  # no /proc (not Linux): nothing is capped
        return None
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft != resource.RLIM_INFINITY and soft <= cap:
        return None
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    return soft, hard


@contextmanager
def memory_cap(extra_bytes: int) -> Iterator[None]:
    """Within the block the process may grow by at most `extra_bytes` of address space."""
    previous = cap_memory(extra_bytes)
    try:
        yield
    finally:
        if previous is not None:
            resource.setrlimit(resource.RLIMIT_AS, previous)
