"""Env preprocessing: the registry behind `env.preprocess` (`none`, `atari`).

A preprocessor builds one env from the env config. `reports_episodes`: the env reports the true
episodes itself (`info["episode"]` at the real end, as gymnasium's RecordEpisodeStatistics does),
because what it hands the learner is not what a person would score (per-life episodes, clipped
rewards); the sampler then reports those instead of its own accounting. `frames_per_step`: the
env's frames one step covers, so a video of one frame a step plays at the game's speed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from rollout_workers.atari import atari_env


@dataclass(frozen=True)
class Preprocessor:
    make: Callable[[str, int | None, dict[str, Any]], gym.Env] | None  # None: the plain env
    reports_episodes: bool = False
    frames_per_step: int = 1  # the env's frames one step shows (frame skipping): videos play at fps / this


def _atari(env_id: str, max_episode_steps: int | None, kwargs: dict[str, Any]) -> gym.Env:
    if max_episode_steps is not None:
        kwargs = {**kwargs, "max_episode_steps": max_episode_steps}
    return atari_env(env_id, **kwargs)


PREPROCESSORS: dict[str, Preprocessor] = {
    "none": Preprocessor(None),
    "atari": Preprocessor(_atari, reports_episodes=True, frames_per_step=4),
}


def preprocessor(name: str) -> Preprocessor:
    """The registered preprocessor; ValueError naming the known ones otherwise."""
    if name not in PREPROCESSORS:
        raise ValueError(f"env.preprocess={name!r} is not a preprocessor: choose {', '.join(PREPROCESSORS)}")
    return PREPROCESSORS[name]
