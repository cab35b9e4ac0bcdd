"""`learner.lm.policy_loss: gspo`: Group Sequence Policy Optimization (Zheng et al. 2025): one
importance ratio per completion, the geometric mean of its tokens' ratios, clipped whole.

s_i = exp(mean_t (logp_t - old_logp_t)) over completion i's tokens; per token (GSPO-token, whose
value and gradient equal GSPO's for one advantage per completion) the ratio is
sg[s_i] * exp(logp_t - sg[logp_t]) and the loss -min(s A, clip(s, 1 - lo, 1 + hi) A): verl's
`compute_policy_loss_gspo` (log-ratio capped at 10, as there) and TRL's importance_sampling_level=
"sequence". Its ranges are three orders of magnitude narrower than the token clip's (the paper's
3e-4 and 4e-4), and the paper aggregates by sequence (learner.lm.loss_agg=seq_mean). A
hand-computed case: token log-ratios [0.2, 0.0] give s = exp(0.1) = 1.105; with A = 1 and the
paper's range the loss is -(1 + 4e-4) at each token, clipped above.
"""

from __future__ import annotations

from pydantic import Field

from ....contracts.config import EntrySection
from ....learner.lm.policy_losses.base import PolicyLoss, TokenBatch, TokenLoss, clipped_surrogate

MAX_LOG_RATIO = 10.0  # verl's cap: exp(10) is already a ratio no update should meet


class GspoSettings(EntrySection):
    """`learner.gspo`: the sequence ratio's clip range."""

    clip_ratio_low: float = Field(3e-4, gt=0, le=1, description="Lower clip of the sequence ratio.")
    clip_ratio_high: float = Field(4e-4, gt=0, le=10, description="Upper clip of the sequence ratio.")


def sequence_clipped(b: TokenBatch, settings: GspoSettings) -> TokenLoss:
    lo, hi = settings.clip_ratio_low, settings.clip_ratio_high
    log_ratio = (b.logp - b.old_logp) * b.mask
    seq = log_ratio.sum(-1, keepdim=True) / b.mask.sum(-1, keepdim=True).clamp(min=1)
    log_s = (b.logp - b.logp.detach() + seq.detach()).clamp(max=MAX_LOG_RATIO)
    return clipped_surrogate(log_s.exp(), b.advantages, lo, hi)


LOSS = PolicyLoss(sequence_clipped, GspoSettings)
