"""`model.kind: cnn`: the Nature CNN (`policy/encoders/cnn.py`) over the whole observation, a
uint8 frame stack [C, H, W] (Atari)."""

from __future__ import annotations

from collections.abc import Callable

from ...contracts.config import RelayConfig
from ...contracts.spaces import EnvSpec
from ...policy.encoders.cnn import MIN_SIDE, NatureCNN
from ...policy.trunk import ModelKind, TrunkModule


class CnnKind(ModelKind):
    def config_problems(self, cfg: RelayConfig) -> list[str]:
        if cfg.model.normalize_obs:
            return ["model.kind=cnn reads uint8 frames and scales them itself: set model.normalize_obs=false"]
        return []

    def env_problem(self, cfg: RelayConfig, env: EnvSpec) -> str | None:
        ok = len(env.obs_shape) == 3 and env.obs_dtype == "uint8" and min(env.obs_shape[1:]) >= MIN_SIDE
        if ok and not env.structured:
            return None
        return (
            f"model.kind=cnn reads images (a uint8 Box [C, H, W] of at least {MIN_SIDE}x{MIN_SIDE}, "
            f"e.g. env.preprocess=atari), but {cfg.env.id} observes {env.describe_obs()}"
        )

    def trunk_factory(self, cfg: RelayConfig, env: EnvSpec, in_dim: int) -> Callable[[], TrunkModule]:
        return lambda: NatureCNN(env.obs_shape)
