"""`model.kind: cnn`: the Nature CNN (`policy/encoders/cnn.py`) over the whole observation, a
uint8 frame stack [C, H, W] (Atari).

Its centralized critic (multi_agent.central_critic) reads the env's global state alone, MAPPO's
"environment-provided" state: a screen state (`EnvSpec.global_image`, pistonball's) through a Nature
CNN of its own, a flat one through an MLP. Beside each agent's frames it would be a second CNN over
them per column, which these cores cannot afford (pistonball with a second frame CNN ran at 320
agent steps/s against one's 769), and where every agent gets the team's reward (pistonball) the
value of a step is the whole scene's, which each agent's view is a crop of.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from ...contracts.config import RelayConfig
from ...contracts.spaces import EnvSpec
from ...policy.encoders.cnn import MIN_SIDE, NatureCNN
from ...policy.models.mlp import Trunk
from ...policy.trunk import ModelKind, TrunkModule


class StateImageTrunk(TrunkModule):
    """A global state that is a grey image, [B, side * side] grey levels 0-255 (float), through a
    Nature CNN of its own -> [B, 512]."""

    reads_state_only = True

    def __init__(self, side: int) -> None:
        super().__init__()
        self.side = side
        self.cnn = NatureCNN((1, side, side))
        self.out_dim = self.cnn.out_dim
        self.checkpointing = False

    def forward(self, state: Tensor) -> Tensor:
        self.cnn.checkpointing = self.checkpointing
        return self.cnn(state.reshape(state.shape[0], 1, self.side, self.side))


class StateTrunk(Trunk):
    """A flat global state [B, S] through an MLP of the config's sizes."""

    reads_state_only = True


class CnnKind(ModelKind):
    reads_global_state = True

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

    def value_trunk_factory(self, cfg: RelayConfig, env: EnvSpec, in_dim: int) -> Callable[[], TrunkModule]:
        side = env.global_image
        if side:
            return lambda: StateImageTrunk(side)
        hidden, activation = list(cfg.model.hidden_sizes), cfg.model.activation
        return lambda: StateTrunk(env.global_state, hidden, activation)
