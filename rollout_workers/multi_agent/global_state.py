"""A parallel env's global state as the centralized critic reads it (multi_agent.central_critic).

PettingZoo's `state()` is either a flat vector (mpe2's simple_spread: positions and velocities,
read as they are) or the whole screen (butterfly's pistonball: [560, 880, 3] uint8, 1.5M numbers,
of which each agent observes a crop). A screen is reduced to a square grey image of
GLOBAL_IMAGE_SIDE x GLOBAL_IMAGE_SIDE: the mean of its colour channels, area-averaged (each output
pixel the mean of the input pixels it covers, fractions weighted), grey levels 0-255 as float32.
64 x 64 keeps pistonball's ball (80 px across, 6-9 output pixels) and each piston (40 px wide,
about 3) visible, and is 4,096 floats: what MAX_GLOBAL_STATE allows a flat state, so a segment's
global-state field costs the same for either kind. No Ray, no policy.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from ...contracts.spaces import MAX_GLOBAL_STATE
from ...rollout_workers.multi_agent.common import MultiAgentError

GLOBAL_IMAGE_SIDE = 64
_MAX_CHANNELS = 4  # an image's colour channels (RGB, RGBA); one more is not an image's layout


def area_weights(size: int, side: int) -> np.ndarray:
    """[side, size] float32: row i averages the input pixels output pixel i covers, a pixel cut by
    a bin's edge weighted by the share of it inside (each row sums to 1)."""
    edges = np.arange(side + 1, dtype=np.float64) * (size / side)
    lo, hi = edges[:-1, None], edges[1:, None]
    pixel = np.arange(size, dtype=np.float64)[None, :]
    overlap = np.clip(np.minimum(hi, pixel + 1) - np.maximum(lo, pixel), 0.0, None)
    return (overlap / (size / side)).astype(np.float32)


class GlobalStateReader:
    """Reads a PettingZoo env's `state()` into the float32 [size] vector the critic takes.
    `size`: its floats; `image_side`: the side of the square grey image it is (0: a flat state).
    MultiAgentError (one line) for an env without a state, or one neither flat nor an image."""

    def __init__(self, env: Any) -> None:
        space = getattr(env, "state_space", None)
        if not isinstance(space, gym.spaces.Box) or not callable(getattr(env, "state", None)):
            raise MultiAgentError(
                f"multi_agent.central_critic reads the env's global state: {type(env).__name__} has no "
                "state_space Box and state()"
            )
        numbers = int(np.prod(space.shape))
        if 0 < numbers <= MAX_GLOBAL_STATE:
            self.size, self.image_side = numbers, 0
            return
        layout = _image_layout(space.shape)
        if layout is None:
            raise MultiAgentError(
                f"multi_agent.central_critic: the env's global state {space} holds {numbers} numbers; the "
                f"critic reads at most {MAX_GLOBAL_STATE} flat, or an image [H, W, C] or [C, H, W] of at "
                f"most {_MAX_CHANNELS} channels and at least {GLOBAL_IMAGE_SIDE} pixels a side"
            )
        self._channel_axis = 0 if layout else 2
        channels = space.shape[self._channel_axis]
        height, width = (d for axis, d in enumerate(space.shape) if axis != self._channel_axis)
        self.image_side = GLOBAL_IMAGE_SIDE
        self.size = GLOBAL_IMAGE_SIDE * GLOBAL_IMAGE_SIDE
        # [side, H], the channel mean's 1/C folded in; [W, side]
        self._rows = area_weights(int(height), GLOBAL_IMAGE_SIDE) / np.float32(channels)
        self._cols = np.ascontiguousarray(area_weights(int(width), GLOBAL_IMAGE_SIDE).T)

    def __call__(self, state: Any) -> np.ndarray:
        """float32 [size]: the flat state, or the screen's grey image row by row."""
        arr = np.asarray(state)
        if not self.image_side:
            return arr.astype(np.float32, copy=False).reshape(-1)
        # The channels summed plane by plane ([H, W] float32): numpy's mean over the channel axis of
        # pistonball's strided screen took 8.3 ms, this 0.5 (the whole read 9.0 -> 1.3 ms a step).
        planes = np.moveaxis(arr, self._channel_axis, 0)
        grey = planes[0].astype(np.float32)
        for plane in planes[1:]:
            grey += plane
        # Two products by the area weights, rows then columns: one sgemm each.
        return (self._rows @ grey @ self._cols).reshape(-1)


def _image_layout(shape: tuple[int, ...]) -> bool | None:
    """Whether a 3-D state shape is channels-first ([C, H, W]), channels-last (False), or None when
    it is not an image of at least GLOBAL_IMAGE_SIDE a side."""
    if len(shape) != 3:
        return None
    if shape[2] <= _MAX_CHANNELS and min(shape[:2]) >= GLOBAL_IMAGE_SIDE:
        return False
    if shape[0] <= _MAX_CHANNELS and min(shape[1:]) >= GLOBAL_IMAGE_SIDE:
        return True
    return None
