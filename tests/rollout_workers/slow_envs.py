"""An env whose step waits (no CPU), for elastic-fleet tests: a sampler-bound run on any machine."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym


class SlowCartPole(gym.Wrapper):
    def __init__(self, delay: float = 0.002) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.delay = delay

    def step(self, action: Any):
        time.sleep(self.delay)
        return self.env.step(action)


def make(**kwargs: Any) -> gym.Env:
    return SlowCartPole(**kwargs)
