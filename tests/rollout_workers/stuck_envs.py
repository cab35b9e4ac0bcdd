"""Envs that fail the way production envs do, for the fleet-health tests: one worker's env hangs
in `step` (a deadlocked simulator), or one worker's process dies every time it is started.

Which worker is hit is decided through a marker file, so exactly one of the fleet is: the first
process to create the marker hangs; the first actor to write its id into it dies, and keeps dying
after every restart (Ray keeps an actor's id across restarts)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import gymnasium as gym


def _claim(marker: str, text: str) -> bool:
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return True


class _AfterSteps(gym.Wrapper):
    def __init__(self, after: int, hit: Any) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.after, self.hit, self.steps = after, hit, 0

    def step(self, action: Any):
        self.steps += 1
        if self.hit is not None and self.steps > self.after:
            self.hit()
        return self.env.step(action)


def _hang() -> None:
    while True:
        time.sleep(3600)


def _actor_id() -> str | None:
    """This process's Ray actor (stable across its restarts), None outside one (the driver's probe)."""
    import ray

    return ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None


def make_hanging(marker: str, after: int = 200) -> gym.Env:
    """CartPole whose `step` never returns after `after` steps, in the first rollout actor built
    (once: restarted, it finds the marker taken and steps on)."""
    me = _actor_id()
    return _AfterSteps(after, _hang if me and _claim(marker, me) else None)


def make_dying(marker: str, after: int = 200) -> gym.Env:
    """CartPole whose process exits after `after` steps, in one rollout actor, every incarnation."""
    me = _actor_id()
    doomed = me is not None and (_claim(marker, me) or Path(marker).read_text() == me)
    return _AfterSteps(after, (lambda: os._exit(1)) if doomed else None)


def make_empty_box() -> gym.Env:
    """An env whose observations hold no numbers (a Box of shape (0,))."""
    env = gym.make("CartPole-v1")
    env.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(0,))
    return env
