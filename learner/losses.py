"""PPO and GRPO loss terms over flat, masked batches. Every input is [B] unless stated.

`mask` weights each sample (0 for padding), so batches keep a fixed shape.
"""

from __future__ import annotations

import torch
from torch import Tensor


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over samples where mask is 1 (0 when no sample is valid)."""
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1.0)


def normalize_advantages(adv: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(adv - mean) / (std + eps) over valid samples; padded samples stay 0."""
    mean = masked_mean(adv, mask)
    var = masked_mean((adv - mean) ** 2, mask)
    return (adv - mean) / (var.sqrt() + eps) * mask


def policy_ratio_terms(logp: Tensor, old_logp: Tensor) -> tuple[Tensor, Tensor]:
    """(ratio, log_ratio) of new to behaviour policy."""
    log_ratio = logp - old_logp
    return log_ratio.exp(), log_ratio


def clipped_surrogate(
    logp: Tensor, old_logp: Tensor, adv: Tensor, clip: float, mask: Tensor, weights: Tensor | None = None
) -> Tensor:
    """PPO's clipped surrogate objective, negated into a loss (Schulman et al. 2017, eq. 7); with
    `weights` [B], each sample's term is scaled by its (detached) importance weight."""
    ratio, _ = policy_ratio_terms(logp, old_logp)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip) * adv
    surrogate = torch.minimum(unclipped, clipped)
    if weights is not None:
        surrogate = surrogate * weights
    return -masked_mean(surrogate, mask)


def approx_kl(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """KL(old || new) by the k3 estimator, (r - 1) - log r (Schulman 2020): unbiased, never negative."""
    ratio, log_ratio = policy_ratio_terms(logp, old_logp)
    return masked_mean((ratio - 1.0) - log_ratio, mask)


def clip_fraction(logp: Tensor, old_logp: Tensor, clip: float, mask: Tensor) -> Tensor:
    """Fraction of valid samples whose ratio left [1 - clip, 1 + clip]."""
    ratio, _ = policy_ratio_terms(logp, old_logp)
    return masked_mean(((ratio - 1.0).abs() > clip).float(), mask)


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float | None = None
) -> Tensor:
    """0.5 * squared error to the returns; with `clip`, PPO2's pessimistic clipped variant."""
    err = (values - returns) ** 2
    if clip is not None:
        clipped = old_values + (values - old_values).clamp(-clip, clip)
        err = torch.maximum(err, (clipped - returns) ** 2)
    return 0.5 * masked_mean(err, mask)


def explained_variance(pred: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """1 - Var[target - pred] / Var[target] over valid samples (nan when the target is constant)."""
    t_mean = masked_mean(target, mask)
    var_t = masked_mean((target - t_mean) ** 2, mask)
    resid = target - pred
    var_r = masked_mean((resid - masked_mean(resid, mask)) ** 2, mask)
    return torch.where(var_t > 0, 1.0 - var_r / var_t, torch.full_like(var_t, float("nan")))


def policy_stats(
    logp: Tensor, old_logp: Tensor, mask: Tensor, pg: Tensor, ent: Tensor, clip: float
) -> dict[str, Tensor]:
    """What every policy-gradient loss reports: policy loss, entropy, approx KL and clip fraction."""
    logp = logp.detach()
    return {
        "policy_loss": pg.detach(),
        "entropy": ent.detach(),
        "approx_kl": approx_kl(logp, old_logp, mask),
        "clip_fraction": clip_fraction(logp, old_logp, clip, mask),
    }


def group_relative_advantages(
    rewards: Tensor, eps: float = 1e-6, valid: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """GRPO advantages (r - mean_g) / (std_g + eps) for rewards [num_groups, group_size].

    `valid` [num_groups, group_size] bool: the members whose reward counts (a faulted member's does
    not); the mean and std are over those, and the others get advantage 0. Groups whose valid
    rewards are all equal, or with fewer than two, carry no signal and get advantage exactly 0
    (eps alone would turn float noise into huge advantages). Returns (advantages, std) with std
    [num_groups].
    """
    if valid is None:
        mean = rewards.mean(dim=-1, keepdim=True)
        std = rewards.std(dim=-1, unbiased=False, keepdim=True)
        adv = (rewards - mean) / (std + eps)
        return torch.where(std > 0, adv, torch.zeros_like(adv)), std.squeeze(-1)
    w = valid.to(rewards.dtype)
    count = w.sum(dim=-1, keepdim=True)
    mean = (rewards * w).sum(dim=-1, keepdim=True) / count.clamp(min=1)
    std = (((rewards - mean) ** 2 * w).sum(dim=-1, keepdim=True) / count.clamp(min=1)).sqrt()
    std = torch.where(count >= 2, std, torch.zeros_like(std))
    adv = (rewards - mean) / (std + eps)
    return torch.where((std > 0) & valid, adv, torch.zeros_like(adv)), std.squeeze(-1)


def kl_to_reference(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """KL(new || ref) by k3 on samples from the new policy: exp(ref - new) - (ref - new) - 1."""
    d = ref_logp - logp
    return masked_mean(d.exp() - d - 1.0, mask)
