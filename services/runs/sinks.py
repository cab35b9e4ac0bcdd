"""Where each metrics record goes: metrics.jsonl always, TensorBoard and Prometheus (through Ray's
metrics, `ray.util.metrics`) when enabled, all with the keys of `contracts/metrics.py`
(Prometheus adds `ray_relay_`)."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, TextIO

from ...contracts.metrics import GROUP_GAUGE_PREFIX, group_metrics
from ...services.runs.files import atomic_write, open_no_follow, read_regular
from ...services.runs.metric_keys import catalog
from ...services.runs.run_dir import RunDir

log = logging.getLogger(__name__)
# A torn line is shorter than this (relay writes lines of a few KB).
MAX_TAIL_BYTES = 1 << 20
# metrics.jsonl of a days-long run: a few hundred MB; more is not a relay metrics file.
MAX_METRICS_BYTES = 8 << 30


def _json_safe(value: Any) -> Any:
    # JSON has no NaN/inf; null is what a reader can parse.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


SYNC_EVERY_S = 1.0  # the fewest seconds between two fsyncs of metrics.jsonl (flushes of events/)


class MetricsWriter:
    """Appends one JSON object per line, flushed at once (a killed process loses no line it wrote);
    fsynced with the first line SYNC_EVERY_S after the last fsync, before every checkpoint (`sync`)
    and on close: a power loss can take only lines newer than the newest checkpoint, which a
    resume drops and writes again. An fsync per line cost a language run about 0.9 ms of its 23 ms rounds.

    On reopening a file whose last line was torn by a kill, the fragment is cut off first.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        # Appends to the run's own regular file only: never through a link, never into a FIFO.
        self._file: TextIO = os.fdopen(open_no_follow(path), "a", encoding="utf-8")
        self._repair_tail()
        self._synced = time.monotonic()
        self._unsynced = False

    def _repair_tail(self) -> None:
        """Cut a torn last line (a kill mid-write), looking only at the file's tail."""
        fd = self._file.fileno()
        size = os.fstat(fd).st_size
        tail = os.pread(fd, min(size, MAX_TAIL_BYTES), max(size - MAX_TAIL_BYTES, 0))
        if tail and not tail.endswith(b"\n"):
            cut = tail.rfind(b"\n")
            os.ftruncate(fd, size - len(tail) + cut + 1 if cut >= 0 else max(size - len(tail), 0))

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps({k: _json_safe(v) for k, v in record.items()}, separators=(",", ":"))
        self._file.write(line + "\n")
        self._file.flush()
        self._unsynced = True
        if time.monotonic() - self._synced >= SYNC_EVERY_S:
            self.sync()

    def sync(self) -> None:
        """Every line written so far on disk."""
        if self._unsynced:
            os.fsync(self._file.fileno())
            self._unsynced = False
        self._synced = time.monotonic()

    def close(self) -> None:
        if not self._file.closed:
            self.sync()
        self._file.close()


def truncate_metrics(path: Path, iteration: int) -> None:
    """Drop metrics lines past `iteration` (a resume writes them again), atomically; unreadable lines
    (a torn line from a kill) are dropped too."""
    if not path.exists():
        return
    kept = []
    for line in read_regular(path, MAX_METRICS_BYTES).splitlines():
        try:
            if json.loads(line)["iteration"] <= iteration:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue
    atomic_write(path, b"".join(x + b"\n" for x in kept))


class TensorBoardSink:
    """Scalars under runs/<name>/events/, one per metric name, step = env_steps."""

    def __init__(self, run: RunDir) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard.writer import FileWriter

        self.writer = FileWriter(str(run.events))
        self._summary = Summary
        self._flushed = time.monotonic()

    def write(self, record: dict[str, Any]) -> None:
        # One event holding every scalar: a tenth of the cost of one add_scalar per metric.
        values = [self._summary.Value(tag=k, simple_value=v) for k, v in catalog().lines(record)]
        self.writer.add_summary(self._summary(value=values), int(record["env_steps"]))
        # Flushed with the first round a second after the last flush, for a live TensorBoard (its
        # writer's own default is 120 s), not every round: that cost a language run 0.4 ms a round.
        if time.monotonic() - self._flushed >= SYNC_EVERY_S:
            self.writer.flush()
            self._flushed = time.monotonic()

    def close(self) -> None:
        self.writer.close()


class PrometheusSink:
    """Gauges `relay_<metric>{run=...}`, a counter of env steps and a histogram of update times,
    exported by Ray's metrics agent (Ray's Prometheus endpoint and Grafana show them)."""

    def __init__(self, run_name: str) -> None:
        from ray.util import metrics

        self._metrics = metrics
        self.tags = {"run": run_name}
        self.gauges: dict[str, Any] = {}
        self.env_steps = metrics.Counter(
            "relay_env_steps_total", "Valid env steps sampled", tag_keys=("run",)
        )
        self.update_seconds = metrics.Histogram(
            "relay_update_seconds",
            "Learner update time per iteration",
            boundaries=[0.01, 0.03, 0.1, 0.3, 1, 3, 10],
            tag_keys=("run",),
        )
        self._last_steps = 0

    def _gauge(self, key: str) -> Any:
        if key not in self.gauges:
            self.gauges[key] = self._metrics.Gauge(
                f"relay_{key}", f"relay learner metric {key}", tag_keys=("run",)
            )
        return self.gauges[key]

    def _group_gauge(self, key: str) -> Any:
        """`relay_group_<key>{run, policy}`: a policy group's value (its own name: a gauge's tag
        keys are fixed, and the run-wide one has no policy)."""
        name = GROUP_GAUGE_PREFIX + key
        if name not in self.gauges:
            self.gauges[name] = self._metrics.Gauge(
                f"relay_{name}", f"relay learner metric {key} of one policy group", tag_keys=("run", "policy")
            )
        return self.gauges[name]

    def write(self, record: dict[str, Any]) -> None:
        for key, value in catalog().numeric(record):
            self._gauge(key).set(value, tags=self.tags)
        for group, key, value in group_metrics(record):
            self._group_gauge(key).set(value, tags={**self.tags, "policy": group})
        steps = int(record["env_steps"])
        if steps > self._last_steps:
            self.env_steps.inc(steps - self._last_steps, tags=self.tags)
            self._last_steps = steps
        if "update_s" in record:
            self.update_seconds.observe(float(record["update_s"]), tags=self.tags)

    def close(self) -> None:
        pass


class MetricsSinks:
    """One record in, every enabled sink out. A failing optional sink is logged, never fatal."""

    def __init__(self, run: RunDir, tensorboard: bool, prometheus: bool, tracking: Any = None) -> None:
        self.jsonl = MetricsWriter(run.metrics_path)
        self.tracking = tracking  # services.tracking.Tracking: buffered, closed by the loop after the run
        self.extra: list[Any] = [tracking] if tracking else []
        if tensorboard:
            self.extra.append(TensorBoardSink(run))
        if prometheus:
            self.extra.append(PrometheusSink(run.root.name))

    def write(self, record: dict[str, Any]) -> None:
        if self.tracking:
            record["tracking_errors"] = self.tracking.errors
        self.jsonl.write(record)
        for sink in self.extra:
            try:
                sink.write(record)
            except Exception as err:  # a metrics backend must never stop training
                log.warning("metrics sink %s failed: %s", type(sink).__name__, err)

    def sync(self) -> None:
        """The metrics lines on disk (before a checkpoint that counts them is written)."""
        self.jsonl.sync()

    def close(self) -> None:
        self.jsonl.close()
        for sink in self.extra:
            if sink is not self.tracking:
                sink.close()
