"""Loading trained policies for export and verification: relay checkpoints and ONNX files.

A `PolicyHandle` is what `relay export` and `relay verify` work with: a torch ActorCritic plus the
post-processing its source applies to actions (identity for relay, ML-Agents' clip for imports).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from learner.learner import EnvSpec, build_policy
from learner.models import ActorCritic
from learner.sequence import TokenTransformer
from services.checkpoints import load_checkpoint
from services.config import RelayConfig

RELAY_CONFIG_KEY = "relay_config"  # ONNX metadata: the resolved config of the run that trained the graph


class PolicyLoadError(ValueError):
    """The file is not a policy relay can load (one line, exit 2)."""


def identity(actions: Tensor) -> Tensor:
    return actions


@dataclass
class PolicyHandle:
    model: ActorCritic
    source: str
    config: RelayConfig | None = None
    action_transform: Callable[[Tensor], Tensor] = identity

    @property
    def obs_dim(self) -> int:
        return int(self.model.normalizer.mean.numel())

    def synthetic_obs(self, batch: int, generator: torch.Generator) -> Tensor:
        """[batch, obs_dim] inputs the policy accepts: standard normals, or for a token policy
        random contexts (ids in its vocabulary, a random number of slots filled, -1 after)."""
        trunk = self.model.pi_trunk
        if not isinstance(trunk, TokenTransformer):
            return torch.randn(batch, self.obs_dim, generator=generator)
        ids = torch.randint(0, trunk.vocab_size, (batch, self.obs_dim), generator=generator)
        filled = torch.randint(1, self.obs_dim + 1, (batch, 1), generator=generator)
        return torch.where(torch.arange(self.obs_dim) < filled, ids, -1).float()

    @property
    def continuous(self) -> bool:
        return self.model.action.kind == "continuous"


class DeterministicPolicy(nn.Module):
    """The exported graph: obs [B, obs_dim] float32 -> (action, ...) with the normalizer folded in.

    Continuous actions: outputs `action` (the mean after the source's action transform), `mean`
    and `std` [B, A]. Discrete: `action` (argmax, int64 [B]) and `logits` [B, n].
    """

    def __init__(self, handle: PolicyHandle) -> None:
        super().__init__()
        self.model = handle.model
        self.transform = handle.action_transform

    def forward(self, obs: Tensor) -> tuple[Tensor, ...]:
        params, _ = self.model.distribution_params(obs)
        if self.model.action.kind == "discrete":
            return params.argmax(-1), params
        std = self.model.log_std.exp().expand_as(params)
        return self.transform(params), params, std


def output_names(handle: PolicyHandle) -> list[str]:
    return ["action", "mean", "std"] if handle.continuous else ["action", "logits"]


def load_relay_checkpoint(path: Path) -> PolicyHandle:
    """A relay checkpoint's policy, rebuilt from the config stored in it."""
    from rollout_workers.envs import probe_spaces

    try:
        state = load_checkpoint(path)
        cfg = RelayConfig.model_validate(state["config"])
        weights = state["learner"]["model"]
    except Exception as err:
        raise PolicyLoadError(f"{path}: not a relay checkpoint ({type(err).__name__}: {err})") from None
    ec = cfg.env
    model = build_policy(cfg, EnvSpec(*probe_spaces(ec.id, ec.max_episode_steps, ec.kwargs)))
    model.load_state_dict(weights)
    return PolicyHandle(model.eval(), f"relay checkpoint {path.name}", cfg)


def load_policy(path: str | Path) -> PolicyHandle:
    """A relay checkpoint (.pt), an ML-Agents checkpoint (.pt with a Policy state dict), or ONNX."""
    p = Path(path)
    if not p.is_file():
        raise PolicyLoadError(f"{p}: no such file")
    if p.suffix == ".onnx":
        from services.onnx_import import import_onnx_policy

        return import_onnx_policy(p)
    try:
        raw = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as err:
        raise PolicyLoadError(f"{p}: cannot be read as a checkpoint ({type(err).__name__})") from None
    if isinstance(raw, dict) and "Policy" in raw:
        from services.onnx_import import mlagents_policy_from_state_dict

        return mlagents_policy_from_state_dict(raw["Policy"], f"ML-Agents checkpoint {p.name}")
    return load_relay_checkpoint(p)


@torch.no_grad()
def recorded_observations(handle: PolicyHandle, count: int = 1000, seed: int = 0) -> np.ndarray:
    """[count, obs_dim] observations met by the policy acting in its env (needs a relay config)."""
    from rollout_workers.envs import make_vector_env

    if handle.config is None:
        raise PolicyLoadError("recorded observations need the env of a relay checkpoint")
    ec = handle.config.env
    env = make_vector_env(ec.id, 8, "sync", ec.max_episode_steps, ec.kwargs)
    gen = torch.Generator().manual_seed(seed)
    obs, _ = env.reset(seed=seed)
    out = []
    while sum(len(o) for o in out) < count:
        out.append(obs.astype(np.float32))
        actions, _, _ = handle.model.act(
            torch.from_numpy(obs.astype(np.float32)), handle.model.action.draw_noise(len(obs), gen)
        )
        a = actions.numpy()
        if handle.continuous:
            a = np.clip(a, env.single_action_space.low, env.single_action_space.high)
        obs, *_ = env.step(a)
    env.close()
    return np.concatenate(out)[:count]
