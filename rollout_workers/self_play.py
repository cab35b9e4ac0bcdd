"""Who plays the other seats of a turn-based game (rollout_workers/multi_agent/turns.py): frozen
snapshots of the learning policy (a pool), a uniformly random player, or the current weights.

Every rollout worker keeps its own pool: it snapshots the weights it is sent whenever their version
enters a new multiple of `multi_agent.self_play.snapshot_every`, so no snapshot crosses Ray and the
pool is a function of the versions the worker saw. Each game draws its opponent from the worker's
seeded generator; opponents act on the CPU with noise from their own seeded stream, so a sync run
reproduces. The pool is not checkpointed: a resumed run fills it again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector.utils import concatenate, create_empty_array

from ..contracts.config import SelfPlayConfig
from ..contracts.spaces import EnvSpec
from ..policy.actor_critic import draw_noise
from ..policy.numpy_mirror import NumpyPolicy, TorchCpuPolicy
from ..rollout_workers.envs import env_actions
from ..rollout_workers.multi_agent.turns import RandomOpponents
from ..rollout_workers.observations import ObsReader

CpuPolicy = NumpyPolicy | TorchCpuPolicy


class SelfPlayOpponents:
    """Opponents for a sampler's turn-based games: `draw`/`act` as turns.Opponents wants them.

    `obs_space`/`act_space`: one seat's. Until `bind` gives it the policy, every game is against
    the random player."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, seed: int) -> None:
        self.obs_space, self.act_space = obs_space, act_space
        self._one: Any = create_empty_array(obs_space, 1)  # one observation, batched for the policy
        self.reseed(seed)
        self.cfg: SelfPlayConfig | None = None
        self.current: CpuPolicy | None = None
        self.make_policy: Callable[[], CpuPolicy] | None = None
        self.pool: list[CpuPolicy] = []
        self._bucket = -1  # version // snapshot_every of the newest snapshot
        self._who: dict[int, CpuPolicy | None] = {}  # each copy's opponent this game (None: random)

    def reseed(self, seed: int) -> None:
        """Restart the draws of opponents, the random player's moves and the policies' noise."""
        self.random = RandomOpponents(self.act_space, seed)
        self.rng = np.random.default_rng([seed, 1])
        self.noise = torch.Generator().manual_seed(seed)

    def bind(
        self,
        spec: EnvSpec,
        current: CpuPolicy,
        make_policy: Callable[[], CpuPolicy],
        cfg: SelfPlayConfig | None,
    ) -> None:
        """Act as `current` (the sampler's policy) and snapshots made by `make_policy`, reading
        observations as `spec` says; `cfg` None: every game against the current weights."""
        self.spec, self.current, self.make_policy, self.cfg = spec, current, make_policy, cfg
        self.reader = ObsReader(spec, 1)

    def observe_weights(self, version: int, weights: Mapping[str, Any]) -> None:
        """A published version arrived: snapshot it where it starts a new multiple of snapshot_every."""
        if self.cfg is None or self.make_policy is None:
            return
        bucket = version // self.cfg.snapshot_every
        if bucket <= self._bucket:
            return
        self._bucket = bucket
        snapshot = self.pool.pop(0) if len(self.pool) >= self.cfg.pool_size else self.make_policy()
        snapshot.load(weights)
        self.pool.append(snapshot)

    def draw(self, e: int) -> str:
        if self.current is None:
            self._who[e] = None
            return "random"
        if self.cfg is None:
            self._who[e] = self.current
            return "self"
        if self.rng.random() < self.cfg.random_opponent:
            self._who[e] = None
            return "random"
        if not self.pool:  # before the first snapshot: the current weights
            self._who[e] = self.current
            return "self"
        self._who[e] = self.pool[int(self.rng.integers(len(self.pool)))]
        return "pool"

    def act(self, e: int, obs: Any) -> Any:
        policy = self._who.get(e)
        if policy is None:
            return self.random.act(e, obs)
        batch = concatenate(self.obs_space, [obs], self._one)
        noise = draw_noise(self.spec.action, 1, self.noise).numpy()
        actions = policy.act(self.reader.read(batch), noise)[0]
        return env_actions(self.spec.action, self.act_space, actions)[0]
