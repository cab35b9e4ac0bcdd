"""Per-client state for a recurrent policy served by `relay serve`: a session id names one client's
sequence of calls, and the replica keeps the policy's state between them.

A session starts from zeros (an episode's start), carries the state its last answer left, and
starts over when the client says `"reset": true`. Nothing restarts silently: every answer says
what the state was (`new`, `carried`, `reset`, `expired`, or `weights changed` when `--follow`
swapped in another checkpoint since the session's last call, whose state meant something to the
old weights only). A replica that restarted has no sessions: its answers say `new` to a client
that expected `carried`. Idle sessions expire after `idle_s`; past `capacity` live sessions a new
one is refused (503) rather than evicting a client mid-episode.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import numpy as np

MAX_SESSION_CHARS = 128
SESSION_ID = re.compile(rf"[A-Za-z0-9_.:-]{{1,{MAX_SESSION_CHARS}}}")


class SessionsFull(RuntimeError):
    """Every session slot holds a live client."""


@dataclass
class _Session:
    state: np.ndarray  # [rows, S]
    version: str  # what the state was computed with (the served file)
    used: float


class SessionStore:
    """session id -> the state its last call left, for `capacity` live sessions idle < `idle_s`."""

    def __init__(self, idle_s: float = 600.0, capacity: int = 10_000) -> None:
        self.idle_s, self.capacity = idle_s, capacity
        self._sessions: dict[str, _Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def start(self, session: str, rows: int, width: int, version: str, reset: bool) -> tuple[np.ndarray, str]:
        """The state a call of `rows` rows starts from, and what it is: "carried", "new", "reset",
        "expired" or "weights changed". Raises ValueError (the rows differ from the session's) or
        SessionsFull."""
        now = time.monotonic()
        found = self._sessions.get(session)
        if found is not None and now - found.used > self.idle_s:
            self._sessions.pop(session)
            status = "expired"
        elif found is None:
            status = "new"
        elif reset:
            status = "reset"
        elif found.version != version:
            status = "weights changed"
        elif found.state.shape[0] != rows:
            raise ValueError(
                f"session {session!r} carries the state of {found.state.shape[0]} rows, this call has {rows} "
                '(send "reset": true to start it over)'
            )
        else:
            return found.state, "carried"
        if session not in self._sessions:
            self._expire(now)
            if len(self._sessions) >= self.capacity:
                raise SessionsFull(f"{self.capacity} sessions are live; try again once one idles out")
        return np.zeros((rows, width), dtype=np.float32), status

    def keep(self, session: str, state: np.ndarray, version: str) -> None:
        self._sessions[session] = _Session(state, version, time.monotonic())

    def _expire(self, now: float) -> None:
        for key in [k for k, s in self._sessions.items() if now - s.used > self.idle_s]:
            del self._sessions[key]
