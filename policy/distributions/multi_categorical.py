"""MultiDiscrete actions: one categorical per component over its own slice of the logits (and
of the mask), log-probs and entropies summed over components."""

from __future__ import annotations

import itertools
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from ...contracts.spaces import ActionSpec
from ...policy.distributions.base import ActionDistribution, env_shape, starts
from ...policy.distributions.categorical import (
    categorical_logp_entropy,
    greedy_categorical,
    masked_logits,
    np_sample_categorical,
    sample_categorical,
)


def _parts(spec: ActionSpec, params: Tensor, mask: Tensor | None) -> list[tuple[Tensor, Tensor | None]]:
    """(logits, mask) of each component: slices [B, nvec[i]] of params and mask."""
    logits = torch.split(params, list(spec.nvec), dim=-1)
    masks = torch.split(mask, list(spec.nvec), dim=-1) if mask is not None else (None,) * len(logits)
    return list(zip(logits, masks, strict=True))


class MultiCategorical(ActionDistribution):
    space_name = "MultiDiscrete"

    def from_space(self, space: Any) -> ActionSpec | None:
        if not (isinstance(space, gym.spaces.MultiDiscrete) and space.nvec.size):
            return None
        nvec = tuple(int(n) for n in space.nvec.reshape(-1))
        return ActionSpec("multi_discrete", sum(nvec), nvec, starts(space.start), env_shape(space))

    def sample(
        self, spec: ActionSpec, params: Tensor, noise: Tensor, mask: Tensor | None, log_std: Tensor | None
    ) -> Tensor:
        parts = _parts(spec, params, mask)
        return torch.stack([sample_categorical(p, noise[:, i], m) for i, (p, m) in enumerate(parts)], dim=-1)

    def log_prob_entropy(
        self, spec: ActionSpec, params: Tensor, actions: Tensor, mask: Tensor | None, log_std: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        parts = _parts(spec, params, mask)
        out = [categorical_logp_entropy(p, actions[:, i], m) for i, (p, m) in enumerate(parts)]
        return torch.stack([o[0] for o in out]).sum(0), torch.stack([o[1] for o in out]).sum(0)

    def deterministic(self, spec: ActionSpec, params: Tensor, mask: Tensor | None) -> Tensor:
        return torch.stack([greedy_categorical(p, m) for p, m in _parts(spec, params, mask)], dim=-1)

    def summary(self, spec: ActionSpec, params: Tensor, mask: Tensor | None) -> Tensor:
        parts = _parts(spec, params, mask)
        return torch.cat([torch.softmax(masked_logits(p, m), dim=-1) for p, m in parts], dim=-1)

    def np_act(
        self,
        spec: ActionSpec,
        params: np.ndarray,
        noise: np.ndarray,
        mask: np.ndarray | None,
        log_std: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        bounds = np.cumsum((0, *spec.nvec))
        actions = np.empty((params.shape[0], len(spec.nvec)), dtype=np.int64)
        logp = np.zeros(params.shape[0], dtype=np.float32)
        for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            m = None if mask is None else mask[:, lo:hi]
            actions[:, i], part = np_sample_categorical(params[:, lo:hi], noise[:, i], m)
            logp += part
        return actions, logp
