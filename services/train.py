"""`relay train` / `python -m services.train`: the driver loop.

Builds the backend, paces rounds, writes one metrics line per learner iteration, checkpoints,
shows progress and stops on the first criterion met. Ctrl-C stops cleanly: files are flushed,
a final checkpoint written, actors shut down.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from services.backends import Backend, LearnerLost
from services.checkpoints import load_newest_valid, save_checkpoint
from services.config import RelayConfig
from services.progress import Progress
from services.run_dir import RunDir
from services.sinks import MetricsSinks

RETURN_WINDOW = 20
# Rounds in a row without an update before the run gives up (every segment rejected or lost).
MAX_IDLE_ROUNDS = 20
MAX_LEARNER_RESTARTS = 3


class NoProgressError(RuntimeError):
    """Rounds keep producing no usable segment; training cannot go on."""


@dataclass
class Counters:
    """Run counters; checkpointed, so a resumed run continues them."""

    iteration: int = 0
    env_steps: int = 0
    episodes: int = 0
    wall_s: float = 0.0
    worker_restarts: int = 0
    learner_restarts: int = 0
    lost_segments: int = 0
    rejected_segments: int = 0
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)


def _mean(xs: Any) -> float | None:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


class TrainingLoop:
    """One run: the backend's rounds in, metrics lines and checkpoints out."""

    def __init__(
        self, cfg: RelayConfig, run: RunDir, backend: Backend, counters: Counters | None = None
    ) -> None:
        self.cfg = cfg
        self.run = run
        self.backend = backend
        self.c = counters or Counters()
        self.returns: deque[float] = deque(self.c.returns, maxlen=RETURN_WINDOW)
        self.lengths: deque[int] = deque(self.c.lengths, maxlen=RETURN_WINDOW)
        self.stopped_by: str | None = None
        self._idle_rounds = 0

    def _progress_fraction(self) -> float:
        budget = self.cfg.stop.env_steps
        return min(self.c.env_steps / budget, 1.0) if budget else 0.0

    def _stop_reason(self) -> str | None:
        s = self.cfg.stop
        if s.env_steps is not None and self.c.env_steps >= s.env_steps:
            return "env_steps"
        mean_return = _mean(self.returns)
        if (
            s.episode_return_mean is not None
            and mean_return is not None
            and len(self.returns) >= RETURN_WINDOW
            and mean_return >= s.episode_return_mean
        ):
            return "episode_return_mean"
        if s.wall_s is not None and self.c.wall_s >= s.wall_s:
            return "wall_s"
        return None

    def _absorb(self, out: dict[str, Any]) -> None:
        self.c.env_steps += out["env_steps"]
        self.c.episodes += len(out["episode_returns"])
        self.returns.extend(out["episode_returns"])
        self.lengths.extend(out["episode_lengths"])
        self.c.worker_restarts += out.get("worker_restarts", 0)
        self.c.lost_segments += out.get("lost_segments", 0)
        self.c.rejected_segments += out["rejected"]

    def _record(self, metrics: dict[str, Any], startup_s: float | None) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "iteration": self.c.iteration,
            "env_steps": self.c.env_steps,
            "wall_s": round(self.c.wall_s, 4),
            "episodes": self.c.episodes,
            "episode_return_mean": _mean(self.returns),
            "episode_return_min": min(self.returns) if self.returns else None,
            "episode_return_max": max(self.returns) if self.returns else None,
            "episode_len_mean": _mean(self.lengths),
            "env_steps_per_s": self.c.env_steps / max(self.c.wall_s, 1e-9),
            **metrics,
            "worker_restarts": self.c.worker_restarts,
            "learner_restarts": self.c.learner_restarts,
            "lost_segments": self.c.lost_segments,
            "rejected_segments": self.c.rejected_segments,
        }
        if startup_s is not None:
            rec["startup_s"] = round(startup_s, 4)
        return rec

    def _recover_learner(self, err: LearnerLost) -> None:
        """Restart the learner and load the newest checkpoint; the run's counters go on."""
        self.c.learner_restarts += 1
        if self.c.learner_restarts > MAX_LEARNER_RESTARTS:
            raise RuntimeError(f"learner died {self.c.learner_restarts} times; giving up ({err})")
        self.backend.restart_learner()
        found = load_newest_valid(self.run.checkpoints)
        if found is not None:
            self.backend.load_state_dict(found[1]["learner"])
        where = found[0].name if found else "initial weights (no checkpoint yet)"
        print(f"relay: learner lost ({err}); restarted from {where}", file=sys.stderr, flush=True)

    def _count_idle_round(self, out: dict[str, Any]) -> None:
        self._idle_rounds += 1
        if out.get("reject_reason"):
            print(f"relay: segment rejected: {out['reject_reason']}", file=sys.stderr, flush=True)
        if self._idle_rounds >= MAX_IDLE_ROUNDS:
            why = out.get("reject_reason") or "every segment was lost (rollout workers keep failing)"
            raise NoProgressError(f"no update in {MAX_IDLE_ROUNDS} rounds in a row: {why}")

    def checkpoint(self) -> None:
        self.c.returns, self.c.lengths = list(self.returns), list(self.lengths)
        state = {
            "learner": self.backend.state_dict(),
            "counters": asdict(self.c),
            "config": self.cfg.model_dump(mode="json"),
        }
        save_checkpoint(self.run.checkpoints, self.c.iteration, state, self.cfg.checkpoint.keep)

    def run_until_stop(self, startup_s: float | None = None) -> str:
        """Train until a stop criterion; returns which one (or 'interrupted')."""
        writer = MetricsSinks(
            self.run, self.cfg.metrics.tensorboard, prometheus=self.cfg.rollout.num_workers > 0
        )
        progress = Progress(self.cfg)
        wall_base = self.c.wall_s
        t0 = time.perf_counter()
        last_ckpt = self.c.iteration
        try:
            while (reason := self._stop_reason()) is None:
                try:
                    out = self.backend.step(self._progress_fraction())
                except LearnerLost as err:
                    self._recover_learner(err)
                    continue
                self.c.wall_s = wall_base + time.perf_counter() - t0
                self._absorb(out)
                if out["metrics"] is None:
                    self._count_idle_round(out)
                    continue
                self._idle_rounds = 0
                self.c.iteration += 1
                rec = self._record(out["metrics"], startup_s if self.c.iteration == 1 else None)
                writer.write(rec)
                progress.update(rec)
                if self.c.iteration % self.cfg.checkpoint.interval == 0:
                    self.checkpoint()
                    last_ckpt = self.c.iteration
            self.stopped_by = reason
        except KeyboardInterrupt:
            self.stopped_by = "interrupted"
        finally:
            writer.close()
            progress.close(self.stopped_by)
        if self.c.iteration > last_ckpt:
            self.checkpoint()
        return self.stopped_by or "error"


def main(argv: list[str] | None = None) -> int:
    from services.cli import main as cli_main

    return cli_main(["train", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
