"""SIGTERM handled like Ctrl-C: Kubernetes, `ray job stop` and `timeout` send it, and a run they stop
must end as cleanly as one stopped at the keyboard (metrics flushed, final checkpoint written,
actors shut down), with exit code 143 instead of 130.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM, as KeyboardInterrupt is on SIGINT."""


def exit_code(err: KeyboardInterrupt) -> int:
    return EXIT_TERMINATED if isinstance(err, Terminated) else EXIT_INTERRUPTED


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, the first SIGTERM raises Terminated; later ones are ignored, so the clean
    stop it starts (a final checkpoint) is not cut short. Outside the main thread: no change."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if not fired:
            fired = True
            raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
