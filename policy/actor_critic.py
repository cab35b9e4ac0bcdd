"""The policy: normalizer -> trunk(s) -> a categorical or Gaussian head (+ a value head unless the
algorithm is critic-free). Trunks come from the model registry (`policy/models/__init__.py`).

Exploration noise always comes from the caller (`act(obs, noise)`), drawn on the CPU from a seeded
generator, so sampling is bit-identical whatever device runs the network.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from contracts.spaces import ActionSpec
from policy.normalizer import ObsNormalizer
from policy.trunk import TrunkModule


def draw_noise(action: ActionSpec, batch: int, generator: torch.Generator) -> Tensor:
    """Exploration noise on the CPU from a seeded generator (the same bits on any device):
    uniforms [B] for discrete actions, standard normals [B, A] for continuous ones."""
    if action.kind == "discrete":
        return torch.rand(action.noise_shape(batch), generator=generator)
    return torch.randn(action.noise_shape(batch), generator=generator)


def init_linear(module: nn.Module, gain: float) -> None:
    """Orthogonal weights with `gain`, zero biases, for every Linear in `module`."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)


@dataclass
class PolicyOutput:
    """What the learner needs per step: log-prob [B], entropy [B], value [B] (None without a critic)."""

    logp: Tensor
    entropy: Tensor
    value: Tensor | None


class ActorCritic(nn.Module):
    """Normalizer -> trunk(s) -> categorical logits or Gaussian mean (+ state-independent log-std).

    With `critic=False` no value network is built (GRPO), saving its parameters and memory.
    `make_trunk` builds each trunk: any module mapping observations [B, *obs_shape] (normalized,
    float32 or the weights' dtype) to features [B, out_dim], with `out_dim` and `checkpointing`
    attributes.
    """

    log_std: nn.Parameter  # [A], continuous actions only

    def __init__(
        self,
        obs_dim: int,
        action: ActionSpec,
        make_trunk: Callable[[], TrunkModule],
        *,
        shared_trunk: bool = False,
        critic: bool = True,
        init_log_std: float = 0.0,
        normalize_obs: bool = True,
        normalize_reward: bool = False,
    ) -> None:
        super().__init__()
        self.action = action
        self.normalizer = ObsNormalizer((obs_dim,), enabled=normalize_obs)
        # Running statistics of the discounted return (reward scaling), shipped with the weights;
        # only present when used, so other policies' state dicts stay as they were.
        self.return_stats: ObsNormalizer | None = ObsNormalizer((1,)) if normalize_reward else None
        self.pi_trunk = make_trunk()
        self.v_trunk: TrunkModule | None = None
        if critic and not shared_trunk:
            self.v_trunk = make_trunk()
        self.shared_trunk = shared_trunk
        out_dim = self.pi_trunk.out_dim
        self.pi_head = nn.Linear(out_dim, action.size)
        init_linear(self.pi_head, 0.01)
        self.v_head: nn.Linear | None = nn.Linear(out_dim, 1) if critic else None
        if self.v_head is not None:
            init_linear(self.v_head, 1.0)
        if action.kind == "continuous":
            self.log_std = nn.Parameter(torch.full((action.size,), float(init_log_std)))

    def synthetic_obs(self, batch: int, obs_shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
        """[batch, *obs_shape] observations this policy accepts, for checks without an env."""
        return self.pi_trunk.synthetic_input(batch, obs_shape, generator)

    @property
    def has_critic(self) -> bool:
        return self.v_head is not None

    def set_checkpointing(self, enabled: bool) -> None:
        for trunk in (self.pi_trunk, self.v_trunk):
            if trunk is not None:
                trunk.checkpointing = enabled

    def _features(self, obs: Tensor) -> tuple[Tensor, Tensor | None]:
        if self.normalizer.enabled:
            # The normalizer computes in float32 whatever the model dtype; its output takes the weights'.
            x = self.normalizer(obs.reshape(obs.shape[0], -1).float()).to(self.pi_head.weight.dtype)
        else:
            # Raw observations reach the trunk in their own shape: floats in the weights' dtype,
            # integers (token ids) as they are, for the trunk to read its own way.
            x = obs.to(self.pi_head.weight.dtype) if obs.is_floating_point() else obs
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
