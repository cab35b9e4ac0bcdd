"""Unity ML-Agents PPO policies (`.pt` with a `Policy` state dict, or the initializers of an ONNX
export) as relay ActorCritics, so they can be verified, exported and served on any device.

ML-Agents conventions (PPO, continuous actions, e.g. the Huggy dog: 59 obs -> 21 actions, three
SiLU layers of 512): normalizer `clamp((obs - running_mean) / sqrt(running_variance /
normalization_steps), -5, 5)` with no epsilon, body `network_body._body_endoder.seq_layers.{0,2,4}`,
head `action_model._continuous_distribution.mu`, `log_sigma`, and actions `clamp(a, -3, 3) / 3`.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch
from torch import Tensor

from contracts.spaces import ActionSpec, EnvSpec
from learner.models import ActorCritic
from learner.models.mlp import mlp_policy
from services.tools.handle import PolicyHandle, PolicyLoadError

MLAGENTS_BODY = re.compile(r"_body_endoder\.seq_layers\.(\d+)\.weight$")


def mlagents_clip(actions: Tensor) -> Tensor:
    """ML-Agents' action post-processing: clamp(a, -3, 3) / 3."""
    return torch.clamp(actions, -3.0, 3.0) / 3.0


def _find(sd: dict[str, Any], suffix: str) -> Tensor:
    hits = [k for k in sd if k.endswith(suffix)]
    if len(hits) != 1:
        raise PolicyLoadError(f"expected one tensor named *{suffix}, found {len(hits)}")
    value = sd[hits[0]]
    return (value if torch.is_tensor(value) else torch.from_numpy(np.array(value))).detach().float()


def _layers(sd: dict[str, Any], pattern: re.Pattern[str]) -> list[tuple[Tensor, Tensor]]:
    found = sorted((int(m.group(1)), k) for k in sd if (m := pattern.search(k)))
    return [(_find(sd, k), _find(sd, k[: -len("weight")] + "bias")) for _, k in found]


def _load_trunk(model: ActorCritic, layers: list[tuple[Tensor, Tensor]]) -> None:
    linears = [m for m in model.pi_trunk.modules() if isinstance(m, torch.nn.Linear)]
    for linear, (w, b) in zip(linears, layers, strict=True):
        linear.weight.data.copy_(w)
        linear.bias.data.copy_(b)


def mlagents_policy_from_state_dict(sd: dict[str, Any], source: str) -> PolicyHandle:
    """An ML-Agents PPO policy (continuous actions) as a relay ActorCritic plus ML-Agents' clip."""
    layers = _layers(sd, MLAGENTS_BODY)
    if not layers:
        raise PolicyLoadError(f"{source}: no ML-Agents body layers (*_body_endoder.seq_layers.N.weight)")
    mu_w, mu_b = (
        _find(sd, "_continuous_distribution.mu.weight"),
        _find(sd, "_continuous_distribution.mu.bias"),
    )
    env = EnvSpec((layers[0][0].shape[1],), ActionSpec("continuous", mu_w.shape[0]))
    model = mlp_policy(env.obs_dim, env.action, [w.shape[0] for w, _ in layers], "silu", critic=False)
    _load_trunk(model, layers)
    model.pi_head.weight.data.copy_(mu_w)
    model.pi_head.bias.data.copy_(mu_b)
    model.log_std.data.copy_(_find(sd, "_continuous_distribution.log_sigma").reshape(-1))
    model.normalizer.mean.copy_(_find(sd, "normalizer.running_mean"))
    model.normalizer.var_sum.copy_(_find(sd, "normalizer.running_variance"))
    model.normalizer.steps.copy_(_find(sd, "normalizer.normalization_steps").reshape(()))
    return PolicyHandle(model.eval(), source, env, None, mlagents_clip)
