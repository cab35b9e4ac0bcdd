"""Reward normalization and clipping of a language run (`prompts.reward_norm`, `prompts.reward_clip`):
what the update trains on, after the rewards are mixed by `prompts.reward_weights`. The metrics'
`reward_mean` stays the rewards as scored.

`running`: each completion's reward less the running mean over every reward scored so far (this
round's included), over the running standard deviation, as OpenRLHF's `normalize_reward` keeps
them: a reward model's scale (its logits' offset and spread) stops mattering to the update, and a
critic (PPO) sees rewards of unit scale. The moments merge each round's in float64 (Chan et al.'s
pairwise update; `plain_moments` is its plain reference). `reward_clip: c` clips what the update
takes to [-c, c] (after normalizing, where it is on). A reward that is None (a fault: no reward,
no advantage) stays None and is not counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

EPS = 1e-8


@dataclass
class RewardMoments:
    """Count, mean and sum of squared deviations of the rewards seen (float64)."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def merge(self, values: list[float]) -> None:
        """Fold a round's rewards in (Chan et al.: the two groups' moments combined)."""
        if not values:
            return
        n = len(values)
        mean = math.fsum(values) / n
        m2 = math.fsum((v - mean) ** 2 for v in values)
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.count * n / total
        self.count = total

    @property
    def std(self) -> float:
        """The population standard deviation (0 before two rewards)."""
        return math.sqrt(self.m2 / self.count) if self.count else 0.0


def plain_moments(values: list[float]) -> tuple[float, float]:
    """(mean, population std) of every value at once: what `RewardMoments` merged round by round
    must equal."""
    mean = math.fsum(values) / len(values)
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))


class RewardScaling:
    """The run's reward normalization (`norm`: none or running) and clipping (`clip`: None or c > 0)."""

    def __init__(self, norm: str, clip: float | None) -> None:
        if norm not in ("none", "running"):
            raise ValueError(f"prompts.reward_norm={norm!r}: none or running")
        self.norm, self.clip = norm, clip
        self.moments = RewardMoments()

    @property
    def active(self) -> bool:
        return self.norm != "none" or self.clip is not None

    def __call__(self, rewards: list[float | None]) -> list[float | None]:
        """The rewards the update trains on, in order; the running moments take this round's."""
        if not self.active:
            return rewards
        if self.norm == "running":
            self.moments.merge([r for r in rewards if r is not None])
        mean, scale = (self.moments.mean, self.moments.std + EPS) if self.norm == "running" else (0.0, 1.0)
        out: list[float | None] = []
        for r in rewards:
            if r is None:
                out.append(None)
                continue
            v = (r - mean) / scale
            out.append(v if self.clip is None else min(max(v, -self.clip), self.clip))
        return out

    def metrics(self) -> dict[str, float]:
        """The running moments, for the metrics line (none where normalization is off)."""
        if self.norm != "running":
            return {}
        return {"reward_norm_mean": self.moments.mean, "reward_norm_std": self.moments.std}

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.moments.count, "mean": self.moments.mean, "m2": self.moments.m2}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """A checkpoint's moments (numbers only; a checkpoint from before this existed has none)."""
        if not state:
            self.moments = RewardMoments()
            return
        self.moments = RewardMoments(int(state["count"]), float(state["mean"]), float(state["m2"]))
