"""MultiBinary actions: an independent Bernoulli per bit from its logit; bit i is 1 where the
caller's uniform u_i < sigmoid(logit_i)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

from ...contracts.spaces import ActionSpec
from ...policy.distributions.base import ActionDistribution, env_shape


class Bernoulli(ActionDistribution):
    space_name = "MultiBinary"

    def from_space(self, space: Any) -> ActionSpec | None:
        if not (isinstance(space, gym.spaces.MultiBinary) and int(np.prod(space.shape)) > 0):
            return None
        return ActionSpec("multi_binary", int(np.prod(space.shape)), env_shape=env_shape(space))

    def sample(
        self, spec: ActionSpec, params: Tensor, noise: Tensor, mask: Tensor | None, log_std: Tensor | None
    ) -> Tensor:
        return (noise.to(params.device) < torch.sigmoid(params.float())).long()

    def log_prob_entropy(
        self, spec: ActionSpec, params: Tensor, actions: Tensor, mask: Tensor | None, log_std: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        logits = params.float()
        # log sigmoid(x) for a 1, log sigmoid(-x) for a 0, without overflow for large |x|.
        logp = -F.binary_cross_entropy_with_logits(logits, actions.float(), reduction="none")
        p = torch.sigmoid(logits)
        entropy = -(p * F.logsigmoid(logits) + (1 - p) * F.logsigmoid(-logits))
        return logp.sum(-1), entropy.sum(-1)

    def deterministic(self, spec: ActionSpec, params: Tensor, mask: Tensor | None) -> Tensor:
        return (params.float() > 0).long()

    def summary(self, spec: ActionSpec, params: Tensor, mask: Tensor | None) -> Tensor:
        return torch.sigmoid(params.float())

    def np_act(
        self,
        spec: ActionSpec,
        params: np.ndarray,
        noise: np.ndarray,
        mask: np.ndarray | None,
        log_std: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        p = 1.0 / (1.0 + np.exp(-params))
        bits = (noise < p).astype(np.int64)
        # log sigmoid(s * x) = -log1p(exp(-s * x)), s = +1 for a 1 and -1 for a 0 (logaddexp: stable).
        signed = np.where(bits == 1, params, -params)
        logp = -np.logaddexp(0.0, -signed).sum(axis=-1)
        return bits, logp.astype(np.float32)
