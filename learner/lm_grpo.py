"""GRPO on completion tokens: pure math, no model, no Ray.

Shapes: a batch of B = Q * G completions (Q prompts, G members each, members of a group
adjacent), C completion positions; `mask` [B, C] is 1 on a completion's tokens (through its EOS).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from . import losses

ScaleRewards = Literal["group", "batch", "none"]
LossAgg = Literal["token_mean", "seq_mean", "dr_grpo"]
KlEstimator = Literal["k1", "k2", "k3"]


def group_advantages(
    rewards: Tensor, valid: Tensor, group_size: int, scale: ScaleRewards, eps: float
) -> tuple[Tensor, Tensor]:
    """(advantages [B], the groups' reward std [Q]) from rewards [B] (any value where not `valid`).

    The baseline is the group's mean over its valid members; `scale` divides by the group's std
    (GRPO), the batch's (Dr. GRPO's and TRL's "batch"), or nothing. A member without a valid reward,
    and every member of a group whose valid rewards are all equal, get advantage exactly 0."""
    r = torch.where(valid, rewards, torch.zeros_like(rewards)).view(-1, group_size)
    v = valid.view(-1, group_size)
    adv, std = losses.group_relative_advantages(r, eps, v)
    if scale == "group":
        return adv.reshape(-1), std
    w = v.to(r.dtype)
    count = w.sum(-1, keepdim=True)
    centred = (r - (r * w).sum(-1, keepdim=True) / count.clamp(min=1)) * w
    signal = (std > 0).unsqueeze(-1) & v
    if scale == "batch":
        n = w.sum().clamp(min=1)
        mean = (r * w).sum() / n
        batch_std = (((r - mean) ** 2 * w).sum() / n).sqrt()
        centred = centred / (batch_std + eps)
    return torch.where(signal, centred, torch.zeros_like(centred)).reshape(-1), std


def kl_per_token(logp: Tensor, ref_logp: Tensor, estimator: KlEstimator) -> Tensor:
    """Per-token estimate of KL(policy || reference) on the policy's own samples (Schulman's k1,
    k2, k3); every one is 0 where the two agree."""
    log_ratio = ref_logp - logp
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    return log_ratio.exp() - log_ratio - 1.0


def token_weights(mask: Tensor, rows: Tensor, agg: LossAgg, max_new_tokens: int) -> Tensor:
    """[B, C] weights whose sum against per-token losses is the batch's loss, so micro-batches'
    losses add up to it exactly (gradient accumulation without re-normalizing). `rows` [B] bool:
    the completions in the loss (others weigh 0).

    token_mean: every counted token alike (DAPO); seq_mean: each completion's token mean, then the
    mean over completions (the GRPO paper); dr_grpo: token sum over completions x max_new_tokens."""
    m = mask * rows.unsqueeze(-1).to(mask.dtype)
    seqs = rows.sum().clamp(min=1).to(mask.dtype)
    if agg == "token_mean":
        return m / m.sum().clamp(min=1)
    if agg == "seq_mean":
        return m / (m.sum(-1, keepdim=True).clamp(min=1) * seqs)
    return m / (seqs * max_new_tokens)


def clipped_token_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    clip_low: float,
    clip_high: float,
    is_weight: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(per-token loss [b, C], clipped-low and clipped-high indicators [b, C]) of PPO's clipped
    surrogate with
    an asymmetric range [1 - clip_low, 1 + clip_high] (clip-higher); advantages [b] are the
    completion's; `is_weight` [b, C] multiplies the loss (truncated importance sampling between
    the generator and the learner)."""
    ratio = (logp - old_logp).exp()
    adv = advantages.unsqueeze(-1)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    if is_weight is not None:
        loss = loss * is_weight
    low = (ratio < 1.0 - clip_low) & (adv < 0)
    high = (ratio > 1.0 + clip_high) & (adv > 0)
    return loss, low.float(), high.float()


def truncated_is_weight(
    learner_logp: Tensor,
    generator_logp: Tensor,
    mask: Tensor,
    level: Literal["token", "sequence"],
    cap: float,
) -> Tensor:
    """[B, C] importance weights min(pi_learner / pi_generator, cap) of the generator's samples,
    per token or per completion (the product over its tokens); 0 where masked."""
    log_w = (learner_logp - generator_logp) * mask
    if level == "sequence":
        log_w = log_w.sum(-1, keepdim=True).expand_as(mask)
    return log_w.exp().clamp(max=cap) * mask
