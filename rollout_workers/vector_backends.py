"""Vector env backends: the registry behind `env.vectorization`.

A backend turns the env config into a gymnasium VectorEnv of N envs in SAME_STEP autoreset mode
(or none, for grouped sampling's own resets). A new backend is one module with a `make` function
(and the config rules it needs) plus one line in VECTOR_BACKENDS.

SAME_STEP resets a finished sub-env inside the step that ended it and hands the final observation
back in info["final_obs"]; so no transition crosses an episode boundary and no step is wasted on the
NEXT_STEP mode's dummy reset transition. Observations a backend returns may be overwritten by its
next step (copy=False): the sampler copies them into the segment before stepping again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import gymnasium as gym

from ..contracts.config import IN_PROCESS, EnvConfig, MultiAgentConfig, RelayConfig
from ..rollout_workers import envpool_backend
from ..rollout_workers.env_guard import RebuildOnRaise
from ..rollout_workers.envs import make_env_fn, multi_agent_problem
from ..rollout_workers.multi_agent import MultiAgentError, api_of, make_multi_agent
from ..rollout_workers.multi_agent.turns import Opponents


def _no_problems(cfg: RelayConfig) -> list[str]:
    return []


@dataclass(frozen=True)
class VectorBackend:
    """make(env config, N, autoreset) -> a VectorEnv; config_problems: what it cannot run."""

    make: Callable[[EnvConfig, int, bool], gym.vector.VectorEnv]
    config_problems: Callable[[RelayConfig], list[str]] = _no_problems


def _mode(autoreset: bool) -> gym.vector.AutoresetMode:
    return gym.vector.AutoresetMode.SAME_STEP if autoreset else gym.vector.AutoresetMode.DISABLED


def make_sync(
    ec: EnvConfig, num_envs: int, autoreset: bool, first: gym.Env | None = None
) -> gym.vector.VectorEnv:
    """All envs in this process, stepped in turn: for cheap envs (IPC would cost more than physics).
    `first`: an env already built, which becomes env 0."""
    fns = [partial(RebuildOnRaise, make_env_fn(ec)) for _ in range(num_envs)]
    if first is not None:
        fns[0] = partial(RebuildOnRaise, make_env_fn(ec), first)
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=_mode(autoreset), copy=False)


def make_async(ec: EnvConfig, num_envs: int, autoreset: bool) -> gym.vector.VectorEnv:
    """A process per env (spawned): for costly envs."""
    fns = [partial(RebuildOnRaise, make_env_fn(ec)) for _ in range(num_envs)]
    return gym.vector.AsyncVectorEnv(fns, autoreset_mode=_mode(autoreset), context="spawn", copy=False)


VECTOR_BACKENDS: dict[str, VectorBackend] = {
    IN_PROCESS: VectorBackend(make_sync),
    "async": VectorBackend(make_async),
    "envpool": VectorBackend(envpool_backend.make_envpool, envpool_backend.config_problems),
}


def vector_backend(name: str) -> VectorBackend:
    """The registered backend; ValueError naming the known ones otherwise."""
    if name not in VECTOR_BACKENDS:
        raise ValueError(f"env.vectorization={name!r} is not a backend: choose {', '.join(VECTOR_BACKENDS)}")
    return VECTOR_BACKENDS[name]


def make_vector_env(
    ec: EnvConfig,
    num_envs: int | None = None,
    autoreset: bool = True,
    ma: MultiAgentConfig | None = None,
    opponents: Opponents | None = None,
) -> gym.vector.VectorEnv:
    """The configured backend's vector env of `num_envs` (default env.num_envs) envs; a PettingZoo
    env's (`pettingzoo:` ids, or a factory that makes one) is a vector env of its agent columns
    (rollout_workers/multi_agent), as `ma` chooses them, its other seats played by `opponents`."""
    n = num_envs or ec.num_envs
    if ":" in ec.id:  # only these ids can name a PettingZoo env: build one to see which it is
        make = make_env_fn(ec)
        first = make()
        api = api_of(first)
        if api is not None:
            ma = ma or MultiAgentConfig()
            problem = multi_agent_problem(ec, ma, api)
            if problem:
                raise MultiAgentError(problem)
            return make_multi_agent(api, make, first, n, ma, autoreset, opponents)
        if ec.vectorization == IN_PROCESS:  # a gymnasium env: it is env 0, never built twice
            return make_sync(ec, n, autoreset, first)
        with contextlib.suppress(Exception):  # the backend builds its own (in other processes)
            first.close()
    return vector_backend(ec.vectorization).make(ec, n, autoreset)
