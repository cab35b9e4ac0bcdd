"""What an advantage estimator of a language run is: a function from a round's rewards to one
advantage per completion, with the settings and metric keys it brings (`learner/lm/estimators`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from ....contracts.config import EntrySection, LearnerConfig, entry_section
from ....contracts.metrics import MetricKeys


@dataclass(frozen=True)
class RoundRewards:
    """A round's outcome as every estimator reads it. B = Q * G completions, members of a group
    adjacent.

    rewards [B] float (any value where not `valid`); valid [B] bool: the completions a reward
    scored (a faulted one is not); lengths [B] float: completion tokens (through the end token);
    group_size G; eps: the std floor of divisions (learner.group_eps)."""

    rewards: Tensor
    valid: Tensor
    lengths: Tensor
    group_size: int
    eps: float


# (advantages [B], statistics for the metrics line: keys the entry's `metrics` declares)
Estimate = tuple[Tensor, dict[str, float]]


@dataclass(frozen=True)
class AdvantageEstimator:
    """One `learner.algo` of a language run. `advantages(round, settings)`: one advantage per
    completion, exactly 0 for one without a valid reward (the loss multiplies every token of a
    completion by it); `settings`: its section `learner.<name>` (None: it has none), passed
    validated with its defaults; `metrics`: the keys its statistics add."""

    advantages: Callable[[RoundRewards, Any], Estimate]
    settings: type[EntrySection] | None = None
    metrics: MetricKeys = field(default_factory=lambda: MetricKeys({}))

    def settings_of(self, cfg: LearnerConfig) -> Any:
        """Its section of a learner config that runs it, validated (None where it has none)."""
        if self.settings is None:
            return None
        return entry_section(cfg, "learner", cfg.algo, self.settings)
