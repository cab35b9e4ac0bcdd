"""The driver loop: the backend's rounds in, one metrics line per learner iteration and checkpoints
out, progress shown, stopped on the first criterion met.

Ctrl-C and SIGTERM stop it the same way: metrics flushed, a final checkpoint written (the caller
then shuts the actors down). A learner that dies is recreated from the newest checkpoint through
the same restore path `relay resume` uses.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ray.exceptions import GetTimeoutError

from ...contracts.checkpoint import RETURN_WINDOW, Checkpoint, RunCounters
from ...contracts.config import RelayConfig, config_data
from ...contracts.metrics import PHASES, stat_means
from ...contracts.rounds import RoundResult
from ...contracts.segment import ENV_FAULT_KINDS
from ...contracts.spaces import EnvSpec
from ...services.driver.evaluations import EvalRunner, Evaluations
from ...services.driver.fleet import FleetScaler
from ...services.driver.health import FleetLost
from ...services.driver.memory import HostMemory
from ...services.driver.notices import Notices
from ...services.driver.progress import Progress
from ...services.runs.checkpoints import load_newest_valid, write_learner_checkpoint, write_sharded_checkpoint
from ...services.runs.run_dir import RunDir
from ...services.runs.signals import STOP_CODES, raise_pending, signals_held, stop_reason
from ...services.runs.sinks import MetricsSinks, truncate_metrics
from ...services.tracking import RunInfo, Tracking

# Rounds in a row without an update before the run gives up (every segment rejected or lost).
MAX_IDLE_ROUNDS = 20
MAX_LEARNER_RESTARTS = 3
# A signal's stop waits at most this long for the learner's state for the final checkpoint (the
# rollout workers are ended first, so only a learner stuck itself can take that long).
STOP_CHECKPOINT_S = 30.0


# Stops by a signal, not by the run's own criteria: a tracked run ends as KILLED.
INTERRUPTIONS = tuple(STOP_CODES)


class LearnerLost(RuntimeError):
    """The learner actor died; the driver restarts it from the newest checkpoint."""


class NoProgressError(RuntimeError):
    """Rounds keep producing no usable segment; training cannot go on."""


class Backend(Protocol):
    """Where sampling and learning run (`services/driver/backends.py`)."""

    env_spec: EnvSpec | None  # None: a family without an env (a language run)
    sharded_checkpoints: bool  # True: checkpoints are folders every learner rank writes its shards into

    @property
    def num_workers(self) -> int: ...
    def describe(self) -> dict[str, Any]: ...
    def step(self, progress: float, ahead: bool = False, state_after: bool = False) -> RoundResult: ...
    def drain(self, timeout_s: float | None = None) -> RoundResult | None: ...
    def taken(self) -> None: ...
    def stop_sampling(self) -> None: ...
    def worker_pids(self) -> list[int]: ...
    def state_dict(self, timeout_s: float | None = None, shards: Path | None = None) -> dict[str, Any]:
        """The learner's state; `shards` (sharded checkpoints only): every learner rank writes its
        shards there, and the state returned holds the rest."""
        ...

    def storage_problem(self, root: Path) -> str | None:
        """Why the learner's ranks could not write sharded checkpoints under the run folder
        `root` (a rank that does not see the driver's storage), or None."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    def restart_learner(self) -> None: ...
    def evaluation_runner(self) -> EvalRunner: ...
    def reseed_workers(self, stream: int) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class ElasticBackend(Backend, Protocol):
    """A backend whose rollout fleet grows and shrinks (rollout.autoscale: the env family's async
    Ray backend, the only one the config's rules allow it for)."""

    @property
    def backlog(self) -> int: ...
    def resize(self, target: int) -> None: ...


def _mean(xs: list[float] | list[int]) -> float | None:
    return sum(xs) / len(xs) if xs else None


class TrainingLoop:
    """One run: the backend's rounds in, metrics lines and checkpoints out."""

    def __init__(
        self, cfg: RelayConfig, run: RunDir, backend: Backend, tracking_tags: dict[str, str] | None = None
    ) -> None:
        self.cfg = cfg
        self.run = run
        self.backend = backend
        self.c = RunCounters()
        self.stopped_by: str | None = None
        self._idle_rounds = 0
        self._last_ckpt = 0
        self._phases: dict[str, float] = {}  # seconds by phase since the previous metrics line
        ro = cfg.rollout
        self.fleet = FleetScaler(ro.min_workers, ro.max_workers) if ro.autoscale else None
        self.elastic = backend if isinstance(backend, ElasticBackend) else None
        assert self.elastic is not None or self.fleet is None, "rollout.autoscale needs an elastic backend"
        self._last_line_t = time.perf_counter()
        self._run_ahead = False  # iterations() says
        self.notices = Notices()
        self.memory = HostMemory(backend.worker_pids)
        self.evals = (
            Evaluations(cfg, run, backend.evaluation_runner(), backend.env_spec)
            if cfg.eval.every_iterations
            else None
        )
        info = RunInfo(run.root, config_data(cfg), tags=tracking_tags or {})
        self.tracking = Tracking.from_config(cfg, info)
        self.line_extras: dict[str, Any] = {}  # keys a caller adds to every line (a sweep's pbt_exploits)

    def _progress_fraction(self) -> float:
        budget = self.cfg.stop.env_steps
        return min(self.c.env_steps / budget, 1.0) if budget else 0.0

    def close_tracking(self, failed: bool) -> None:
        """Send the tracked run (metrics.mlflow, metrics.wandb) its files and its status."""
        if not self.tracking:
            return
        if failed:
            status = "FAILED"
        elif self.stopped_by in INTERRUPTIONS:
            status = "KILLED"
        else:
            status = "FINISHED"
        self.tracking.close(status, self.run.artifacts())

    def stop_reason(self) -> str | None:
        """The stop criterion met now, or None."""
        s = self.cfg.stop
        # Not right after a round that did not update (a lost segment's): its steps wait in the
        # learner's buffer, untrained, and the run's last line would count fewer than the budget.
        if s.env_steps is not None and self.c.env_steps >= s.env_steps and self._idle_rounds == 0:
            return "env_steps"
        if s.iterations is not None and self.c.iteration >= s.iterations:
            return "iterations"
        mean_return = _mean(self.c.returns)
        if (
            s.episode_return_mean is not None
            and mean_return is not None
            and len(self.c.returns) >= RETURN_WINDOW
            and mean_return >= s.episode_return_mean
        ):
            return "episode_return_mean"
        if s.wall_s is not None and self.c.wall_s >= s.wall_s:
            return "wall_s"
        scored = self.evals.last_return if self.evals is not None else None
        if s.eval_return_mean is not None and scored is not None and scored >= s.eval_return_mean:
            return "eval_return_mean"
        return None

    def _record(self, metrics: dict[str, Any], startup_s: float | None) -> dict[str, Any]:
        c = self.c
        faults = {f"env_faults_{k}": c.env_faults.get(k, 0) for k in ENV_FAULT_KINDS}
        rec: dict[str, Any] = {
            "iteration": c.iteration,
            "env_steps": c.env_steps,
            "wall_s": round(c.wall_s, 4),
            "episodes": c.episodes,
            "episode_return_mean": _mean(c.returns),
            "episode_return_min": min(c.returns) if c.returns else None,
            "episode_return_max": max(c.returns) if c.returns else None,
            "episode_len_mean": _mean(c.lengths),
            "env_steps_per_s": c.env_steps / max(c.wall_s, 1e-9),
            **stat_means(c.stats),
            **metrics,
            **self.memory.sample(),
            "worker_restarts": c.worker_restarts,
            "stuck_workers": c.stuck_workers,
            "learner_restarts": c.learner_restarts,
            "lost_segments": c.lost_segments,
            "rejected_segments": c.rejected_segments,
            "amp_skipped_steps": c.amp_skipped_steps,
            "env_faults": sum(faults.values()),
            **faults,
            **self.line_extras,
        }
        if startup_s is not None:
            rec["startup_s"] = round(startup_s, 4)
        return rec

    # ---- checkpoints -----------------------------------------------------------------------------
    def checkpoint(self, timeout_s: float | None = None) -> Path:
        if self.backend.sharded_checkpoints:
            return write_sharded_checkpoint(
                self.run.checkpoints,
                self.cfg,
                self.c,
                lambda shards: self.backend.state_dict(timeout_s, shards),
            )
        state = self.backend.state_dict(timeout_s)
        return write_learner_checkpoint(self.run.checkpoints, self.cfg, self.backend.env_spec, state, self.c)

    def restore(self, ckpt: Checkpoint, counters: bool) -> None:
        """The one restore path: load a checkpoint into the learner; with `counters` (a resume) the
        run's counters and metrics continue from it too (a recovered learner keeps the run's)."""
        self.backend.load_state_dict(ckpt.learner)
        if counters:
            self.c = ckpt.counters
            # Workers' RNG states are not checkpointed; a stream per resume point keeps a resumed
            # run reproducible without replaying the envs and noise the run started with.
            self.backend.reseed_workers(self.c.iteration)
            truncate_metrics(self.run.metrics_path, self.c.iteration)

    def _recover_learner(self, err: LearnerLost) -> None:
        """Restart the learner from the newest checkpoint; the run's counters go on."""
        self.c.learner_restarts += 1
        if self.c.learner_restarts > MAX_LEARNER_RESTARTS:
            raise RuntimeError(f"learner died {self.c.learner_restarts} times; giving up ({err})")
        self.backend.restart_learner()
        found = load_newest_valid(self.run.checkpoints)
        if found is not None:
            self.restore(found[1], counters=False)
        where = found[0].name if found else "initial weights (no checkpoint yet)"
        print(f"relay: learner lost ({err}); restarted from {where}", file=sys.stderr, flush=True)

    def _take_phases(self) -> dict[str, float | int]:
        """Seconds by phase since the previous line, the learner's busy fraction of that time, and
        the live rollout workers."""
        now = time.perf_counter()
        span, self._last_line_t = max(now - self._last_line_t, 1e-9), now
        phases = {key: self._phases.get(key, 0.0) for key in PHASES}
        self._phases = {}
        busy = (phases["ingest_s"] + phases["update_s"] + phases["publish_s"]) / span
        return {**phases, "learner_busy": min(busy, 1.0), "num_workers": self.backend.num_workers}

    def _count_idle_round(self, out: RoundResult) -> None:
        self._idle_rounds += 1
        if out.reject_reason:
            self.notices.say("rejected", f"segment rejected: {out.reject_reason}")
        if self._idle_rounds >= MAX_IDLE_ROUNDS:
            why = out.reject_reason or "every segment was lost (rollout workers keep failing)"
            raise NoProgressError(f"no update in {MAX_IDLE_ROUNDS} rounds in a row: {why}")

    # ---- the loop --------------------------------------------------------------------------------
    def run_until_stop(self, startup_s: float | None = None) -> str:
        """Train until a stop criterion; returns which one, or 'interrupted' (Ctrl-C), 'terminated'
        (SIGTERM) or 'hangup' (SIGHUP). Either way the metrics are flushed and a final checkpoint
        written; too few live rollout workers (FleetLost) checkpoint too, then raise."""
        lost: FleetLost | None = None
        try:
            for _ in self.iterations(startup_s, run_ahead=True):
                pass
        except FleetLost as err:
            lost = err
        except KeyboardInterrupt:
            pass
        self.final_checkpoint()
        if lost is not None:
            raise lost
        return self.stopped_by or "error"

    def iterations(
        self, startup_s: float | None = None, run_ahead: bool = False
    ) -> Generator[dict[str, Any], None, None]:
        """Each metrics record as it is written, until a stop criterion (then `stopped_by` names it).

        `run_ahead`: async rounds may be submitted behind the one training (`_runs_ahead`), for a
        caller that reads nothing of the learner's between records (a sweep trial checkpoints
        between them); a round still ahead when the loop ends is taken as a round.

        The sinks and the progress display are open while this runs and closed when it ends,
        raises, or is closed by its caller (a sweep trial that Tune stops: the caller sets
        `stopped_by` first). Ctrl-C, SIGTERM, SIGHUP and FleetLost set `stopped_by`, end the
        rollout workers (a stop ends in bounded time whatever a worker is doing: a learner waiting
        on a stuck worker's segment is freed to hand over its state), and propagate.
        """
        writer = MetricsSinks(
            self.run,
            self.cfg.metrics.tensorboard,
            prometheus=self.cfg.rollout.num_workers > 0,
            tracking=self.tracking,
        )
        progress = Progress(self.cfg)
        clock = (self.c.wall_s, time.perf_counter())  # wall_s so far, and when this session started
        self._last_line_t = clock[1]
        self._last_ckpt = self.c.iteration
        self._run_ahead = run_ahead
        try:
            while (reason := self.stop_reason()) is None:
                raise_pending()  # a stop whose exception was dropped on its way (signals.py)
                try:
                    rec = self._round(writer, progress, clock, startup_s)
                except LearnerLost as err:
                    self._recover_learner(err)
                    continue
                if rec is not None:
                    yield rec
            self.stopped_by = reason
        except (KeyboardInterrupt, FleetLost) as err:
            self.stopped_by = "fleet lost" if isinstance(err, FleetLost) else stop_reason(err)
            self.backend.stop_sampling()
            raise
        finally:
            try:
                self._take_rounds_left(writer, progress, clock)
            finally:
                writer.close()
                self.notices.close()
            if self.evals is not None:
                self.evals.close()
            progress.close(self.stopped_by)

    def final_checkpoint(self) -> None:
        """The stop's checkpoint, when an iteration came after the last one written."""
        if self.c.iteration > self._last_ckpt:
            self._final_checkpoint()

    def _final_checkpoint(self) -> None:
        try:
            self.checkpoint(STOP_CHECKPOINT_S)
        except GetTimeoutError:
            print(
                f"relay: the learner did not hand over its state within {STOP_CHECKPOINT_S:.0f} s; "
                "no final checkpoint (the newest one on disk stands)",
                file=sys.stderr,
                flush=True,
            )

    def _runs_ahead(self) -> bool:
        """Whether the next round may be submitted behind this one (async rounds on Ray, a fixed
        fleet): not when this round meets stop.env_steps or stop.iterations, whose state read (the
        stop's) must find no round ahead that the counters do not know. A round that ends on a checkpoint runs
        ahead with the checkpoint's state asked for before it (`_checkpoints_next`)."""
        # Not with the elastic fleet: its grow and retire rules read the learner's idle time and
        # the segments waiting between rounds, both measured on rounds that do not run ahead.
        if not self._run_ahead or self.cfg.rollout.mode != "async" or self.cfg.rollout.autoscale:
            return False
        budget, last = self.cfg.stop.env_steps, self.cfg.stop.iterations
        if last is not None and self.c.iteration + 1 >= last:
            return False  # the next round is the last: none may run ahead of it
        return budget is None or self.c.env_steps + self.cfg.update_steps < budget

    def _checkpoints_next(self) -> bool:
        """Whether the next round that updates ends on a checkpoint."""
        return (self.c.iteration + 1) % self.cfg.checkpoint.interval == 0

    def _take_rounds_left(self, writer: MetricsSinks, progress: Progress, clock: tuple[float, float]) -> None:
        """Rounds the learner was given whose results the loop has not taken (one a signal
        interrupted, one submitted ahead of a stop) are taken as rounds: their lines written and
        their counters counted before the final checkpoint reads the learner's state. A learner
        that is gone or silent leaves them untaken."""
        try:
            while (out := self.backend.drain(STOP_CHECKPOINT_S)) is not None:
                self._take(out, writer, progress, clock, None, final=True)
        except (LearnerLost, GetTimeoutError):
            return

    def _round(
        self, writer: MetricsSinks, progress: Progress, clock: tuple[float, float], startup_s: float | None
    ) -> dict[str, Any] | None:
        """One round: its metrics line when it updated (then a checkpoint on the interval), or None."""
        ahead = self._runs_ahead()
        out = self.backend.step(
            self._progress_fraction(), ahead=ahead, state_after=ahead and self._checkpoints_next()
        )
        return self._take(out, writer, progress, clock, startup_s)

    def _take(
        self,
        out: RoundResult,
        writer: MetricsSinks,
        progress: Progress,
        clock: tuple[float, float],
        startup_s: float | None,
        final: bool = False,
    ) -> dict[str, Any] | None:
        """A round's result counted: its metrics line when it updated (then a checkpoint on the
        interval), or None. `final` (the loop is ending): no evaluation, no change to the fleet.

        A stop signal waits while the round is counted and its line written: landing between the
        two, it would leave a final checkpoint counting an iteration that has no line."""
        with signals_held():
            self.backend.taken()  # the backend forgets the round as the loop counts it, not before
            self.c.wall_s = clock[0] + time.perf_counter() - clock[1]
            self.c.absorb(out)
            if out.lost_segments:
                self.notices.say("lost", "segment lost: its rollout worker failed", out.lost_segments)
            for key, seconds in out.phases.items():
                self._phases[key] = self._phases.get(key, 0.0) + seconds
            if out.metrics is None:
                self._count_idle_round(out)
                return None
            self._idle_rounds = 0
            self.c.iteration += 1
            evals = self.evals if not final else None
            scores = evals.take_finished(self.c) if evals is not None else {}
            rec = self._record(
                {**out.metrics, **self._take_phases(), **scores}, startup_s if self.c.iteration == 1 else None
            )
            writer.write(rec)  # before the checkpoint: a resume truncates metrics to the checkpoint
            self.run.append_samples(self.c.iteration, out.samples)
        progress.update(rec)
        if evals is not None:  # not held: a language run's evaluation runs here, and a stop may cut it
            evals.start_if_due(self.c.iteration)
        if self.fleet is not None and self.elastic is not None and not final:
            target = self.fleet.decide(rec["learner_busy"], self.elastic.backlog, self.elastic.num_workers)
            if target != self.elastic.num_workers:
                self.elastic.resize(target)
        if self.c.iteration % self.cfg.checkpoint.interval == 0:
            writer.sync()  # the lines it counts on disk first (a resume truncates to it)
            self.checkpoint()
            self._last_ckpt = self.c.iteration
        return rec
