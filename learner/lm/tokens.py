"""Per-token math of a language update, whatever its estimator and loss: pure, no model, no Ray.

Shapes: a batch of B = Q * G completions (Q prompts, G members each, members of a group
adjacent), C completion positions; `mask` [B, C] is 1 on a completion's tokens (through its EOS).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

LossAgg = Literal["token_mean", "seq_mean", "dr_grpo"]
KlEstimator = Literal["k1", "k2", "k3"]


def group_std(rewards: Tensor, valid: Tensor, group_size: int) -> Tensor:
    """[Q] population std of each group's valid rewards (0 where fewer than two are valid): the
    signal a group carries, whatever the estimator (`drop_equal_groups`, the metrics line)."""
    r = torch.where(valid, rewards, torch.zeros_like(rewards)).view(-1, group_size)
    w = valid.view(-1, group_size).to(r.dtype)
    count = w.sum(-1)
    mean = (r * w).sum(-1) / count.clamp(min=1)
    std = (((r - mean.unsqueeze(-1)) ** 2 * w).sum(-1) / count.clamp(min=1)).sqrt()
    return torch.where(count >= 2, std, torch.zeros_like(std))


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
