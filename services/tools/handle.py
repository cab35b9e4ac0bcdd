"""The policy handle: what `relay export` and `relay verify` work with, whatever file it came from.

A torch ActorCritic, the env spec it was built for, the run's config when the file carried one
(as data), and the post-processing its source applies to actions (identity for relay, ML-Agents'
clip for imports).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import psutil
import torch
from torch import Tensor, nn

from contracts.config import RelayConfig
from contracts.spaces import EnvSpec
from policy.models import ActorCritic

RELAY_CONFIG_KEY = "relay_config"  # ONNX metadata: the resolved config of the run that trained the graph
RELAY_ENV_KEY = "relay_env"  # ONNX metadata: the env spec (observation shape, dtype, bounds; actions)


class PolicyLoadError(ValueError):
    """The file is not a policy relay can load (one line, exit 2)."""


def identity(actions: Tensor) -> Tensor:
    return actions


@dataclass
class PolicyHandle:
    model: ActorCritic
    source: str
    env: EnvSpec
    config: RelayConfig | None = None
    action_transform: Callable[[Tensor], Tensor] = identity

    @property
    def obs_dim(self) -> int:
        return self.env.obs_dim

    @property
    def obs_shape(self) -> tuple[int, ...]:
        return self.env.obs_shape

    def as_input(self, obs: np.ndarray) -> np.ndarray:
        """Observations [B, *obs_shape] in the dtype the policy reads (uint8 frames, else float32)."""
        return np.asarray(obs).astype(self.env.storage_dtype, copy=False)

    def check_fits(self, batch: int) -> None:
        """PolicyLoadError, before anything is allocated, when `batch` observations (and the
        two float64 copies of them) would not fit in the
        memory this machine has free: the sizes come from a file, or from --batch."""
        need = 2 * 8 * batch * max(self.obs_dim, 1)
        free = psutil.virtual_memory().available
        if need > free:
            raise PolicyLoadError(
                f"{self.source}: {batch} observations of shape {self.obs_shape} need about "
                f"{need / 2**30:.1f} GB; this machine has {free / 2**30:.1f} GB free"
            )

    def synthetic_obs(self, batch: int, generator: torch.Generator) -> Tensor:
        """[batch, *obs_shape] inputs the policy accepts: standard normals; uint8 noise frames for
        an image policy; for a token policy random contexts (ids in its vocabulary, a random
        number of slots filled, -1 after)."""
        self.check_fits(batch)
        if self.env.storage_dtype == np.uint8:
            return torch.randint(0, 256, (batch, *self.obs_shape), generator=generator, dtype=torch.uint8)
        return self.model.synthetic_obs(batch, self.obs_shape, generator)

    @property
    def continuous(self) -> bool:
        return self.model.action.kind == "continuous"


class DeterministicPolicy(nn.Module):
    """The exported graph: obs [B, *obs_shape] (float32, or uint8 frames) -> (action, ...), with the
    normalizer (or the CNN's /255) folded in.

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
