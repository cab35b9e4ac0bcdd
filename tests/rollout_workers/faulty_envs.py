"""Envs that fail on purpose, for fault-tolerance tests (imported as `module:factory` env ids)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class FaultyCartPole(gym.Wrapper):
    """CartPole whose step raises, or returns NaN observations or an inf reward, at given calls.

    Counts are per env instance; `raise_at`, `nan_obs_at`, `inf_reward_at` are sets of step calls.
    With `every` > 1 only every `every`-th instance created in this process faults (the class counts
    instances in `created`, so a test can tell which envs of a vector env those are).
    """

    created = 0

    def __init__(
        self,
        raise_at: tuple[int, ...] = (),
        nan_obs_at: tuple[int, ...] = (),
        inf_reward_at: tuple[int, ...] = (),
        every: int = 1,
    ) -> None:
        super().__init__(gym.make("CartPole-v1"))
        index, FaultyCartPole.created = FaultyCartPole.created, FaultyCartPole.created + 1
        if index % every:
            raise_at, nan_obs_at, inf_reward_at = (), (), ()
        self.calls = 0
        self.raise_at, self.nan_obs_at, self.inf_reward_at = (
            set(raise_at),
            set(nan_obs_at),
            set(inf_reward_at),
        )

    def step(self, action: Any):
        self.calls += 1
        if self.calls in self.raise_at:
            raise RuntimeError(f"simulator crashed at call {self.calls}")
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.calls in self.nan_obs_at:
            obs = np.full_like(obs, np.nan)
        if self.calls in self.inf_reward_at:
            reward = float("inf")
        return obs, reward, terminated, truncated, info


def make(**kwargs: Any) -> gym.Env:
    return FaultyCartPole(**{k: v if isinstance(v, int) else tuple(v) for k, v in kwargs.items()})


def make_cartpole(broken: bool = False) -> gym.Env:
    """CartPole, or with broken=True an env whose constructor raises (a sweep trial that fails alone)."""
    if broken:
        raise RuntimeError("this env is broken on purpose")
    return gym.make("CartPole-v1")


class MaskFaultTaxi(gym.Wrapper):
    """Taxi whose info["action_mask"] goes wrong at its `at`-th step: `fault="empty"` allows no
    action, `fault="short"` has 5 values for Taxi's 6 actions."""

    def __init__(self, fault: str, at: int) -> None:
        super().__init__(gym.make("Taxi-v4"))
        self.fault, self.at, self.calls = fault, at, 0

    def step(self, action: Any):
        self.calls += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.calls == self.at:
            size = 5 if self.fault == "short" else 6
            info = {
                **info,
                "action_mask": np.zeros(size, dtype=np.int8)
                if self.fault == "empty"
                else np.ones(size, np.int8),
            }
        return obs, reward, terminated, truncated, info


def make_mask_fault_taxi(fault: str = "empty", at: int = 3) -> gym.Env:
    return MaskFaultTaxi(fault, at)
