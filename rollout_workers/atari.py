"""`env.preprocess: atari`: the standard Atari stack (Mnih et al. 2015; Machado et al. 2018's
details as CleanRL and SB3 apply them) around an `ALE/...` env.

no-op reset (up to 30), max-and-skip 4 (max over the last two frames), 84x84 greyscale,
fire on reset, episodic life and sign-clipped rewards *for learning*, a 4-frame stack:
observations are uint8 [4, 84, 84] and stay uint8 end to end.

The true game is what gets reported: `RecordEpisodeStatistics` sits inside the episodic-life and
reward-clipping wrappers, so its `info["episode"]` (return and length of the whole game, raw
rewards) appears only at the real game over; the sampler reports those instead of its own
per-life, clipped accounting (`reports_episodes`).
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

STACK = 4
SCREEN = 84


def _ale(env: gym.Env) -> Any:
    """The ALE interface of the AtariEnv under the wrappers (lives, frames)."""
    return env.unwrapped.ale  # type: ignore[attr-defined]


class FireReset(gym.Wrapper):
    """Press FIRE after a reset, for games that wait for it (Breakout's ball)."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


class EpisodicLife(gym.Wrapper):
    """A lost life ends the episode for learning; `reset` then only continues the same game
    (a no-op step) until the real game over. A reset given a seed always starts a new game: the
    caller asked for that game (an evaluation's seed stream, a reseeded worker)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = _ale(self.env).lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        if self.game_over or kwargs.get("seed") is not None:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the no-op ended the game after all
                obs, info = self.env.reset(**kwargs)
        self.lives = _ale(self.env).lives()
        return obs, info


class SignReward(gym.RewardWrapper):
    """Rewards clipped to their sign, for learning."""

    def reward(self, reward: SupportsFloat) -> float:
        return float(np.sign(float(reward)))


def atari_env(env_id: str, **kwargs: Any) -> gym.Env:
    """The preprocessed env: observations uint8 [4, 84, 84]."""
    # Frame skipping is AtariPreprocessing's (with its max over two frames); no sticky actions,
    # as in the published PPO/DQN numbers this is compared with.
    kwargs = {"frameskip": 1, "repeat_action_probability": 0.0, **kwargs}
    env = gym.make(env_id, **kwargs)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=SCREEN)
    env = gym.wrappers.RecordEpisodeStatistics(env)  # the true game: raw rewards, all lives
    env = EpisodicLife(env)
    if "FIRE" in env.unwrapped.get_action_meanings():  # type: ignore[attr-defined]  # an AtariEnv
        env = FireReset(env)
    env = SignReward(env)
    return gym.wrappers.FrameStackObservation(env, STACK)
