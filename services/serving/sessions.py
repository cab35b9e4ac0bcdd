"""Per-client state for a recurrent policy served by `relay serve`: a session id names one client's
sequence of calls, and the replica keeps the policy's state between them.

A session starts from zeros (an episode's start), carries the state its last answer left, and starts
over when the client says `"reset": true`. A client that names a `"session_key"` (a secret of its
own) in its session's first call owns it: a call without that key, from another client that knows or
guesses the id, is refused (403) and counted, so nobody else can reset or advance it. Nothing
restarts silently: every answer says what the state was (`new`, `carried`, `reset`, `expired`, or
`weights changed` when `--follow` swapped in another checkpoint since the session's last call, whose
state meant something to the old weights only). A replica that restarted has no sessions: its
answers say `new` to a client that expected `carried`. Idle sessions expire after `idle_s`; past
`capacity` live sessions, or past `max_bytes` of state (a session of 4,096 rows of a wide core holds
megabytes: a count alone let 1,000 of them take a replica from 0.5 to 4.3 GB), a new one is refused
(503, saying which) rather than evicting a client mid-episode.

One replica keeps its sessions in a `SessionStore` of its own. Several replicas share one, held by
a Serve deployment of its own (`services/serving/app.py`), so a client's calls may land on any
replica (Serve routes each call to the least busy one) and still carry the state: each batch
starts its sessions in one call (`start_many`) and keeps their new states in one more
(`keep_many`) before it answers, so a client's next call, wherever it lands, starts from them.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

MAX_SESSION_CHARS = 128
SESSION_ID = re.compile(rf"[A-Za-z0-9_.:-]{{1,{MAX_SESSION_CHARS}}}")


class SessionsFull(RuntimeError):
    """Every session slot holds a live client."""


class SessionForbidden(RuntimeError):
    """A call without the key its live session was started with (another client's session)."""


# A session call to start: (session id, rows, state width, what the weights are, reset, key)
Start = tuple[str, int, int, str, bool, str | None]
# How it starts: (the state [rows, width], "new" | "carried" | ...), or (None, why not, HTTP status)
Started = tuple[np.ndarray | None, str, int]
# A state to keep: (session id, state [rows, width], what the weights are, key)
Keep = tuple[str, np.ndarray, str, str | None]


class Sessions(Protocol):
    """Where a service's sessions live: its own store, or one its replicas share."""

    def start_many(self, calls: list[Start]) -> list[Started]: ...

    def keep_many(self, states: list[Keep]) -> None: ...


@dataclass
class _Session:
    state: np.ndarray  # [rows, S]
    version: str  # what the state was computed with (the served file)
    used: float
    key: str | None = None  # the client's secret its first call named: every later call names it


class SessionStore:
    """session id -> the state its last call left, for `capacity` live sessions idle < `idle_s`."""

    def __init__(self, idle_s: float = 600.0, capacity: int = 10_000, max_bytes: int = 512 << 20) -> None:
        self.idle_s, self.capacity, self.max_bytes = idle_s, capacity, max_bytes
        self._sessions: dict[str, _Session] = {}
        self.bytes = 0  # the states' bytes held now
        self.forbidden = 0  # calls refused for naming another client's session without its key

    def __len__(self) -> int:
        return len(self._sessions)

    def start(
        self, session: str, rows: int, width: int, version: str, reset: bool, key: str | None = None
    ) -> tuple[np.ndarray, str]:
        """The state a call of `rows` rows starts from, and what it is: "carried", "new", "reset",
        "expired" or "weights changed". Raises ValueError (the rows differ from the session's),
        SessionForbidden (a live session started with another key) or SessionsFull."""
        now = time.monotonic()
        found = self._sessions.get(session)
        live = found is not None and now - found.used <= self.idle_s
        if live and found is not None and found.key is not None and key != found.key:
            self.forbidden += 1
            raise SessionForbidden(
                f"session {session!r} is another client's: its calls carry the session_key its first "
                "call named (use a session id of your own)"
            )
        if found is not None and now - found.used > self.idle_s:
            self._drop(session)
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
            need = rows * width * np.dtype(np.float32).itemsize
            if self.bytes + need > self.max_bytes:
                raise SessionsFull(
                    f"live sessions hold {self.bytes / 2**20:.1f} MiB of state and this one needs "
                    f"{need / 2**20:.1f} MiB more, over the {self.max_bytes / 2**20:.0f} MiB the replica "
                    "keeps; try again once one idles out"
                )
        return np.zeros((rows, width), dtype=np.float32), status

    def keep(self, session: str, state: np.ndarray, version: str, key: str | None = None) -> None:
        found = self._sessions.get(session)
        key = found.key if found is not None and found.key is not None else key
        self._drop(session)
        self._sessions[session] = _Session(state, version, time.monotonic(), key)
        self.bytes += state.nbytes

    def _drop(self, session: str) -> None:
        found = self._sessions.pop(session, None)
        if found is not None:
            self.bytes -= found.state.nbytes

    def start_many(self, calls: list[Start]) -> list[Started]:
        """`start` for each call, in order: a refused one is (None, why, 400 or 503)."""
        out: list[Started] = []
        for session, rows, width, version, reset, key in calls:
            try:
                out.append((*self.start(session, rows, width, version, reset, key), 200))
            except ValueError as err:
                out.append((None, str(err), 400))
            except SessionForbidden as err:
                out.append((None, str(err), 403))
            except SessionsFull as err:
                out.append((None, str(err), 503))
        return out

    def keep_many(self, states: list[Keep]) -> None:
        for session, state, version, key in states:
            self.keep(session, state, version, key)

    def _expire(self, now: float) -> None:
        for key in [k for k, s in self._sessions.items() if now - s.used > self.idle_s]:
            self._drop(key)
