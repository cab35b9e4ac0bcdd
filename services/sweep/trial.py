"""One sweep trial: a plain relay run inside a Ray Tune trial.

Tune's class API maps onto the training loop: `setup` builds the trial's config, claims its run
directory (or reopens it: a resumed sweep, a trial PBT restarts) and places the learner and the
rollout workers in the trial's placement group (Tune captures the actors a trial creates); `step`
is one metrics line; `save_checkpoint` writes a relay checkpoint and hands Tune a copy;
`load_checkpoint` restores one (the trial's own after a restart, another trial's when PBT exploits
it: weights, optimizer, normalizer, reward statistics and counters); `cleanup` (a trial that ends,
that ASHA stops, or the whole sweep on Ctrl-C) closes the metrics, writes the final checkpoint and
ends the actors. Checkpoints are read as data (`load_checkpoint` of services/driver), and the
origin file beside one is JSON checked field by field.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
import traceback
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray import tune

from ...contracts.checkpoint import Checkpoint
from ...rollout_workers.user_code import allow_user_code
from ...services.driver.families import check_resumable, make_backend
from ...services.driver.loop import TrainingLoop
from ...services.driver.preflight import preflight
from ...services.runs.checkpoints import load_checkpoint, load_newest_valid
from ...services.runs.files import atomic_write, open_no_follow
from ...services.runs.metric_keys import catalog
from ...services.runs.run_dir import RunDir, RunDirError
from ...services.runs.sweep_records import EXPLOITS_FILE, read_exploits
from ...services.sweep.plan import quiet_tune, trial_config
from ...services.tracking import TRIAL_TAG

CKPT_FILE, ORIGIN_FILE = "relay.pt", "origin.json"
STOPPED_BY_SWEEP = "stopped by the sweep"
RELAY_DONE = "relay_done"  # in a trial's last result: it met its own stop criterion
LOCK_WAIT_S = 120.0  # a stopping actor's final checkpoint waits at most 30 s for the learner


@dataclass(frozen=True)
class SweepContext:
    """What every trial of a sweep shares (given to each through tune.with_parameters)."""

    base: dict[str, Any]
    root: str  # the sweep's folder, absolute
    workdir: str  # the user's working folder (a module:factory env's module is found there)
    metric: str
    mode: str
    address: str | None
    tags: dict[str, str] | None = None  # the trackers' tags every trial carries (services/tracking)


def report(record: dict[str, Any], metric: str, mode: str) -> dict[str, Any]:
    """A metrics line as Tune's result: its finite numbers, and always the ranked metric (the worst
    value while it is still null, e.g. before the first finished episode)."""
    out: dict[str, Any] = dict(catalog().numeric(record))
    if metric not in out:
        out[metric] = -math.inf if mode == "max" else math.inf
    return out


def read_origin(folder: Path) -> tuple[str, int]:
    """(trial id, iteration) of a checkpoint Tune hands back; JSON read as data, checked."""
    try:
        data = json.loads((folder / ORIGIN_FILE).read_text(encoding="utf-8"))
        trial, iteration = data["trial"], data["iteration"]
    except (OSError, ValueError, KeyError, TypeError):
        return "?", -1
    if not isinstance(trial, str) or not isinstance(iteration, int) or isinstance(iteration, bool):
        return "?", -1
    return trial[:200], iteration


class RelayTrial(tune.Trainable):
    """A relay run as a Tune trainable (see the module docstring)."""

    def setup(self, config: dict[str, Any], sweep: SweepContext) -> None:  # type: ignore[override]
        t0 = time.perf_counter()
        quiet_tune()
        self.ctx = sweep
        spec = config["trial"]
        # Tune's name for the trial (runner.trial_namer, from its first config): PBT copies a better
        # trial's config into this one, its id included, so the config cannot name the trial.
        self.trial_key = self.trial_name
        os.chdir(sweep.workdir)  # Tune starts trials in a folder of its own
        self.cfg = trial_config(sweep.base, dict(spec["params"]))
        allow_user_code(self.cfg, sweep.workdir)
        self.env = preflight(self.cfg, sweep.address)
        self.run, found = self._open_run(Path(sweep.root) / self.trial_key)
        self.backend = make_backend(self.cfg, self.env)
        tags = {**(sweep.tags or {}), TRIAL_TAG: self.trial_key}
        self.loop = TrainingLoop(self.cfg, self.run, self.backend, tracking_tags=tags)
        if found is not None:
            self.loop.restore(found, counters=True)
        self.exploits = len(read_exploits(self.run.root))  # a restarted trial goes on counting
        self.loop.line_extras["pbt_exploits"] = self.exploits
        self.last: dict[str, Any] = report({}, sweep.metric, sweep.mode)
        self.lines: Generator[dict[str, Any], None, None] = self.loop.iterations(
            startup_s=time.perf_counter() - t0
        )

    def _open_run(self, root: Path) -> tuple[RunDir, Checkpoint | None]:
        """The trial's run directory: new, or (a trial Tune restarts, a resumed sweep) its own, with
        its config rewritten (PBT may have changed the values) and its newest valid checkpoint."""
        run = RunDir(root)
        if not run.holds_run():
            return RunDir.claim(root, self.cfg), None
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:  # the trial's previous actor (PBT restarts it) may still be writing its checkpoint
            try:
                run.lock()
                break
            except RunDirError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        run.check_links()
        run.clean_stale_tmp()
        run.write_config(self.cfg)
        found = load_newest_valid(
            run.checkpoints, lambda c, name: check_resumable(self.cfg, self.env, c, name)
        )
        return run, found[1] if found else None

    def step(self) -> dict[str, Any]:
        try:
            record = next(self.lines)
        except StopIteration:
            return {**self.last, "done": True, RELAY_DONE: True}
        except Exception:
            self.run.write_error_log(traceback.format_exc())
            raise
        out = report(record, self.ctx.metric, self.ctx.mode)
        if self.loop.stop_reason() is not None:
            # The run's own stop criterion (the next line would never come); Tune also says done
            # of a trial its scheduler stopped, RELAY_DONE tells them apart.
            out["done"] = out[RELAY_DONE] = True
        self.last = out
        return out

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        path = self.loop.checkpoint()
        shutil.copyfile(path, Path(checkpoint_dir) / CKPT_FILE)
        origin = {"trial": self.trial_key, "iteration": self.loop.c.iteration}
        atomic_write(Path(checkpoint_dir) / ORIGIN_FILE, json.dumps(origin).encode())

    def load_checkpoint(self, checkpoint_dir: str) -> None:  # type: ignore[override]
        folder = Path(checkpoint_dir)
        ckpt = load_checkpoint(folder / CKPT_FILE)
        check_resumable(self.cfg, self.env, ckpt, f"{folder.name}/{CKPT_FILE}")
        trial, iteration = read_origin(folder)
        if trial == self.trial_key:
            # The trial's own (a restart): setup already went on from the run's newest checkpoint,
            # which the trial's last stop wrote; Tune's copy may be older and is then not taken.
            if ckpt.counters.iteration > self.loop.c.iteration:
                self.loop.restore(ckpt, counters=True)
            return
        # Tune hands the exploited checkpoint again when it resumes a paused trial that has not
        # saved since: this trial already went on from it (its own newest checkpoint).
        last = read_exploits(self.run.root)[-1:]
        taken = bool(last) and (last[0]["from_trial"], last[0]["from_iteration"]) == (trial, iteration)
        if taken and self.loop.c.iteration >= iteration:
            return
        # PBT's exploit: another trial's state and counters go on here; nothing of this trial's
        # metrics is dropped (its lines keep the lineage it had), the jump is recorded.
        before = self.loop.c.iteration
        self.loop.restore(ckpt, counters=False)
        self.loop.c = ckpt.counters
        self.exploits += 1
        self.loop.line_extras["pbt_exploits"] = self.exploits
        line = {
            "iteration": before,
            "from_trial": trial,
            "from_iteration": iteration,
            "params": dict(self.config["trial"]["params"]),
        }
        with os.fdopen(open_no_follow(self.run.root / EXPLOITS_FILE), "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")

    def cleanup(self) -> None:
        if self.loop.stopped_by is None:
            self.loop.stopped_by = STOPPED_BY_SWEEP
        failed = (self.run.root / "error.log").exists()
        try:
            self.lines.close()  # the metrics sinks and the progress close
            self.loop.final_checkpoint()
        finally:
            self.loop.close_tracking(failed)
            self.backend.close()
            self.run.unlock()
