"""`model.kind: mlp`: MLP trunks over the (normalized, flattened) observation."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ...contracts.config import RelayConfig
from ...contracts.spaces import ActionSpec, EnvSpec
from ...policy.actor_critic import ActorCritic, init_linear
from ...policy.trunk import ModelKind, TrunkModule

ACTIVATIONS: dict[str, type[nn.Module]] = {"silu": nn.SiLU, "tanh": nn.Tanh, "relu": nn.ReLU}


def mlp(in_dim: int, hidden: list[int], activation: str) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_dim, width), ACTIVATIONS[activation]()]
        in_dim = width
    return nn.Sequential(*layers)


class Trunk(TrunkModule):
    """An MLP trunk, [B, *obs] -> [B, hidden[-1]], that can recompute its activations in backward
    (gradient checkpointing)."""

    def __init__(self, in_dim: int, hidden: list[int], activation: str) -> None:
        super().__init__()
        self.net = mlp(in_dim, hidden, activation)
        self.out_dim = hidden[-1] if hidden else in_dim
        self.checkpointing = False
        init_linear(self.net, math.sqrt(2))

    @staticmethod
    def np_layers(state: Mapping[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Its linear layers as (W [in, out], b [out]) float32 arrays, in order, from this
        module's own state dict: the numpy mirror's trunk (policy/numpy_mirror.py)."""
        linear = sorted(
            {int(k.split(".")[1]) for k in state if k.startswith("net.") and k.endswith(".weight")}
        )
        return [(state[f"net.{i}.weight"].T, state[f"net.{i}.bias"]) for i in linear]

    def forward(self, x: Tensor) -> Tensor:
        x = x.reshape(x.shape[0], -1)
        if not x.is_floating_point() and len(self.net):
            x = x.to(next(self.net.parameters()).dtype)
        if self.checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(self.net, x, use_reentrant=False)
        return self.net(x)


def mlp_policy(
    obs_dim: int, action: ActionSpec, hidden: list[int], activation: str = "tanh", **options: object
) -> ActorCritic:
    """An ActorCritic with MLP trunks (options: shared_trunk, critic, init_log_std, normalize_obs)."""
    return ActorCritic(obs_dim, action, lambda: Trunk(obs_dim, hidden, activation), **options)  # type: ignore[arg-type]


class MlpKind(ModelKind):
    numpy_mirror = True
    reads_global_state = True

    def trunk_factory(self, cfg: RelayConfig, env: EnvSpec, in_dim: int) -> Callable[[], TrunkModule]:
        hidden, activation = list(cfg.model.hidden_sizes), cfg.model.activation
        return lambda: Trunk(in_dim, hidden, activation)
