"""`env.vectorization: envpool`: EnvPool's batched C++ envs behind gymnasium's VectorEnv interface.

EnvPool resets an env on the step *after* the one that ended it (that step ignores the action and
returns the next episode's first observation: NEXT_STEP autoreset). relay's invariant is
SAME_STEP: no transition crosses an episode boundary, and a truncated step bootstraps from the
final observation. So the adapter takes that extra step at once, for the envs that ended only
(EnvPool steps a subset of env ids), and hands their final observations back in
`info["final_obs"]`, as gymnasium's SAME_STEP vector envs do. (An explicit reset would not do:
with episodic life it restarts the whole game where the extra step continues it.)

`env.id` stays gymnasium's (`ALE/Breakout-v5`, `Hopper-v5`); relay maps it to EnvPool's name.
`env.preprocess: atari` maps to EnvPool's own Atari options (no-op 30, skip 4, 84x84 grey, fire
reset, episodic life, sign-clipped rewards, 4-frame stack, no sticky actions); the true game's
return is reported from EnvPool's raw `info["reward"]` and its real game-over flag.
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np

from ..contracts.config import EnvConfig, RelayConfig

ATARI_OPTIONS = {
    "noop_max": 30,
    "frame_skip": 4,
    "img_height": 84,
    "img_width": 84,
    "gray_scale": True,
    "stack_num": 4,
    "episodic_life": True,
    "reward_clip": True,
    "use_fire_reset": True,
    "repeat_action_probability": 0.0,
}


def _envpool() -> Any:
    try:
        import envpool
    except ImportError:
        raise ValueError(
            'env.vectorization=envpool needs the envpool extra: pip install "relay-rl[envpool]"'
        ) from None
    return envpool


def envpool_id(env_id: str) -> str:
    """EnvPool's name for a gymnasium id: `ALE/Breakout-v5` -> `Breakout-v5`, others unchanged."""
    return env_id.removeprefix("ALE/")


def config_problems(cfg: RelayConfig) -> list[str]:
    """What EnvPool cannot run: ids it lacks, user factories, kwargs, grouped layouts."""
    if cfg.env.vectorization != "envpool":
        return []
    try:
        known = set(_envpool().list_all_envs())
    except ValueError as err:
        return [str(err)]
    problems = []
    name = envpool_id(cfg.env.id)
    if ":" in cfg.env.id or name not in known:
        problems.append(f"env.vectorization=envpool has no env {cfg.env.id!r} (EnvPool name {name!r})")
    if cfg.env.kwargs:
        problems.append("env.vectorization=envpool takes no env.kwargs (use env.vectorization=sync or async)")
    if cfg.learner.group_size > 1:
        problems.append(
            "env.vectorization=envpool cannot start a group's members from one seed "
            "(learner.group_size > 1): use sync or async"
        )
    return problems


def _map(fn: Any, *trees: Any) -> Any:
    """fn over the leaves of observation trees (EnvPool batches Dict observations as dicts of
    arrays, leaf by leaf; a plain Box is one array)."""
    if isinstance(trees[0], dict):
        return {k: _map(fn, *(t[k] for t in trees)) for k in trees[0]}
    return fn(*trees)


def _set_rows(dst: Any, ids: np.ndarray, src: Any) -> None:
    def put(d: np.ndarray, s: np.ndarray) -> None:
        d[ids] = s

    _map(put, dst, src)


