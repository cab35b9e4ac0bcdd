"""Experiment tracking (MLflow, Weights & Biases): a run's config, metrics lines and files, sent off
the training loop.

Training never waits for a tracking server: each metrics line goes into a bounded queue that a
thread of its own empties in batches. A call that fails (a server down, slow, refusing) is retried
with backoff while the lines wait; every failed attempt and every line dropped from a full queue
counts in `tracking_errors` (on the next metrics line), and the first failure of each tracker is
one warning line on stderr, not a traceback per iteration. Closing waits a bounded time for the
queue to drain, then sends the run's files and its status.

A tracker kind is a module with its `Settings` (a TrackerSettings: its section `metrics.<name>`)
and a `Client` (`start`, `log`, `log_files`, `finish`), listed in TRACKERS below; its package is
imported only when a config names it (the extras `mlflow`, `wandb`).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import Field

from ...contracts.config import EntrySection, RelayConfig, entry_section, redact_text
from ...rollout_workers.user_code import one_line
from ...services.runs.metric_keys import catalog

# its section under `metrics` -> (module holding its Settings and Client, the package it needs = its
# extra). Modules by name: a client module imports this one, and its package only when it starts.
TRACKERS: dict[str, tuple[str, str]] = {
    "mlflow": ("relay_rl.services.tracking.mlflow_client", "mlflow"),
    "wandb": ("relay_rl.services.tracking.wandb_client", "wandb"),
}
QUEUE_LINES = 10_000  # lines held while a server is away (~hours of a CartPole run); older ones dropped
BATCH_LINES = 50  # lines sent in one call
RETRY_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)  # backoff between failed attempts, the last repeated
CLOSE_WAIT_S = 30.0  # how long closing waits for the queue to drain and the files to go


class TrackerSettings(EntrySection):
    """What every tracker's section holds besides its own settings."""

    min_interval_s: float = Field(
        1.0,
        ge=0,
        le=86_400,
        description="Send metrics at most this often, the lines in between batched into one call "
        "(every line arrives; 0: a call per line).",
    )


def tracker_module(name: str) -> Any:
    """The module of tracker `name` (its Settings and Client); its package is not imported."""
    return importlib.import_module(TRACKERS[name][0])


def tracker_settings(cfg: RelayConfig, name: str) -> Any:
    """`metrics.<name>` validated by the tracker's own Settings, or None where the run does not
    track there (ConfigError naming the leaf where the section is wrong)."""
    if cfg.metrics.entry_data(name) is None:
        return None
    return entry_section(cfg.metrics, "metrics", name, tracker_module(name).Settings)


class Client(Protocol):
    """One tracker's calls; each may raise (the runner retries and counts). `local`: the tracker
    writes only on this machine (W&B offline), so closing waits for a start still in progress;
    one that talks to a server is not waited for until that server has answered once."""

    local: bool

    def start(self) -> None: ...
    def log(self, lines: list[dict[str, Any]]) -> None: ...
    def log_files(self, files: list[tuple[Path, str]]) -> None: ...
    def finish(self, status: str) -> None: ...


@dataclass(frozen=True)
class RunInfo:
    """What a tracker names the run by: its directory, its resolved config, and tags (in a sweep:
    SWEEP_TAG the sweep's folder name, TRIAL_TAG the trial, MLflow's parent-run tag its parent)."""

    root: Path
    config: dict[str, Any]
    tags: dict[str, str] = field(default_factory=dict)


