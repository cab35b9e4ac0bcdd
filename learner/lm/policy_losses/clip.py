"""`learner.lm.policy_loss: clip`: PPO's clipped surrogate per token, with an asymmetric range
[1 - learner.clip_ratio, 1 + clip_ratio_high] (DAPO's clip-higher).

loss_t = -min(rho_t A, clip(rho_t, 1 - lo, 1 + hi) A), rho_t = exp(logp_t - old_logp_t): TRL's
GRPOTrainer (`per_token_loss1/2`, epsilon_low/epsilon_high) and verl's `compute_policy_loss_vanilla`
(clip_ratio_low/high). A hand-computed case: rho = 1.5, A = 1, range [0.8, 1.28]: loss -1.28,
clipped above.
"""

from __future__ import annotations

from pydantic import Field

from ....contracts.config import EntrySection
from ....learner.lm.policy_losses.base import PolicyLoss, TokenBatch, TokenLoss, clipped_surrogate


class ClipSettings(EntrySection):
    """`learner.clip`: the token-level clip's upper bound."""

    clip_ratio_high: float | None = Field(
        None, gt=0, le=10, description="Upper ratio clip (DAPO's clip-higher); null: learner.clip_ratio."
    )


def clipped(b: TokenBatch, settings: ClipSettings) -> TokenLoss:
    lo = b.clip_ratio
    hi = settings.clip_ratio_high if settings.clip_ratio_high is not None else lo
    return clipped_surrogate((b.logp - b.old_logp).exp(), b.advantages, lo, hi)


LOSS = PolicyLoss(clipped, ClipSettings)
