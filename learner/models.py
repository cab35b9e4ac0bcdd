"""Policies: actor-critic for Discrete and Box actions (MLP trunks, or a token transformer), and
a critic-free policy for GRPO.

Exploration noise always comes from the caller (`act(obs, noise)`), drawn on the CPU from a seeded
generator, so sampling is bit-identical whatever device runs the network.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from learner.normalizer import ObsNormalizer

ACTIVATIONS: dict[str, type[nn.Module]] = {"silu": nn.SiLU, "tanh": nn.Tanh, "relu": nn.ReLU}


@dataclass(frozen=True)
class ActionSpec:
    """Discrete (n choices) or continuous (dim floats, with bounds applied by the env side)."""

    kind: str  # "discrete" | "continuous"
    size: int  # number of choices or action dimensions

    @property
    def shape(self) -> tuple[int, ...]:
        return () if self.kind == "discrete" else (self.size,)

    @property
    def dtype(self) -> torch.dtype:
        return torch.int64 if self.kind == "discrete" else torch.float32

    def noise_shape(self, batch: int) -> tuple[int, ...]:
        """Shape of the exploration noise `act` takes: uniforms [B] or standard normals [B, A]."""
        return (batch,) if self.kind == "discrete" else (batch, self.size)

    def draw_noise(self, batch: int, generator: torch.Generator) -> Tensor:
        """Noise on the CPU from a seeded generator (the same bits on any device)."""
        if self.kind == "discrete":
            return torch.rand(self.noise_shape(batch), generator=generator)
        return torch.randn(self.noise_shape(batch), generator=generator)


def mlp(in_dim: int, hidden: list[int], activation: str) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_dim, width), ACTIVATIONS[activation]()]
        in_dim = width
    return nn.Sequential(*layers)


def _init_linear(module: nn.Module, gain: float) -> None:
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)


class Trunk(nn.Module):
    """An MLP trunk that can recompute its activations in backward (gradient checkpointing)."""

    def __init__(self, in_dim: int, hidden: list[int], activation: str) -> None:
        super().__init__()
        self.net = mlp(in_dim, hidden, activation)
        self.out_dim = hidden[-1] if hidden else in_dim
        self.checkpointing = False
        _init_linear(self.net, math.sqrt(2))

    def forward(self, x: Tensor) -> Tensor:
        if self.checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(self.net, x, use_reentrant=False)
        return self.net(x)


@dataclass
class PolicyOutput:
    """What the learner needs per step: log-prob [B], entropy [B], value [B] (None without a critic)."""

    logp: Tensor
    entropy: Tensor
    value: Tensor | None


class ActorCritic(nn.Module):
    """Normalizer -> trunk(s) -> categorical logits or Gaussian mean (+ state-independent log-std).

    With `critic=False` no value network is built (GRPO), saving its parameters and memory.
    `make_trunk` builds each trunk (any module mapping [B, obs_dim] to [B, out_dim] with `out_dim`
    and `checkpointing` attributes); by default an MLP of `hidden` widths.
    """

    def __init__(
        self,
        obs_dim: int,
        action: ActionSpec,
        hidden: list[int],
        activation: str = "tanh",
        shared_trunk: bool = False,
        critic: bool = True,
        init_log_std: float = 0.0,
        normalize_obs: bool = True,
        make_trunk: Callable[[], nn.Module] | None = None,
    ) -> None:
        super().__init__()
        self.action = action
        self.normalizer = ObsNormalizer((obs_dim,), enabled=normalize_obs)
        make_trunk = make_trunk or (lambda: Trunk(obs_dim, hidden, activation))
        self.pi_trunk = make_trunk()
        self.v_trunk: nn.Module | None = None
        if critic and not shared_trunk:
            self.v_trunk = make_trunk()
        self.shared_trunk = shared_trunk
        out_dim = int(self.pi_trunk.out_dim)
        self.pi_head = nn.Linear(out_dim, action.size)
        _init_linear(self.pi_head, 0.01)
        self.v_head: nn.Linear | None = nn.Linear(out_dim, 1) if critic else None
        if self.v_head is not None:
            _init_linear(self.v_head, 1.0)
        if action.kind == "continuous":
            self.log_std = nn.Parameter(torch.full((action.size,), float(init_log_std)))

    @property
    def has_critic(self) -> bool:
        return self.v_head is not None

    def set_checkpointing(self, enabled: bool) -> None:
        for trunk in (self.pi_trunk, self.v_trunk):
            if trunk is not None:
                trunk.checkpointing = enabled

    def _features(self, obs: Tensor) -> tuple[Tensor, Tensor | None]:
        x = obs.reshape(obs.shape[0], -1)
        # The normalizer computes in float32 whatever the model dtype; its output takes the weights'.
        x = self.normalizer(x if x.is_floating_point() else x.float()).to(self.pi_head.weight.dtype)
        pi = self.pi_trunk(x)
        if self.v_head is None:
            return pi, None
        v_feat = pi if self.v_trunk is None else self.v_trunk(x)
        return pi, self.v_head(v_feat).squeeze(-1).float()

    def distribution_params(self, obs: Tensor) -> tuple[Tensor, Tensor | None]:
        """Logits [B, n] (discrete) or mean [B, A] (continuous), and the value [B] or None."""
        feat, value = self._features(obs)
        return self.pi_head(feat), value

    def _log_prob_entropy(self, params: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        # Log-probs in float32 even under autocast: ratios of exp(logp) are what PPO clips.
        params = params.float()
        if self.action.kind == "discrete":
            logp_all = torch.log_softmax(params, dim=-1)
            logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1)
            return logp, entropy
        log_std = self.log_std.float().expand_as(params)
        z = (actions.float() - params) / log_std.exp()
        logp = (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        entropy = (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)
        return logp, entropy

    def evaluate(self, obs: Tensor, actions: Tensor) -> PolicyOutput:
        """Log-prob, entropy and value of given actions: obs [B, obs_dim], actions [B, *act]."""
        params, value = self.distribution_params(obs)
        logp, entropy = self._log_prob_entropy(params, actions)
        return PolicyOutput(logp, entropy, value)

    def sample_actions(self, params: Tensor, noise: Tensor) -> Tensor:
        """Actions from distribution params and caller noise (uniform [B] or normal [B, A])."""
        params = params.float()
        noise = noise.to(params.device)
        if self.action.kind == "discrete":
            # Inverse-CDF sampling; clamp guards the u ~ 1 edge against rounding in cumsum.
            cdf = torch.softmax(params, dim=-1).cumsum(-1)
            return (cdf < noise.unsqueeze(-1)).sum(-1).clamp_(max=self.action.size - 1)
        return params + self.log_std.float().exp() * noise

    @torch.no_grad()
    def act(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Sample with caller noise: obs [B, obs_dim] -> (actions [B, *act], logp [B], value [B]).

        value is zeros for a critic-free policy.
        """
        params, value = self.distribution_params(obs)
        actions = self.sample_actions(params, noise)
        logp, _ = self._log_prob_entropy(params, actions)
        if value is None:
            value = torch.zeros(obs.shape[0], device=obs.device)
        return actions, logp, value

    @torch.no_grad()
    def value(self, obs: Tensor) -> Tensor:
        """V(obs) [B]; zeros without a critic."""
        _, value = self._features(obs)
        return torch.zeros(obs.shape[0], device=obs.device) if value is None else value

    @torch.no_grad()
    def deterministic(self, obs: Tensor) -> Tensor:
        """Greedy action (argmax, or the Gaussian mean) [B, *act]."""
        params, _ = self.distribution_params(obs)
        return params.argmax(-1) if self.action.kind == "discrete" else params.float()
