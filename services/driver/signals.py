"""SIGTERM and SIGHUP handled like Ctrl-C: Kubernetes, `ray job stop` and `timeout` send SIGTERM, a
closed terminal or a dropped ssh session sends SIGHUP, and a run they stop must end as cleanly as
one stopped at the keyboard (metrics flushed, final checkpoint written, actors shut down), with
exit code 128 + the signal: 130 (Ctrl-C), 143 (SIGTERM), 129 (SIGHUP).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130
# The signals that stop a run cleanly besides Ctrl-C, and the word a stop is reported with.
STOP_SIGNALS = {signal.SIGTERM: "terminated", signal.SIGHUP: "hangup"}
STOP_CODES = {"interrupted": EXIT_INTERRUPTED, **{word: 128 + sig for sig, word in STOP_SIGNALS.items()}}


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM or SIGHUP, as KeyboardInterrupt is on SIGINT."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(STOP_SIGNALS.get(signal.Signals(signum), "terminated"))
        self.signum = signum

    @property
    def reason(self) -> str:
        """'terminated' (SIGTERM) or 'hangup' (SIGHUP)."""
        return STOP_SIGNALS.get(signal.Signals(self.signum), "terminated")


# The stop signal the handler last saw. Ray's blocking calls turn any exception a signal handler
# raises into a plain KeyboardInterrupt, so the type alone cannot tell SIGTERM from Ctrl-C.
_fired: list[int] = []


def stop_reason(err: KeyboardInterrupt) -> str:
    if isinstance(err, Terminated):
        return err.reason
    return STOP_SIGNALS.get(signal.Signals(_fired[-1]), "terminated") if _fired else "interrupted"


def exit_code(err: KeyboardInterrupt) -> int:
    return STOP_CODES[stop_reason(err)]


def _detach_from_closed_terminal() -> None:
    """After SIGHUP the terminal is gone: writing to it fails (EIO), which would cut the clean stop
    short. Output meant for it goes nowhere instead; files and pipes are kept."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if os.isatty(stream.fileno()):
                stream.flush()
                os.dup2(devnull, stream.fileno())
    os.close(devnull)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, the first SIGTERM or SIGHUP raises Terminated; later ones are ignored, so
    the clean stop it starts (a final checkpoint) is not cut short. Outside the main thread: no
    change."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _fired.clear()

    def handler(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            _detach_from_closed_terminal()
        if not _fired:
            _fired.append(signum)
            raise Terminated(signum)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
