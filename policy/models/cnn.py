"""`model.kind: cnn`: the Nature CNN (Mnih et al. 2015) over uint8 frames.

32 8x8/4, 64 4x4/2, 64 3x3/1 convolutions, then a 512-unit layer, ReLU throughout, orthogonal
init (gain sqrt 2), as CleanRL's Atari PPO. Frames arrive as uint8 [B, C, H, W], in the ring buffer
and in each minibatch; they become float in [0, 1] here, on the learner's device, per minibatch
(a quarter of float32's bytes everywhere before this line).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from contracts.config import RelayConfig
from contracts.spaces import EnvSpec
from policy.trunk import ModelKind, TrunkModule

MIN_SIDE = 36  # the smallest frame the three convolutions leave at least 1x1 of


class NatureCNN(TrunkModule):
    """uint8 frames [B, C, H, W] -> features [B, 512]."""

    def __init__(self, obs_shape: tuple[int, ...], hidden: int = 512) -> None:
        super().__init__()
        channels = obs_shape[0]
        self.convs = nn.Sequential(
            nn.Conv2d(channels, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, *obs_shape)).shape[1]
        self.fc = nn.Sequential(nn.Linear(flat, hidden), nn.ReLU())
        self.out_dim = hidden
        self.checkpointing = False
        for module in self.modules():
            if isinstance(module, nn.Conv2d | nn.Linear):
                nn.init.orthogonal_(module.weight, math.sqrt(2))
                nn.init.zeros_(module.bias)  # type: ignore[arg-type]  # both layers have one

    def _forward(self, x: Tensor) -> Tensor:
        return self.fc(self.convs(x))

    def forward(self, obs: Tensor) -> Tensor:
        # uint8 -> [0, 1] in the weights' dtype, here on the device, one minibatch at a time.
        x = obs.to(next(self.fc.parameters()).dtype) / 255.0
        if self.checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class CnnKind(ModelKind):
    def config_problems(self, cfg: RelayConfig) -> list[str]:
        if cfg.model.normalize_obs:
            return ["model.kind=cnn reads uint8 frames and scales them itself: set model.normalize_obs=false"]
        return []

    def env_problem(self, cfg: RelayConfig, env: EnvSpec) -> str | None:
        ok = len(env.obs_shape) == 3 and env.obs_dtype == "uint8" and min(env.obs_shape[1:]) >= MIN_SIDE
        if ok:
            return None
        return (
            f"model.kind=cnn reads images (a uint8 Box [C, H, W] of at least {MIN_SIDE}x{MIN_SIDE}, "
            f"e.g. env.preprocess=atari), but {cfg.env.id} observes {env.describe_obs()}"
        )

    def trunk_factory(self, cfg: RelayConfig, env: EnvSpec) -> Callable[[], TrunkModule]:
        return lambda: NatureCNN(env.obs_shape)
