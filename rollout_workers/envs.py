"""Making seeded gymnasium vector envs from `env.id` (a registered id or `module:factory`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from learner.models import ActionSpec


class EnvSpecError(ValueError):
    """The env cannot be built or its spaces are not supported."""


def _resolve_factory(env_id: str) -> Callable[..., gym.Env] | None:
    """The callable named by `module:factory`, or None where the id is gymnasium's
    `module:EnvName-v0` form (import the module, then look the id up in the registry)."""
    module_name, _, attr = env_id.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise EnvSpecError(f"env.id={env_id!r}: cannot import module {module_name!r} ({err})") from None
    factory = getattr(module, attr, None)
    if callable(factory):
        return factory
    if attr in gym.registry:
        return None
    raise EnvSpecError(
        f"env.id={env_id!r}: {module_name} has no callable {attr!r} and no env registered as it"
    )


def make_env_fn(env_id: str, max_episode_steps: int | None, kwargs: dict[str, Any]) -> Callable[[], gym.Env]:
    """A picklable thunk creating one env (AsyncVectorEnv calls it in a subprocess)."""

    def thunk() -> gym.Env:
        factory = _resolve_factory(env_id) if ":" in env_id else None
        if factory is None:
            return gym.make(env_id, max_episode_steps=max_episode_steps, **kwargs)
        env = factory(**kwargs)
        return gym.wrappers.TimeLimit(env, max_episode_steps) if max_episode_steps is not None else env

    return thunk


def check_env_id(env_id: str) -> None:
    """Fail early with one line if the id is neither registered nor an importable factory."""
    if ":" in env_id:
        _resolve_factory(env_id)
    elif env_id not in gym.registry:
        raise EnvSpecError(f"env.id={env_id!r} is not a registered gymnasium env")


def make_vector_env(
    env_id: str,
    num_envs: int,
    vectorization: str = "sync",
    max_episode_steps: int | None = None,
    kwargs: dict[str, Any] | None = None,
    autoreset: bool = True,
) -> gym.vector.VectorEnv:
    """A vector env in SAME_STEP autoreset mode (or none, for grouped sampling's own resets).

    Observations it returns are overwritten by its next step (copy them to keep them).

    SAME_STEP resets a finished sub-env inside the step that ended it and hands the final
    observation back in info["final_obs"]; so no transition crosses an episode boundary and no
    step is wasted on the NEXT_STEP mode's dummy reset transition.
    """
    fns = [make_env_fn(env_id, max_episode_steps, kwargs or {}) for _ in range(num_envs)]
    mode = gym.vector.AutoresetMode.SAME_STEP if autoreset else gym.vector.AutoresetMode.DISABLED
    # copy=False: step() returns the env's own observation buffer, valid until the next step;
    # the sampler copies it into the segment before stepping again, so a second copy is waste.
    if vectorization == "async":
        return gym.vector.AsyncVectorEnv(fns, autoreset_mode=mode, context="spawn", copy=False)
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=mode, copy=False)


def action_spec(space: gym.Space) -> ActionSpec:
    if isinstance(space, gym.spaces.Discrete):
        return ActionSpec("discrete", int(space.n))
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return ActionSpec("continuous", int(space.shape[0]))
    raise EnvSpecError(f"unsupported action space {space}: relay handles Discrete and 1-D Box")


def env_seeds(run_seed: int, worker_index: int, num_envs: int, stream: int = 0) -> list[int]:
    """Distinct, reproducible per-env seeds from the run seed, the worker index and a seed stream
    (0 for a fresh run; see `SegmentSampler.reseed`)."""
    entropy = [run_seed, worker_index] + ([stream] if stream else [])
    state = np.random.SeedSequence(entropy).generate_state(num_envs)
    return [int(s) for s in state]


def env_spaces(
    env_id: str, max_episode_steps: int | None, kwargs: dict[str, Any]
) -> tuple[gym.Space, gym.Space]:
    """(observation space, action space) of one env, built and closed here."""
    env = make_env_fn(env_id, max_episode_steps, kwargs)()
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def probe_spaces(
    env_id: str, max_episode_steps: int | None, kwargs: dict[str, Any]
) -> tuple[tuple[int, ...], ActionSpec]:
    """Observation shape and action spec of one env."""
    obs, act = env_spaces(env_id, max_episode_steps, kwargs)
    return tuple(obs.shape or ()), action_spec(act)


def check_token_observations(env_id: str, obs: gym.Space, vocab_size: int) -> None:
    """A token policy needs 1-D integer observations in [-1, vocab) (-1 = empty slot); one line if not."""
    ok = (
        isinstance(obs, gym.spaces.Box)
        and len(obs.shape) == 1
        and np.issubdtype(obs.dtype, np.integer)
        and obs.low.min() >= -1
        and obs.high.max() < vocab_size
    )
    if not ok:
        raise EnvSpecError(
            f"model.kind=transformer reads token ids (a 1-D integer Box in [-1, {vocab_size})), "
            f"but {env_id} observes {_describe(obs)}"
        )


def _describe(space: gym.Space) -> str:
    if isinstance(space, gym.spaces.Box):
        return f"a {space.dtype} Box of shape {space.shape} in [{space.low.min()}, {space.high.max()}]"
    return str(space)
