"""The run directory (DESIGN.md): config.yaml, append-only metrics.jsonl, checkpoints/, events/."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, TextIO

from services.config import RelayConfig, dump_config


def default_run_name(cfg: RelayConfig) -> str:
    env = cfg.env.id.replace(":", "_").replace("/", "_")
    return f"{env}-{cfg.learner.algo}-{time.strftime('%Y%m%d-%H%M%S')}"


def _json_safe(value: Any) -> Any:
    # JSON has no NaN/inf; null is what a reader can parse.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    """Appends one JSON object per line, flushed and fsynced, so a crash never leaves a torn line.

    On reopening a file whose last line was torn by a kill, the fragment is cut off first.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._repair_tail()
        self._file: TextIO = path.open("a", encoding="utf-8")

    def _repair_tail(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            with self.path.open("r+b") as f:
                f.truncate(keep)

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps({k: _json_safe(v) for k, v in record.items()}, separators=(",", ":"))
        self._file.write(line + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


class RunDir:
    """Creates and names the paths of one run."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.checkpoints = root / "checkpoints"
        self.events = root / "events"
        self.config_path = root / "config.yaml"
        self.metrics_path = root / "metrics.jsonl"

    @staticmethod
    def create(cfg: RelayConfig, run_dir: str | None) -> RunDir:
        root = (
            Path(run_dir)
            if run_dir
            else Path(cfg.metrics.runs_dir) / (cfg.metrics.run_name or default_run_name(cfg))
        )
        rd = RunDir(root)
        rd.checkpoints.mkdir(parents=True, exist_ok=True)
        rd.events.mkdir(parents=True, exist_ok=True)
        tmp = rd.config_path.with_suffix(".yaml.tmp")
        tmp.write_text(dump_config(cfg))
        os.replace(tmp, rd.config_path)
        return rd