SWEEP_TAG, TRIAL_TAG = "relay.sweep", "relay.trial"
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own tag for a nested run (a sweep's trial)


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """{"learner.lr": "0.0003", ...}: a nested config as flat string parameters (lists as YAML flow)."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = "null" if value is None else str(value)
    return out


def metric_lines(record: dict[str, Any]) -> dict[str, Any]:
    """The numeric metrics of one line (what a tracker charts), with its env_steps and iteration."""
    return {
        **dict(catalog().lines(record)),
        "env_steps": record["env_steps"],
        "iteration": record["iteration"],
    }


class Tracker:
    """One Client behind a queue and a thread: `write` never blocks, `close` is bounded."""

    def __init__(
        self, name: str, client: Client, warn: Callable[[str], None], min_interval_s: float = 0.0
    ) -> None:
        self.name = name
        self.client = client
        self.errors = 0
        self.min_interval_s = min_interval_s
        self._sent_at = -math.inf  # time.monotonic() of the last lines queued
        self._held: list[dict[str, Any]] = []  # lines not queued yet: they go together
        self._warn = warn
        self._warned = False
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(QUEUE_LINES)
        self._ready = threading.Event()  # the client started: the server answered once
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, name=f"relay-{name}", daemon=True)
        self._thread.start()

    def offer(self, record: dict[str, Any]) -> None:
        """A metrics record: held, and every held line queued together once `min_interval_s` has
        passed since the last lines queued (or at close), so they leave in one call. A call every
        iteration of a fast run (CartPole: ~70 a second) would cost a tracking server, on the same
        machine, a quarter of the training's throughput (benchmarks/sweeps.py); every line still
        arrives, at env_steps of its own."""
        self._held.append(metric_lines(record))
        now = time.monotonic()
        if now - self._sent_at >= self.min_interval_s:
            self._sent_at = now
            self._flush_held()

    def _flush_held(self) -> None:
        held, self._held = self._held, []
        for line in held:
            self.write(line)

    def write(self, line: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(line)
        except queue.Full:  # the oldest line goes: the newest tell where training is
            self._failed(f"{QUEUE_LINES} lines waiting; the oldest dropped")
            try:
                self._queue.get_nowait()
                self._queue.put_nowait(line)
            except (queue.Empty, queue.Full):
                pass

    def _failed(self, why: str) -> None:
        self.errors += 1
        if not self._warned:
            self._warned = True
            self._warn(
                f"relay: {self.name} tracking failed ({redact_text(why)}); training goes on, lines are "
                "kept and retried (tracking_errors counts the failures)"
            )

    def _attempt(self, call: Callable[[], None]) -> bool:
        """Call until it succeeds or the tracker is closing; False if it never did."""
        for attempt in range(1_000_000):
            try:
                call()
                return True
            except Exception as err:
                self._failed(one_line(err))
                if self._stop.wait(RETRY_S[min(attempt, len(RETRY_S) - 1)]):
                    return False
        return False

    def _drain(self) -> None:
        if not self._attempt(self.client.start):
            return
        self._ready.set()
        while True:
            batch = self._take()
            if batch is None:
                return
            if batch and not self._attempt(lambda b=batch: self.client.log(b)):  # type: ignore[misc]
                return

    def _take(self) -> list[dict[str, Any]] | None:
        """Up to BATCH_LINES lines (waiting for the first); None once `close` ended the queue."""
        first = self._queue.get()
        if first is None:
            return None
        batch = [first]
        while len(batch) < BATCH_LINES:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                self._queue.put(None)  # seen again on the next take: the batch goes first
                break
            batch.append(nxt)
        return batch

    def close(self, status: str, files: list[tuple[Path, str]], deadline: float) -> int:
        """Drain until `deadline` (time.monotonic), then send the files and the status; a tracker
        whose server never answered is not waited for (a local one is, until the deadline).
        Returns the lines that never reached it."""
        self._flush_held()  # the run's last lines always go
        self._queue.put(None)
        if not self._ready.is_set() and self.client.local:
            # A short run can end before a local tracker started (W&B offline's init takes
            # seconds on a loaded machine): its lines still go.
            self._ready.wait(max(deadline - time.monotonic(), 0.0))
        if self._ready.is_set():
            self._thread.join(max(deadline - time.monotonic(), 0.0))
        self._stop.set()  # a retry loop still waiting ends now
        self._thread.join(1.0)
        left = max(self._queue.qsize() - 1, 0)  # the end marker is no line
        if self._ready.is_set() and not self._thread.is_alive():
            for call in (lambda: self.client.log_files(files), lambda: self.client.finish(status)):
                try:
                    call()
                except Exception as err:
                    self._failed(one_line(err))
        return left


class Tracking:
    """Every tracker a config names; `errors` is what `tracking_errors` reports."""

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers

    @classmethod
    def from_config(
        cls, cfg: RelayConfig, info: RunInfo, warn: Callable[[str], None] | None = None
    ) -> Tracking:
        say = warn or (lambda text: print(text, file=sys.stderr, flush=True))
        trackers = []
        for name in TRACKERS:
            settings = tracker_settings(cfg, name)
            if settings is not None:
                client = tracker_module(name).Client(settings, info)
                trackers.append(Tracker(name, client, say, settings.min_interval_s))
        return cls(trackers)

    def __bool__(self) -> bool:
        return bool(self.trackers)

    @property
    def errors(self) -> int:
        return sum(t.errors for t in self.trackers)

    def write(self, record: dict[str, Any]) -> None:
        for tracker in self.trackers:
            tracker.offer(record)

    def close(self, status: str, files: list[tuple[Path, str]]) -> None:
        deadline = time.monotonic() + CLOSE_WAIT_S
        for tracker in self.trackers:
            left = tracker.close(status, files, deadline)
            if left:
                print(
                    f"relay: {tracker.name} tracking: {left} metrics lines were not delivered "
                    "(metrics.jsonl has them all)",
                    file=sys.stderr,
                    flush=True,
                )


def missing_tracker(cfg: RelayConfig) -> str | None:
    """A one-line refusal when the config names a tracker whose package is not installed."""
    for name, (_module, package) in TRACKERS.items():
        if cfg.metrics.entry_data(name) is not None and importlib.util.find_spec(package) is None:
            return (
                f"metrics.{name} needs {package}, which is not installed: pip install 'relay-rl[{package}]'"
            )
    return None


def import_tracker_package(name: str, package: str, extra: str) -> Any:
    """The tracker's library, or an ImportError naming the extra that installs it."""
    try:
        return importlib.import_module(package)
    except ImportError:
        raise ImportError(f"metrics.{name} needs {package}: pip install 'relay-rl[{extra}]'") from None
