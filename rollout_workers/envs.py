"""Making one env from `env.id` (a registered gymnasium id or `module:factory`), its spec, and seeds.

`env.id` comes from the config the user passed on the command line: building it may import the
user's module. Nothing else (a checkpoint, an ONNX file, a run directory) ever reaches here unless
the user names the env again on the command line.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from contracts.config import EnvConfig
from contracts.spaces import ActionSpec, EnvSpec
from rollout_workers.preprocess import preprocessor


class EnvSpecError(ValueError):
    """The env cannot be built or its spaces are not supported (one line)."""


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}" if text else type(err).__name__


class _EnvModuleFinder(importlib.abc.MetaPathFinder):
    """Finds one top-level module (a `module:factory` env's) in one folder, and nothing else.

    It sits at the end of sys.meta_path, so it is asked only after every installed package and
    the standard library said no: the folder can never shadow a library."""

    def __init__(self, top: str, folder: str) -> None:
        self.top, self.folder = top, folder

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.top:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [self.folder])


def allow_env_module(env_id: str, folder: str) -> None:
    """Let the top-level module of a `module:factory` env id (one the user named) be imported from
    `folder` (the user's working folder), after everything installed. Nothing else in `folder`
    is importable through this; ids without ':' change nothing."""
    if ":" in env_id:
        _add_finder(env_id.partition(":")[0].split(".")[0], folder)


def _add_finder(top: str, folder: str) -> None:
    if not any(isinstance(f, _EnvModuleFinder) and (f.top, f.folder) == (top, folder) for f in sys.meta_path):
        sys.meta_path.append(_EnvModuleFinder(top, folder))


def _env_module_folders() -> list[tuple[str, str]]:
    return [(f.top, f.folder) for f in sys.meta_path if isinstance(f, _EnvModuleFinder)]


def _resolve_factory(env_id: str) -> Callable[..., gym.Env] | None:
    """The callable named by `module:factory`, or None where the id is gymnasium's
    `module:EnvName-v0` form (import the module, then look the id up in the registry)."""
    module_name, _, attr = env_id.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # ImportError, SyntaxError, or whatever the module raises on import
        raise EnvSpecError(
            f"env.id={env_id!r}: cannot import module {module_name!r} ({_one_line(err)})"
        ) from None
    factory = getattr(module, attr, None)
    if callable(factory):
        return factory
    if attr in gym.registry:
        return None
    raise EnvSpecError(
        f"env.id={env_id!r}: {module_name} has no callable {attr!r} and no env registered as it"
    )


EXTRA_FOR = {"mujoco": "mujoco", "ale": "atari", "opencv": "atari", "cv2": "atari", "envpool": "envpool"}


def extra_hint(what: str, err: BaseException | str) -> str:
    """'{what} needs the mujoco extra: pip install "relay-rl[mujoco]"' where the error names a
    library an extra provides, else the error in one line."""
    text = str(err).lower()
    extra = next((extra for lib, extra in EXTRA_FOR.items() if lib in text), None)
    if extra is None:
        return f"{what} cannot be built ({_one_line(err) if isinstance(err, BaseException) else err})"
    return f'{what} needs the {extra} extra: pip install "relay-rl[{extra}]"'


def register_ale() -> None:
    """Make gymnasium's registry know the `ALE/...` ids (ale-py registers them on import)."""
    try:
        import ale_py
    except ImportError:
        raise EnvSpecError(extra_hint("the ALE/... env ids", "ale_py is not installed")) from None
    gym.register_envs(ale_py)
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no version banner per env


def make_env_fn(ec: EnvConfig) -> Callable[[], gym.Env]:
    """A picklable thunk creating one env (AsyncVectorEnv calls it in a subprocess)."""
    env_id, max_episode_steps, kwargs = ec.id, ec.max_episode_steps, dict(ec.kwargs)
    prep = preprocessor(ec.preprocess)
    folders = _env_module_folders()  # carried into AsyncVectorEnv's subprocesses, however started

    def thunk() -> gym.Env:
        for top, folder in folders:
            _add_finder(top, folder)
        if env_id.startswith("ALE/"):
            register_ale()
        factory = _resolve_factory(env_id) if ":" in env_id else None
        if factory is None and prep.make is not None:
            return prep.make(env_id, max_episode_steps, kwargs)
        if factory is None:
            return gym.make(env_id, max_episode_steps=max_episode_steps, **kwargs)
        env = factory(**kwargs)
        return gym.wrappers.TimeLimit(env, max_episode_steps) if max_episode_steps is not None else env

    return thunk


def check_env_id(env_id: str) -> None:
    """Fail early with one line if the id is neither registered nor an importable factory."""
    if ":" in env_id:
        _resolve_factory(env_id)
        return
    if env_id.startswith("ALE/"):
        register_ale()
    if env_id not in gym.registry:
        raise EnvSpecError(f"env.id={env_id!r} is not a registered gymnasium env")


def action_spec(space: gym.Space) -> ActionSpec:
    if isinstance(space, gym.spaces.Discrete):
        return ActionSpec("discrete", int(space.n))
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1 and space.shape[0] > 0:
        return ActionSpec("continuous", int(space.shape[0]))
    raise EnvSpecError(
        f"unsupported action space {space}: relay handles Discrete and 1-D Box (of at least one number)"
    )


def env_spec(obs: gym.Space, act: gym.Space) -> EnvSpec:
    """The EnvSpec of an env's (single) observation and action spaces."""
    if isinstance(obs, gym.spaces.Box) and obs.shape and int(np.prod(obs.shape)) == 0:
        raise EnvSpecError(f"observation space {obs} holds no numbers: there is nothing to learn from")
    if isinstance(obs, gym.spaces.Box):
        low, high = float(np.min(obs.low)), float(np.max(obs.high))
    elif isinstance(obs, gym.spaces.Discrete):
        low, high = float(obs.start), float(int(obs.start) + int(obs.n) - 1)
    else:
        raise EnvSpecError(f"unsupported observation space {obs}: relay handles Box and Discrete")
    return EnvSpec(tuple(int(d) for d in obs.shape or ()), action_spec(act), str(obs.dtype), low, high)


def probe_env_spec(ec: EnvConfig) -> EnvSpec:
    """Build one env, read its spec, close it. Whatever the env does wrong is one line."""
    check_env_id(ec.id)
    try:
        env = make_env_fn(ec)()
    except EnvSpecError:
        raise
    except gym.error.DependencyNotInstalled as err:
        raise EnvSpecError(extra_hint(f"env.id={ec.id}", err)) from None
    except Exception as err:  # a factory that raises, bad env.kwargs, a broken env
        raise EnvSpecError(f"env.id={ec.id!r} cannot be built ({_one_line(err)})") from None
    try:
        if not isinstance(env, gym.Env):
            made = type(env).__name__
            raise EnvSpecError(f"env.id={ec.id!r} cannot be built (it made a {made}, not an env)")
        return env_spec(env.observation_space, env.action_space)
    finally:
        with contextlib.suppress(Exception):  # a broken env may fail to close too
            env.close()


def env_seeds(run_seed: int, worker_index: int, num_envs: int, stream: int = 0) -> list[int]:
    """Distinct, reproducible per-env seeds from the run seed, the worker index and a seed stream
    (0 for a fresh run; see `SamplerCore.reseed`)."""
    entropy = [run_seed, worker_index] + ([stream] if stream else [])
    state = np.random.SeedSequence(entropy).generate_state(num_envs)
    return [int(s) for s in state]