class EnvPoolVectorEnv(gym.vector.VectorEnv):
    """N EnvPool envs with gymnasium's SAME_STEP semantics (or none: `autoreset=False`).

    EnvPool seeds env i with seed + i when it is built, so the pool is (re)built on each seeded
    reset with the first of the seeds it is given.
    """

    def __init__(self, ec: EnvConfig, num_envs: int, autoreset: bool) -> None:
        self.ec = ec
        self.num_envs = num_envs
        self.autoreset = autoreset
        self.atari = ec.preprocess == "atari"
        self._pool = self._build(seed=0)
        with warnings.catch_warnings():  # EnvPool's float64 bounds on float32 Boxes: gymnasium warns
            warnings.simplefilter("ignore", UserWarning)
            self.single_observation_space = self._pool.observation_space
            self.single_action_space = self._pool.action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self._ids = np.arange(num_envs, dtype=np.int32)
        self._game_return = np.zeros(num_envs, dtype=np.float64)
        self._game_length = np.zeros(num_envs, dtype=np.int64)
        self._last_obs = gym.vector.utils.create_empty_array(
            self.single_observation_space, num_envs, np.zeros
        )

    def _build(self, seed: int) -> Any:
        options: dict[str, Any] = dict(ATARI_OPTIONS) if self.atari else {}
        if self.ec.max_episode_steps is not None:
            options["max_episode_steps"] = self.ec.max_episode_steps
        with warnings.catch_warnings():  # EnvPool's float64 bounds on float32 Boxes: gymnasium's warning
            warnings.simplefilter("ignore", UserWarning)
            return _envpool().make(
                envpool_id(self.ec.id), env_type="gymnasium", num_envs=self.num_envs, seed=seed, **options
            )

    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        mask = (options or {}).get("reset_mask")
        if mask is not None:  # reset some envs: the others keep their observations
            obs = _map(np.copy, self._last_obs)
            ids = np.flatnonzero(mask).astype(np.int32)
            _set_rows(obs, ids, self._reset_ids(ids))
            self._last_obs = obs
            return obs, {}
        if seed is not None:
            self._pool.close()
            self._pool = self._build(seed=int(seed[0] if isinstance(seed, list) else seed) % (2**31))
        obs, _ = self._pool.reset()
        self._game_return[:] = 0.0
        self._game_length[:] = 0
        self._last_obs = obs
        return obs, {}

    def _reset_ids(self, ids: np.ndarray) -> np.ndarray:
        """A fresh episode (a new game) for the envs `ids`; their first observations, in that order."""
        obs, info = self._pool.reset(ids)
        self._game_return[ids] = 0.0
        self._game_length[ids] = 0
        order = np.argsort(info["env_id"])  # rows by env id: the order of `ids` (ascending)
        return _map(lambda a: a[order], obs)

    def _continue(self, ids: np.ndarray) -> np.ndarray:
        """EnvPool's autoreset step for the envs `ids` that just ended (the action is ignored):
        the next episode's first observations, in the order of `ids`."""
        space = self.single_action_space
        noop = np.zeros((len(ids), *(space.shape or ())), dtype=space.dtype)
        obs, *_, info = self._pool.step(noop, ids)
        order = np.argsort(info["env_id"])
        return _map(lambda a: a[order], obs)

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self._pool.step(np.asarray(actions), self._ids)
        done = terminated | truncated
        infos = self._game_stats(info, done, truncated) if self.atari else {}
        if self.autoreset and done.any():
            ids = np.flatnonzero(done).astype(np.int32)
            final = np.empty(self.num_envs, dtype=object)
            for i in ids:
                final[i] = _map(lambda a, i=i: a[i].copy(), obs)
            obs = _map(np.copy, obs)
            _set_rows(obs, ids, self._continue(ids))
            infos["final_obs"], infos["_final_obs"] = final, done.copy()
        self._last_obs = obs
        return obs, reward.astype(np.float64), terminated, truncated, infos

    def _game_stats(self, info: dict[str, Any], done: np.ndarray, truncated: np.ndarray) -> dict[str, Any]:
        """The true game's return and length (raw rewards, all lives) at its real end (EnvPool's
        `info["terminated"]`, or a time limit), as RecordEpisodeStatistics reports them through
        gymnasium's final infos."""
        self._game_return += info["reward"]
        self._game_length += 1
        over = done & ((np.asarray(info["terminated"]) > 0) | truncated)
        if not over.any():
            return {}
        episode = {"r": self._game_return.copy(), "l": self._game_length.copy()}
        self._game_return[over] = 0.0
        self._game_length[over] = 0
        return {"final_info": {"episode": episode, "_episode": over}}

    def close_extras(self, **kwargs: Any) -> None:
        self._pool.close()


def make_envpool(ec: EnvConfig, num_envs: int, autoreset: bool) -> gym.vector.VectorEnv:
    return EnvPoolVectorEnv(ec, num_envs, autoreset)
