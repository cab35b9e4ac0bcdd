"""Env faults, handled the same way for every sampler: an env that raises is rebuilt; an env that
returns a non-finite observation or reward has that step flagged. Faults are counted by kind
(`contracts.segment.ENV_FAULT_KINDS`), reported with each segment, and summed by the driver.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from ..contracts.segment import ENV_FAULT_KINDS, Fields
from ..rollout_workers.multi_agent.common import ACTIVE_KEY, UNACTED_KEY
from ..rollout_workers.observations import ObsReader, finite_rows

log = logging.getLogger(__name__)
# info key (bool [N] once vectorized) of the copies that raised this step and were rebuilt.
RAISED_KEY = "relay_env_raised"


def rebuilt(env: Any, make: Callable[[], Any]) -> Any:
    """A new env from `make` in place of `env`, which raised: closed first, as far as it can be."""
    with contextlib.suppress(Exception):  # a broken env may fail to close too
        env.close()
    return make()


class RebuildOnRaise(gym.Wrapper):
    """One copy of a vector env that rebuilds itself when its step raises. The step comes back as
    the rebuilt env's first observation, reward 0, flagged in info[RAISED_KEY]: a crashed copy
    costs its own episode, never its neighbours' (a vector env that raised would lose all N).
    `env`: a copy already built (`make` builds the next)."""

    def __init__(self, make: Callable[[], gym.Env], env: gym.Env | None = None) -> None:
        super().__init__(env if env is not None else make())
        self._make = make

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        try:
            return self.env.step(action)
        except Exception as err:  # any env failure is handled the same way
            log.warning("env raised %s: %s; rebuilding that copy", type(err).__name__, err)
            self.env = rebuilt(self.env, self._make)
            obs, info = self.env.reset()
            return obs, 0.0, False, False, {**info, RAISED_KEY: True}


def raised_copies(info: dict[str, Any], n: int) -> np.ndarray | None:
    """bool [N] of the copies that raised and were rebuilt this step, or None (none did)."""
    if RAISED_KEY not in info:
        return None
    flags = np.asarray(info[RAISED_KEY], dtype=bool).reshape(-1)
    present = np.asarray(info.get(f"_{RAISED_KEY}", np.ones(n, dtype=bool)), dtype=bool).reshape(-1)
    raised = flags & present
    return raised if raised.any() else None


@dataclass
class Step:
    """One vector step of N envs: obs (the policy's input fields, each [N, ...]), reward,
    terminated, truncated [N], info.
    ok: None when every env's observation and reward are finite (the fast path), else bool [N];
    where it is False the reward is 0 and the flags are cleared."""

    obs: Fields
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    info: dict[str, Any]
    ok: np.ndarray | None = None


class FaultGuard:
    """What every guard of a vector env keeps: the env, how to build it again, and the faults
    counted by kind (`take_faults`) and in all (`total_faults`: over the sampler's life, seeds of
    rebuilt envs derive from it)."""

    def __init__(self, make: Callable[[], Any], worker_index: int = 0) -> None:
        self._make = make
        self.worker_index = worker_index
        self.env = make()
        self.total_faults = 0
        self._faults = dict.fromkeys(ENV_FAULT_KINDS, 0)
        self._said: set[str] = set()  # event kinds already warned about

    def _count(self, kind: str, n: int) -> None:
        self._faults[kind] += n
        self.total_faults += n

    def take_faults(self) -> dict[str, int]:
        """Faults by kind since the previous call."""
        out, self._faults = self._faults, dict.fromkeys(ENV_FAULT_KINDS, 0)
        return out

    def _rebuild(self, err: Exception) -> None:
        """The env raised: counted, said once, closed (as far as it can be) and built again."""
        self._count("raised", 1)
        log.warning("worker %d: env raised %s: %s; rebuilding it", self.worker_index, type(err).__name__, err)
        self.env = rebuilt(self.env, self._make)

    def _count_events(self, fields: Fields, info: dict[str, Any], n: int) -> None:
        """What an env did that relay handles but must not hide: an active env's mask allowing no
        action (acted on uniformly, the documented rule), agents stepped without an action."""
        mask = fields.get("action_mask")
        empty = None if mask is None else ~mask.reshape(n, -1).any(axis=1)
        if empty is not None and empty.any():  # rare: only then are the active columns read
            if ACTIVE_KEY in info:
                empty &= np.asarray(info[ACTIVE_KEY], dtype=bool)
            if empty.any():
                self._say_once("empty_mask", "an env masked every action; relay acts uniformly there")
                self._count("empty_mask", int(empty.sum()))
        unacted = info.get(UNACTED_KEY)
        if unacted:
            names = ", ".join(sorted(unacted)[:5])
            self._say_once(
                "unacted_agent", f"agents present with no live column, stepped without an action: {names}"
            )
            self._count("unacted_agent", sum(unacted.values()))

    def _say_once(self, kind: str, text: str) -> None:
        if kind not in self._said:
            self._said.add(kind)
            log.warning("worker %d: %s (counted in env_faults_%s)", self.worker_index, text, kind)

    def _count_nonfinite(self, good_obs: np.ndarray, good_reward: np.ndarray, bad: int) -> None:
        self._count("nonfinite_obs", int((~good_obs).sum()))
        self._count("nonfinite_reward", int((~good_reward).sum()))
        log.warning("worker %d: %d env(s) returned non-finite values", self.worker_index, bad)

    def close(self) -> None:
        self.env.close()


class GuardedVectorEnv(FaultGuard):
    """A vector env that never lets a fault escape: `step` returns None when the env raised (it was
    rebuilt; reset it before stepping again), and flags non-finite envs in `Step.ok`."""

    def __init__(self, make: Callable[[], gym.vector.VectorEnv], worker_index: int = 0) -> None:
        super().__init__(make, worker_index)
        self.reader: ObsReader | None = None  # set once the spec is known (`read_with`)

    @property
    def single_observation_space(self) -> gym.Space:
        return self.env.single_observation_space

    @property
    def single_action_space(self) -> gym.Space:
        return self.env.single_action_space

    def read_with(self, reader: ObsReader) -> None:
        """Return observations as `reader`'s fields from now on."""
        self.reader = reader

    def reset_info(self, seed: int) -> dict[str, Any]:
        """The info of one seeded reset of every env (what an info mask source is read from)."""
        return self.env.reset(seed=seed)[1]

    def reset(self, **kwargs: Any) -> Fields:
        assert self.reader is not None, "read_with first"
        obs, info = self.env.reset(**kwargs)
        return self.reader.read(obs, info)

    def step(self, actions: np.ndarray) -> Step | None:
        try:
            obs, reward, terminated, truncated, info = self.env.step(actions)
        except Exception as err:  # any env failure is handled the same way
            self._rebuild(err)
            return None
        assert self.reader is not None, "read_with first"
        fields = self.reader.read(obs, info)
        self._count_events(fields, info, len(reward))
        good_obs = finite_rows(fields)
        raised = raised_copies(info, len(reward))
        if good_obs is None and raised is None and np.isfinite(reward).all():
            return Step(fields, reward, terminated, truncated, info)
        good_reward = np.isfinite(reward)
        if good_obs is None:
            good_obs = np.ones(len(reward), dtype=bool)
        ok = good_obs & good_reward
        if not ok.all():
            self._count_nonfinite(good_obs, good_reward, int((~ok).sum()))
        if raised is not None:  # those copies were rebuilt: their step is no step of an episode
            self._count("raised", int(raised.sum()))
            ok &= ~raised
        return Step(fields, np.where(ok, reward, 0.0), terminated & ok, truncated & ok, info, ok)
