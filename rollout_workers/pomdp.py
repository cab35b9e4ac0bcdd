"""Partially observed envs shipped with relay, to check that a recurrent policy remembers:
`relay/CartPoleNoVel-v1` is CartPole-v1 observed without its velocities (rl-baselines3-zoo's
CartPoleNoVel: cart position and pole angle only). One frame cannot tell which way the pole is
moving, so a memoryless policy plateaus far below CartPole's 500 while a recurrent one solves it.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

KEPT = np.array([0, 2])  # cart position, pole angle (of x, x_dot, theta, theta_dot)


class NoVelocity(gym.ObservationWrapper):
    """CartPole's observation [4] -> [2]: the positions, without the velocities."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        box = env.observation_space
        assert isinstance(box, gym.spaces.Box)
        self.observation_space = gym.spaces.Box(box.low[KEPT], box.high[KEPT], dtype=np.float32)

    def observation(self, observation: Any) -> np.ndarray:
        return np.asarray(observation, dtype=np.float32)[KEPT]


def cartpole_no_velocity(**kwargs: Any) -> gym.Env:
    return NoVelocity(gym.make("CartPole-v1", **kwargs))


def register_pomdp() -> None:
    """Make gymnasium's registry know relay's own `relay/...` ids."""
    if "relay/CartPoleNoVel-v1" not in gym.registry:
        gym.register(
            "relay/CartPoleNoVel-v1",
            entry_point=cartpole_no_velocity,
            max_episode_steps=500,
            disable_env_checker=True,
        )
