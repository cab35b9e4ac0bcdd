"""SIGTERM and SIGHUP handled like Ctrl-C: Kubernetes, `ray job stop` and `timeout` send SIGTERM, a
closed terminal or a dropped ssh session sends SIGHUP, and a run they stop must end as cleanly as
one stopped at the keyboard (metrics flushed, final checkpoint written, actors shut down), with
exit code 128 + the signal: 130 (Ctrl-C), 143 (SIGTERM), 129 (SIGHUP).

A stop is never lost. Python drops an exception raised where it cannot propagate (an at-fork
callback as Ray starts its processes: "Exception ignored in: <function _releaseLock>", a __del__, a
weakref callback), so a signal that lands there would vanish, and a SIGTERM would be ignored for
good since only the first one raises. The handler therefore also records the stop as pending until
an except clause takes it (`stop_reason`), and `raise_pending` re-raises one that never arrived; the
driver calls it once Ray has started and before every round. Python's report of the dropped
exception (a traceback on stderr) is left out: the stop it would describe still happens.
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
from typing import Any

EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130
# The signals that stop a run cleanly besides Ctrl-C, and the word a stop is reported with.
STOP_SIGNALS = {signal.SIGTERM: "terminated", signal.SIGHUP: "hangup"}
STOP_CODES = {"interrupted": EXIT_INTERRUPTED, **{word: 128 + sig for sig, word in STOP_SIGNALS.items()}}
# Every signal that stops a run: Ctrl-C and the others.
ALL_STOP_SIGNALS = (signal.SIGINT, *STOP_SIGNALS)


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM or SIGHUP, as KeyboardInterrupt is on SIGINT."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(STOP_SIGNALS.get(signal.Signals(signum), "terminated"))
        self.signum = signum

    @property
    def reason(self) -> str:
        """'terminated' (SIGTERM) or 'hangup' (SIGHUP)."""
        return STOP_SIGNALS.get(signal.Signals(self.signum), "terminated")


# The stop signals the handler saw, in order. Ray's blocking calls turn any exception a signal
# handler raises into a plain KeyboardInterrupt, so the type alone cannot tell SIGTERM from Ctrl-C.
_fired: list[int] = []
# The signal whose exception no except clause has taken yet (see the module docstring).
_pending: list[int] = []


def _word(signum: int) -> str:
    return STOP_SIGNALS.get(signal.Signals(signum), "interrupted")


def stop_reason(err: KeyboardInterrupt) -> str:
    """Why the run stops: 'interrupted', 'terminated' or 'hangup'. Called where the stop is caught,
    which takes the pending stop."""
    _pending.clear()
    if isinstance(err, Terminated):
        return err.reason
    return _word(_fired[-1]) if _fired else "interrupted"


def raise_pending() -> None:
    """Raise the stop a signal asked for if its exception was dropped on the way; else nothing."""
    if _pending:
        signum = _pending[-1]
        raise KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


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
    the clean stop it starts (a final checkpoint) is not cut short. Ctrl-C raises KeyboardInterrupt
    every time, as by default (a second one cuts the stop short, as users expect). Each is also
    recorded for `raise_pending`. Outside the main thread: no change."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _fired.clear()
    _pending.clear()

    def handler(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            _detach_from_closed_terminal()
        first = not any(sig in STOP_SIGNALS for sig in _fired)
        _fired.append(signum)
        if signum == signal.SIGINT:
            _pending[:] = [signum]
            raise KeyboardInterrupt()
        if first:
            _pending[:] = [signum]
            raise Terminated(signum)

    def unraisable(info: Any) -> None:
        if not isinstance(info.exc_value, KeyboardInterrupt):
            default_hook(info)

    previous = {sig: signal.signal(sig, handler) for sig in ALL_STOP_SIGNALS}
    default_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        yield
    finally:
        sys.unraisablehook = default_hook
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def signals_held() -> Iterator[None]:
    """Stop signals (Ctrl-C, SIGTERM, SIGHUP) wait until the block ends, then arrive as usual: a
    cleanup (Ray's shutdown, the last files) is never cut halfway by one. Main thread only.

    They are held by a handler that only records them, and sent again, in order, once the block's
    handlers are put back (until one of them raises: the stop it starts is the one that counts).
    Blocking them with pthread_sigmask did not hold them: the mask is the main thread's alone, the
    kernel hands a process-wide signal to any thread that does not block it (Ray and Tune run
    several), and Python then runs the handler in the main thread inside the block (a sweep's
    second Ctrl-C cut its cleanup short and it exited 1, not 130)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def record(signum: int, _frame: FrameType | None) -> None:
        held.append(signum)

    previous = {sig: signal.signal(sig, record) for sig in ALL_STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        for signum in held:
            signal.raise_signal(signum)
