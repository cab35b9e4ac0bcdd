"""The elastic fleet's decisions (`rollout.autoscale`): how many rollout workers, from what each
metrics line says. Pure logic: the backend adds and retires the actors.

The learner is the accelerator the service exists to keep busy. While it starves (computing under
GROW_BELOW of the wall time, no finished segment waiting for it) another worker helps; while it is
saturated (over SHRINK_ABOVE) and finished segments queue up behind it (in at least one of those
lines: how many wait at one instant swings with timing), a worker is wasted and is retired. A
decision needs PATIENCE lines in a row saying the same, so one noisy line moves nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

GROW_BELOW = 0.5
SHRINK_ABOVE = 0.9
PATIENCE = 3


@dataclass
class FleetScaler:
    min_workers: int
    max_workers: int
    _votes: int = 0  # > 0: lines in a row asking to grow; < 0: to shrink
    _queued: bool = False  # segments waited for the learner during the shrink votes

    def decide(self, learner_busy: float, backlog: int, workers: int) -> int:
        """The fleet size to have now, from one line: learner_busy, segments finished but not yet
        trained on (`backlog`), and the live workers."""
        if learner_busy < GROW_BELOW and backlog == 0 and workers < self.max_workers:
            self._votes = max(self._votes, 0) + 1
        elif learner_busy > SHRINK_ABOVE and workers > self.min_workers:
            self._queued = (self._queued and self._votes < 0) or backlog > 0
            self._votes = min(self._votes, 0) - 1
        else:
            self._votes = 0
        if self._votes >= PATIENCE:
            self._votes = 0
            return workers + 1
        if self._votes <= -PATIENCE and self._queued:
            self._votes, self._queued = 0, False
            return workers - 1
        return workers
