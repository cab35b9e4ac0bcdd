"""Small real gymnasium envs over the spaces relay's own tests need and gymnasium ships no env for:
a Dict observation with an action-mask key and MultiDiscrete actions that start at 1 and -1, bit
observations and actions, and a Tuple observation with a 2-D Box action. Each checks every action
it receives against its own space (and mask) and counts what it would refuse in `REFUSED`.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

REFUSED: dict[str, int] = {"pick": 0, "bits": 0, "matrix": 0, "start": 0}
STARTED: dict[int, int] = {}  # StartEnv: each action it was given, counted


class _Episodes(gym.Env):
    """Counts steps from each reset; subclasses give `_obs()` (drawn from the env's generator)."""

    _t = 0

    def _obs(self) -> Any:
        raise NotImplementedError

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}


class PickEnv(_Episodes):
    """Dict(target: Discrete(3), step: Discrete(8, start=2), pos: Box(2), action_mask: MultiBinary(7));
    actions MultiDiscrete([3, 4], start=[1, -1]). Reward 1 when component 0 names the target
    (1..3); component 1 must be an allowed choice (-1..2), the mask allowing two of four per step.
    Episodes last 8 steps."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Dict(
            {
                "target": gym.spaces.Discrete(3),
                "step": gym.spaces.Discrete(8, start=2),
                "pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                "action_mask": gym.spaces.MultiBinary(7),
            }
        )
        self.action_space = gym.spaces.MultiDiscrete([3, 4], start=[1, -1])
        self._t = 0

    def _obs(self) -> dict[str, Any]:
        mask = np.zeros(7, dtype=np.int8)
        mask[:3] = 1  # every target choice allowed
        mask[3 + self.np_random.choice(4, 2, replace=False)] = 1
        self._mask = mask
        self._target = int(self.np_random.integers(3))
        pos = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return {"target": self._target, "step": self._t + 2, "pos": pos, "action_mask": mask}

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict]:
        a = np.asarray(action)
        if a not in self.action_space or not self._mask[3 + int(a[1]) + 1]:
            REFUSED["pick"] += 1
            raise ValueError(f"PickEnv got {a}, outside its space or its mask {self._mask}")
        reward = float(int(a[0]) - 1 == self._target)
        self._t += 1
        return self._obs(), reward, False, self._t >= 8, {}


class BitsEnv(_Episodes):
    """MultiBinary(4) observations and actions; reward: the fraction of bits copied. 6 steps."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.MultiBinary(4)
        self.action_space = gym.spaces.MultiBinary(4)
        self._t = 0

    def _obs(self) -> np.ndarray:
        self._bits = self.np_random.integers(0, 2, 4).astype(np.int8)
        return self._bits

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict]:
        a = np.asarray(action)
        if a not in self.action_space:
            REFUSED["bits"] += 1
            raise ValueError(f"BitsEnv got {a!r}")
        reward = float((a == self._bits).mean())
        self._t += 1
        return self._obs(), reward, False, self._t >= 6, {}


class MatrixEnv(_Episodes):
    """Tuple(Box(3), Discrete(2)) observations, Box(-1, 1, (2, 2)) actions; reward -|a - goal|
    where the goal matrix is the Box part's first two numbers and the Discrete's sign. 5 steps."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Tuple(
            (gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Discrete(2))
        )
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32)
        self._t = 0

    def _obs(self) -> tuple[np.ndarray, int]:
        self._x = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        self._sign = int(self.np_random.integers(2))
        return self._x, self._sign

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict]:
        a = np.asarray(action)
        if a.shape != (2, 2) or a not in self.action_space:
            REFUSED["matrix"] += 1
            raise ValueError(f"MatrixEnv got {a!r}")
        goal = np.outer(self._x[:2], [1.0, -1.0 if self._sign else 1.0])
        reward = -float(np.abs(a - goal).mean())
        self._t += 1
        return self._obs(), reward, False, self._t >= 5, {}


class StartEnv(_Episodes):
    """Box(1) observation, Discrete(3, start=1) actions: reward 1 for action 3. 4 steps."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(3, start=1)
        self._t = 0

    def _obs(self) -> np.ndarray:
        return np.zeros(1, np.float32)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        STARTED[int(action)] = STARTED.get(int(action), 0) + 1
        if int(action) not in (1, 2, 3):
            REFUSED["start"] += 1
            raise ValueError(f"StartEnv got {action!r}")
        self._t += 1
        return np.zeros(1, np.float32), float(int(action) == 3), False, self._t >= 4, {}


class _Unsupported(StartEnv):
    """StartEnv with another observation or action space, for the spaces relay refuses."""

    def __init__(
        self, observation_space: gym.Space | None = None, action_space: gym.Space | None = None
    ) -> None:
        super().__init__()
        self.observation_space = observation_space or self.observation_space
        self.action_space = action_space or self.action_space


def make_sequence_obs() -> gym.Env:
    return _Unsupported(observation_space=gym.spaces.Sequence(gym.spaces.Discrete(3)))


def make_graph_obs() -> gym.Env:
    return _Unsupported(
        observation_space=gym.spaces.Graph(gym.spaces.Box(0, 1, (2,)), gym.spaces.Discrete(2))
    )


def make_text_obs() -> gym.Env:
    return _Unsupported(observation_space=gym.spaces.Text(8))


def make_unbounded_action() -> gym.Env:
    return _Unsupported(action_space=gym.spaces.Box(-np.inf, np.inf, (2,), np.float32))


def make_dict_action() -> gym.Env:
    return _Unsupported(action_space=gym.spaces.Dict({"a": gym.spaces.Discrete(2)}))


def make_slash_key() -> gym.Env:
    return _Unsupported(observation_space=gym.spaces.Dict({"a/b": gym.spaces.Discrete(2)}))
