"""`learner.algo: rloo`: REINFORCE leave-one-out (Ahmadian et al. 2024, "Back to Basics").

A_i = r_i - mean_{j != i} r_j over the valid members of completion i's group: each completion's
baseline is its group mates' mean, so it is unbiased without a critic and without dividing by a
std. TRL's RLOOTrainer (`baseline = (rewards.sum(0) - rewards) / (rloo_k - 1)`,
`advantages = rewards - baseline`) and verl's `compute_rloo_outcome_advantage`
(`scores * n / (n - 1) - mean * n / (n - 1)`, the same number). A hand-computed case: rewards
[1, 0, 0, 1]: baselines [1/3, 2/3, 2/3, 1/3], advantages [2/3, -2/3, -2/3, 2/3]. A group with
fewer than two valid members has no mates to compare with: 0.
"""

from __future__ import annotations

import torch

from ....learner.lm.estimators.base import AdvantageEstimator, Estimate, RoundRewards


def leave_one_out(r: RoundRewards, settings: None) -> Estimate:
    g = r.group_size
    rewards = torch.where(r.valid, r.rewards, torch.zeros_like(r.rewards)).view(-1, g)
    w = r.valid.view(-1, g).to(rewards.dtype)
    count = w.sum(-1, keepdim=True)
    baseline = (rewards.sum(-1, keepdim=True) - rewards) / (count - 1).clamp(min=1)
    keep = r.valid.view(-1, g) & (count >= 2)
    return torch.where(keep, rewards - baseline, torch.zeros_like(rewards)).reshape(-1), {}


ESTIMATOR = AdvantageEstimator(leave_one_out)
