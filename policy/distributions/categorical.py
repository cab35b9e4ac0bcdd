"""Discrete actions: a categorical over `size` logits, masked choices excluded everywhere.

Sampling is inverse-CDF from the caller's uniform (the same in torch and numpy): the action is
the number of CDF entries below u. A masked choice has probability exactly 0, so the CDF is flat
across it and u can never land on it; only rounding at u ~ 1 could step past the last allowed
choice, and the clamp to it guards that edge.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from ...contracts.spaces import ActionSpec
from ...policy.distributions.base import (
    MASKED_LOGIT,
    ActionDistribution,
    starts,
    usable_mask,
    usable_mask_np,
)


def masked_logits(logits: Tensor, mask: Tensor | None) -> Tensor:
    """float32 logits [B, n] with masked choices at MASKED_LOGIT."""
    logits = logits.float()
    mask = usable_mask(mask)
    return logits if mask is None else torch.where(mask, logits, torch.full_like(logits, MASKED_LOGIT))


def last_allowed(mask: Tensor | None, n: int, like: Tensor) -> Tensor:
    """Index of the last allowed choice per row [B] (n - 1 without a mask)."""
    if mask is None:
        return torch.full(like.shape[:-1], n - 1, dtype=torch.long, device=like.device)
    idx = torch.arange(n, device=like.device)
    return torch.where(usable_mask(mask), idx, -1).amax(-1)  # type: ignore[arg-type]


def sample_categorical(logits: Tensor, noise: Tensor, mask: Tensor | None) -> Tensor:
    """Choices [B] from logits [B, n] and uniforms [B]."""
    z = masked_logits(logits, mask)
    cdf = torch.softmax(z, dim=-1).cumsum(-1)
    chosen = (cdf < noise.to(z.device).unsqueeze(-1)).sum(-1)
    return torch.minimum(chosen, last_allowed(mask, z.shape[-1], z))


def categorical_logp_entropy(logits: Tensor, actions: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """(log-prob [B], entropy [B]) of choices [B]; masked choices add nothing to the entropy."""
    logp_all = torch.log_softmax(masked_logits(logits, mask), dim=-1)
    logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    return logp, -(logp_all.exp() * logp_all).sum(-1)


def greedy_categorical(logits: Tensor, mask: Tensor | None) -> Tensor:
    return masked_logits(logits, mask).argmax(-1)


def np_sample_categorical(
    logits: np.ndarray, noise: np.ndarray, mask: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """(choices [B], log-probs [B]) in numpy, as sample_categorical then categorical_logp_entropy."""
    mask = usable_mask_np(mask)
    if mask is not None:
        logits = np.where(mask, logits, np.float32(MASKED_LOGIT))
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    total = e.sum(axis=-1)
    # Inverse-CDF sampling as torch's: count the CDF entries below u (scaled by the sum).
    below = np.cumsum(e, axis=-1) < (noise * total)[:, None]
    n = logits.shape[-1]
    last = n - 1 if mask is None else np.where(mask, np.arange(n), -1).max(axis=-1)
    actions = np.minimum(below.sum(axis=-1), last)
    logp = z[np.arange(len(actions)), actions] - np.log(total)
    return actions, logp.astype(np.float32)


class Categorical(ActionDistribution):
    space_name = "Discrete"

    def from_space(self, space: Any) -> ActionSpec | None:
        if not isinstance(space, gym.spaces.Discrete):
            return None
        return ActionSpec("discrete", int(space.n), start=starts([space.start]))

    def sample(
        self, spec: ActionSpec, params: Tensor, noise: Tensor, mask: Tensor | None, log_std: Tensor | None
    ) -> Tensor:
        return sample_categorical(params, noise, mask)

    def log_prob_entropy(
        self, spec: ActionSpec, params: Tensor, actions: Tensor, mask: Tensor | None, log_std: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        return categorical_logp_entropy(params, actions, mask)

    def deterministic(self, spec: ActionSpec, params: Tensor, mask: Tensor | None) -> Tensor:
        return greedy_categorical(params, mask)

    def summary(self, spec: ActionSpec, params: Tensor, mask: Tensor | None) -> Tensor:
        return torch.softmax(masked_logits(params, mask), dim=-1)

    def np_act(
        self,
        spec: ActionSpec,
        params: np.ndarray,
        noise: np.ndarray,
        mask: np.ndarray | None,
        log_std: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        return np_sample_categorical(params, noise, mask)
