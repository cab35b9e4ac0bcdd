"""A sweep's own records, read and written without Ray (the dashboard reads them too).

    sweep.yaml     the base config with its sweep section (what --resume continues)
    trials.jsonl   what happened to each trial: planned, started, continues (new PBT values),
                   ended (done, stopped early, error), appended as it happens
    summary.json   the final table as data; best.yaml the best trial's config
    <trial>/exploits.jsonl  the PBT exploits of that trial (services/sweep/trial.py)

Every file is read as data: JSON lines whose fields are checked, lines that are not what relay
writes skipped.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from ...contracts.config import RUN_NAME
from ...services.runs.files import open_no_follow, read_regular
from ...services.runs.sinks import MAX_METRICS_BYTES

SWEEP_FILE, TRIALS_FILE, SUMMARY_FILE, BEST_FILE = "sweep.yaml", "trials.jsonl", "summary.json", "best.yaml"
EXPLOITS_FILE = "exploits.jsonl"
ENDED = ("done", "stopped early", "error")
MAX_EXPLOITS_BYTES = 16 << 20


EVENTS = ("planned", "started", "continues", "ended")


def good_line(line: Any) -> bool:
    """A trials.jsonl line as relay writes it: a trial named like a run folder (a name from the
    file becomes a path, so never `..` or a separator), a known event, params a mapping of leaves,
    a known status and a text reason."""
    if not isinstance(line, dict):
        return False
    trial, params = line.get("trial"), line.get("params", {})
    return (
        isinstance(trial, str)
        and RUN_NAME.match(trial) is not None
        and line.get("event") in EVENTS
        and isinstance(params, dict)
        and all(isinstance(k, str) for k in params)
        and line.get("status", "done") in ENDED
        and isinstance(line.get("why", ""), str | None)
    )


class TrialLog:
    """trials.jsonl: appended as trials start and end (never through a link). `skipped` counts the
    lines the last `read` passed over (not what relay writes)."""

    def __init__(self, root: Path) -> None:
        self.path = root / TRIALS_FILE
        self.skipped = 0

    def append(self, **line: Any) -> None:
        with os.fdopen(open_no_follow(self.path), "a", encoding="utf-8") as f:
            f.write(json.dumps({"t": round(time.time(), 3), **line}) + "\n")

    def read(self) -> dict[str, dict[str, Any]]:
        """{trial: its latest state} (lines that are not what relay writes are skipped)."""
        states: dict[str, dict[str, Any]] = {}
        self.skipped = 0
        if not self.path.is_file():
            return states
        for raw in read_regular(self.path, MAX_METRICS_BYTES).splitlines():
            try:
                line = json.loads(raw)
            except ValueError:
                line = None
            if not good_line(line):
                self.skipped += bool(raw.strip())
                continue
            state = states.setdefault(line["trial"], {})
            state.update({k: v for k, v in line.items() if k in ("event", "params", "status", "why")})
        return states


def best_of(path: Path, metric: str, mode: str) -> tuple[float | None, int, float]:
    """(best metric, last env_steps, last wall_s) of a trial's metrics.jsonl."""
    best: float | None = None
    steps, wall = 0, 0.0
    if not path.is_file():
        return best, steps, wall
    for raw in read_regular(path, MAX_METRICS_BYTES).splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(line, dict):
            continue
        value = line.get(metric)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            better = best is None or (value > best if mode == "max" else value < best)
            best = float(value) if better else best
        steps = line.get("env_steps", steps) if isinstance(line.get("env_steps"), int) else steps
        wall = line.get("wall_s", wall) if isinstance(line.get("wall_s"), int | float) else wall
    return best, steps, float(wall)


def summarize(root: Path, metric: str, mode: str) -> list[dict[str, Any]]:
    """One row per trial that started: params, best metric, env steps, wall, status."""
    rows = []
    for trial, state in sorted(TrialLog(root).read().items()):
        if state.get("event") == "planned":
            continue
        best, steps, wall = best_of(root / trial / "metrics.jsonl", metric, mode)
        status = state.get("status") if state.get("event") == "ended" else "interrupted"
        row = {"trial": trial, "params": state.get("params", {}), "best": best, "env_steps": steps}
        rows.append({**row, "wall_s": round(wall, 1), "status": status, "why": state.get("why")})
    return rows


def read_exploits(run: Path) -> list[dict[str, Any]]:
    """A trial's PBT exploits: {iteration, from_trial, from_iteration}, checked field by field."""
    path = run / EXPLOITS_FILE
    if not path.is_file() or path.is_symlink():
        return []
    found = []
    for raw in read_regular(path, MAX_EXPLOITS_BYTES).splitlines():
        try:
            line = json.loads(raw)
            item = {k: line[k] for k in ("iteration", "from_trial", "from_iteration")}
        except (ValueError, KeyError, TypeError):
            continue
        ints = all(
            isinstance(item[k], int) and not isinstance(item[k], bool)
            for k in ("iteration", "from_iteration")
        )
        if ints and isinstance(item["from_trial"], str):
            found.append({**item, "from_trial": item["from_trial"][:200]})
    return found
