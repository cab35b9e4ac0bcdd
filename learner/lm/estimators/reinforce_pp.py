"""`learner.algo: reinforce_pp`: REINFORCE++ (Hu 2025): no group baseline, the batch's instead.

Each completion's outcome reward is its return at every one of its tokens (gamma 1), and the
returns are whitened over every completion token of the batch: A_i = (r_i - mu) / sqrt(var + 1e-8)
with mu and var the token-weighted mean and unbiased variance, so a completion of n tokens counts
n times. That is verl's `compute_reinforce_plus_plus_outcome_advantage` (`masked_whiten(returns,
response_mask)`) for outcome rewards; OpenRLHF's `reinforce` advantage estimator likewise. relay
keeps the KL to the reference in the loss (learner.kl_coef), not in the reward. A hand-computed
case: rewards [1, 0] with lengths [1, 3]: mu = 1/4, var = (3/4)^2 + 3 (1/4)^2 over 3 = 1/4,
advantages [1.5, -0.5].

A member without a valid reward gets 0 and weighs nothing in mu and var; a batch whose valid
rewards are all equal carries no signal: 0 everywhere.
"""

from __future__ import annotations

import torch

from ....contracts.metrics import MetricKeys
from ....learner.lm.estimators.base import AdvantageEstimator, Estimate, RoundRewards

WHITEN_EPS = 1e-8  # verl's masked_whiten


def batch_whitened(r: RoundRewards, settings: None) -> Estimate:
    w = r.lengths * r.valid.to(r.lengths.dtype)  # tokens each completion contributes
    n = w.sum()
    rewards = torch.where(r.valid, r.rewards, torch.zeros_like(r.rewards))
    mean = (rewards * w).sum() / n.clamp(min=1)
    var = (((rewards - mean) ** 2) * w).sum() / (n - 1).clamp(min=1)
    adv = (rewards - mean) * torch.rsqrt(var + WHITEN_EPS)
    signal = (var > 0) & r.valid
    return torch.where(signal, adv, torch.zeros_like(adv)), {"return_token_std": float(var.sqrt())}


ESTIMATOR = AdvantageEstimator(
    batch_whitened,
    metrics=MetricKeys(
        {"return_token_std": "std of the rewards over the batch's tokens (REINFORCE++ whitens by it)"}
    ),
)
