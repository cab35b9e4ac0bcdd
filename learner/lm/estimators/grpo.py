"""`learner.algo: grpo` (language runs): group-relative advantages (Shao et al. 2024).

A_i = (r_i - mean_g(r)) / (std_g(r) + eps) over the valid members of completion i's group g: TRL's
GRPOTrainer (`advantages = rewards - mean_grouped_rewards`, divided by `std_rewards + 1e-4` where
scale_rewards="group") and verl's `compute_grpo_outcome_advantage` (norm_adv_by_std_in_grpo). A
hand-computed case: rewards [1, 0, 0, 1] in one group: mean 0.5, std 0.5, advantages
[1, -1, -1, 1] (eps aside). `scale_rewards` keeps Dr. GRPO's (none) and TRL's batch std.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from ....contracts.config import EntrySection
from ....learner.lm.estimators.base import AdvantageEstimator, Estimate, RoundRewards
from ....learner.lm.tokens import group_std


class GrpoEstimatorSettings(EntrySection):
    """`learner.grpo` of a language run: how group-relative advantages are scaled."""

    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="Divide advantages by the group's reward std, the batch's, or not at all."
    )


def group_relative(r: RoundRewards, settings: GrpoEstimatorSettings) -> Estimate:
    """Each valid member's reward minus its group's valid mean, scaled by `scale_rewards`; every
    member of a group whose valid rewards are all equal (or with fewer than two) gets exactly 0
    (eps alone would turn float noise into huge advantages)."""
    g = r.group_size
    rewards = torch.where(r.valid, r.rewards, torch.zeros_like(r.rewards)).view(-1, g)
    v = r.valid.view(-1, g)
    w = v.to(rewards.dtype)
    mean = (rewards * w).sum(-1, keepdim=True) / w.sum(-1, keepdim=True).clamp(min=1)
    std = group_std(r.rewards, r.valid, g).unsqueeze(-1)
    centred = rewards - mean
    if settings.scale_rewards == "group":
        centred = centred / (std + r.eps)
    elif settings.scale_rewards == "batch":
        n = w.sum().clamp(min=1)
        batch_mean = (rewards * w).sum() / n
        centred = centred / ((((rewards - batch_mean) ** 2 * w).sum() / n).sqrt() + r.eps)
    signal = (std > 0) & v
    return torch.where(signal, centred, torch.zeros_like(centred)).reshape(-1), {}


ESTIMATOR = AdvantageEstimator(group_relative, GrpoEstimatorSettings)
