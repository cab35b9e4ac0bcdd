"""Policy losses of a language run: `learner.lm.policy_loss` names one.

A new loss is one module with a `PolicyLoss` and one line in POLICY_LOSSES; its settings appear
under `learner.<name>`. The loss's aggregation over tokens and completions stays a setting of the
update (`learner.lm.loss_agg`: DAPO's token mean, the GRPO paper's sequence mean, Dr. GRPO's
constant normalizer), whatever the loss.
"""

from __future__ import annotations

from ....learner.lm.policy_losses import clip, gspo
from ....learner.lm.policy_losses.base import PolicyLoss, TokenBatch, TokenLoss

POLICY_LOSSES: dict[str, PolicyLoss] = {
    "clip": clip.LOSS,
    "gspo": gspo.LOSS,
}


def policy_loss(name: str) -> PolicyLoss:
    if name not in POLICY_LOSSES:
        raise ValueError(
            f"learner.lm.policy_loss={name!r} is not a policy loss: choose {', '.join(POLICY_LOSSES)}"
        )
    return POLICY_LOSSES[name]


__all__ = ["POLICY_LOSSES", "PolicyLoss", "TokenBatch", "TokenLoss", "policy_loss"]
