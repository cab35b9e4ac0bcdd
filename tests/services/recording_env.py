"""A user's env factory that writes where its `record_to` kwarg says: proof, when that file
appears, that a kwarg reached it."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym


def make(record_to: str | None = None) -> gym.Env:
    if record_to is not None:
        Path(record_to).write_text("kwargs from somewhere reached the factory\n")
    return gym.make("CartPole-v1")
