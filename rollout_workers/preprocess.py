"""Env preprocessing: the registry behind `env.preprocess` (`none`, `atari`, `pixels`).

A preprocessor builds one gymnasium env from the env config (`make`), or wraps a PettingZoo env
(`wrap_multi_agent`). `reports_episodes`: the env reports the true
episodes itself (`info["episode"]` at the real end, as gymnasium's RecordEpisodeStatistics does),
because what it hands the learner is not what a person would score (per-life episodes, clipped
rewards); the sampler then reports those instead of its own accounting. `frames_per_step`: the
env's frames one step covers, so a video of one frame a step plays at the game's speed.
`multi_agent_kwargs`: what a PettingZoo env it wraps is built with, under the user's env.kwargs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from ..rollout_workers.atari import atari_env


@dataclass(frozen=True)
class Preprocessor:
    make: Callable[[str, int | None, dict[str, Any]], gym.Env] | None  # None: the plain env
    reports_episodes: bool = False
    frames_per_step: int = 1  # the env's frames one step shows (frame skipping): videos play at fps / this
    # A PettingZoo env's wrapper (None: played as it is); one with no `make` is for PettingZoo only.
    wrap_multi_agent: Callable[[Any], Any] | None = None
    multi_agent_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def applies_to(self, multi_agent: bool) -> bool:
        """Whether this preprocessing applies to an env of this kind (none applies to both)."""
        if self.make is None and self.wrap_multi_agent is None:
            return True
        return (self.wrap_multi_agent if multi_agent else self.make) is not None


def _atari(env_id: str, max_episode_steps: int | None, kwargs: dict[str, Any]) -> gym.Env:
    if max_episode_steps is not None:
        kwargs = {**kwargs, "max_episode_steps": max_episode_steps}
    return atari_env(env_id, **kwargs)


PIXELS_SIDE, PIXELS_STACK = 84, 3


def _pixels(env: Any) -> Any:
    """A PettingZoo pixel env as CleanRL and the PettingZoo tutorials train it, with SuperSuit's
    own wrappers: one colour channel (blue, where pistonball's pistons and ball stand out), 84x84,
    the last 3 frames stacked; channels first ([3, 84, 84] uint8), as relay's CNN reads images."""
    import supersuit as ss

    env = ss.color_reduction_v0(env, mode="B")
    env = ss.resize_v1(env, PIXELS_SIDE, PIXELS_SIDE)
    env = ss.frame_stack_v1(env, PIXELS_STACK)

    def space(s: gym.spaces.Box) -> gym.spaces.Box:
        return gym.spaces.Box(0, 255, (s.shape[2], s.shape[0], s.shape[1]), np.uint8)

    return ss.observation_lambda_v0(env, lambda obs, _: np.ascontiguousarray(obs.transpose(2, 0, 1)), space)


PREPROCESSORS: dict[str, Preprocessor] = {
    "none": Preprocessor(None),
    "atari": Preprocessor(_atari, reports_episodes=True, frames_per_step=4),
    # PettingZoo 1.27's pistonball draws its screen, which every observation and state() is read
    # from, only when a render mode is set (`draw` returns at once for None): built without one,
    # each piston sees the frame of the reset for the whole episode. rgb_array draws off-screen
    # and opens no window; env.kwargs' own render_mode wins.
    "pixels": Preprocessor(None, wrap_multi_agent=_pixels, multi_agent_kwargs={"render_mode": "rgb_array"}),
}


def preprocessor(name: str) -> Preprocessor:
    """The registered preprocessor; ValueError naming the known ones otherwise."""
    if name not in PREPROCESSORS:
        raise ValueError(f"env.preprocess={name!r} is not a preprocessor: choose {', '.join(PREPROCESSORS)}")
    return PREPROCESSORS[name]
