"""Box actions: a diagonal Gaussian over the flattened Box, mean from the head, a state-independent
log-std parameter; actions = mean + std * the caller's standard normals."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from ...contracts.spaces import ActionSpec
from ...policy.distributions.base import ActionDistribution, env_shape


class DiagGaussian(ActionDistribution):
    space_name = "Box (of at least one number)"
    learned_log_std = True

    def from_space(self, space: Any) -> ActionSpec | None:
        if not (isinstance(space, gym.spaces.Box) and space.shape and int(np.prod(space.shape)) > 0):
            return None
        if not np.issubdtype(space.dtype, np.floating):
            raise ValueError("a Box of actions must hold floats")
        if not (np.isfinite(space.low).all() and np.isfinite(space.high).all()):
            raise ValueError(
                "relay clips Gaussian actions to the Box's bounds, and these are infinite (wrap the "
                "env to rescale its actions to finite bounds)"
            )
        return ActionSpec("continuous", int(np.prod(space.shape)), env_shape=env_shape(space))

    def draw_noise(self, spec: ActionSpec, batch: int, generator: torch.Generator) -> Tensor:
        return torch.randn(spec.noise_shape(batch), generator=generator)

    def sample(
        self, spec: ActionSpec, params: Tensor, noise: Tensor, mask: Tensor | None, log_std: Tensor | None
    ) -> Tensor:
        assert log_std is not None
        return params.float() + log_std.float().exp() * noise.to(params.device)

    def log_prob_entropy(
        self, spec: ActionSpec, params: Tensor, actions: Tensor, mask: Tensor | None, log_std: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        assert log_std is not None
        params = params.float()
        ls = log_std.float().expand_as(params)
        z = (actions.float() - params) / ls.exp()
        logp = (-0.5 * z**2 - ls - 0.5 * math.log(2 * math.pi)).sum(-1)
        entropy = (ls + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)
        return logp, entropy

    def deterministic(self, spec: ActionSpec, params: Tensor, mask: Tensor | None) -> Tensor:
        return params.float()

    def summary(self, spec: ActionSpec, params: Tensor, mask: Tensor | None) -> Tensor:
        return params.float()

    def np_act(
        self,
        spec: ActionSpec,
        params: np.ndarray,
        noise: np.ndarray,
        mask: np.ndarray | None,
        log_std: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        assert log_std is not None
        actions = (params + np.exp(log_std) * noise).astype(np.float32)
        logp = (-0.5 * noise**2 - log_std - 0.5 * np.log(2 * np.pi)).sum(axis=-1)
        return actions, logp.astype(np.float32)
