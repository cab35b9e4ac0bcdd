"""Making one env from `env.id` (a registered gymnasium id or `module:factory`), its spec, and seeds.

`env.id` comes from the config the user passed on the command line: building it may import the
user's module. Nothing else (a checkpoint, an ONNX file, a run directory) ever reaches here unless
the user names the env again on the command line.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np

from ..contracts.config import IN_PROCESS, EnvConfig, MultiAgentConfig
from ..contracts.spaces import MAX_LEAVES, PATH_SEP, ActionSpec, EnvSpec, ObsLeaf
from ..policy.distributions import DISTRIBUTIONS
from ..rollout_workers.multi_agent import (
    MULTI_AGENT_APIS,
    MultiAgentError,
    api_of,
    columns_of,
    make_multi_agent,
)
from ..rollout_workers.pomdp import register_pomdp
from ..rollout_workers.preprocess import PREPROCESSORS, preprocessor
from ..rollout_workers.user_code import (
    PETTINGZOO,
    UserCodeError,
    add_finder,
    import_named,
    module_folders,
    one_line,
)
from ..rollout_workers.user_code import allow_env_module as allow_env_module  # callers import it here


class EnvSpecError(ValueError):
    """The env cannot be built or its spaces are not supported (one line)."""


def _resolve_factory(env_id: str) -> Callable[..., gym.Env] | None:
    """The callable named by `module:factory`, or None where the id is gymnasium's
    `module:EnvName-v0` form (import the module, then look the id up in the registry)."""
    try:
        module, attr = import_named(env_id, f"env.id={env_id!r}")
    except UserCodeError as err:
        raise EnvSpecError(str(err)) from None
    factory = getattr(module, attr, None)
    if callable(factory):
        return factory
    if attr in gym.registry:
        return None
    raise EnvSpecError(
        f"env.id={env_id!r}: {module.__name__} has no callable {attr!r} and no env registered as it"
    )


def _resolve_pettingzoo(env_id: str) -> Callable[..., Any]:
    """`pettingzoo:<module>` (`butterfly.pistonball_v6`, `classic.connect_four_v3`, or a module of
    its own such as `mpe2.simple_spread_v3`): the module's `parallel_env` where it has one (PettingZoo's
    own AEC-to-parallel conversion), else its `env` (a turn-based AEC game)."""
    path = env_id[len(PETTINGZOO) :]
    if not path or not all(part.isidentifier() for part in path.split(".")):
        raise EnvSpecError(f"env.id={env_id!r}: name a module, as in pettingzoo:butterfly.pistonball_v6")
    module, errors = None, []
    for name in (f"pettingzoo.{path}", path):
        try:
            module = importlib.import_module(name)
            break
        except ImportError as err:
            errors.append(err)
        except Exception as err:  # whatever the module raises on import (a deprecated env, a bad build)
            raise EnvSpecError(f"env.id={env_id!r}: cannot import {name} ({one_line(err)})") from None
    if module is None:
        raise EnvSpecError(extra_hint(f"env.id={env_id}", errors[-1])) from None
    factory = getattr(module, "parallel_env", None) or getattr(module, "env", None)
    if not callable(factory):
        raise EnvSpecError(f"env.id={env_id!r}: {module.__name__} has neither parallel_env nor env")
    return factory


def _parallel_if_possible(env: Any) -> Any:
    """An AEC env whose metadata says it is parallelizable, through PettingZoo's conversion;
    anything else as it is."""
    if getattr(env, "metadata", {}).get("is_parallelizable") and hasattr(env, "agent_iter"):
        from pettingzoo.utils.conversions import aec_to_parallel

        return aec_to_parallel(env)
    return env


EXTRA_FOR = {
    "mujoco": "mujoco",
    "ale": "atari",
    "opencv": "atari",
    "cv2": "atari",
    "envpool": "envpool",
    "minigrid": "minigrid",
    "pettingzoo": "pettingzoo",
    "mpe2": "pettingzoo",
    "pygame": "pettingzoo",
    "pymunk": "pettingzoo",
}


def extra_hint(what: str, err: BaseException | str) -> str:
    """'{what} needs the mujoco extra: pip install "relay-rl[mujoco]"' where the error names a
    library an extra provides, else the error in one line."""
    text = str(err).lower()
    extra = next((extra for lib, extra in EXTRA_FOR.items() if lib in text), None)
    if extra is None:
        return f"{what} cannot be built ({one_line(err) if isinstance(err, BaseException) else err})"
    return f'{what} needs the {extra} extra: pip install "relay-rl[{extra}]"'


def register_ale() -> None:
    """Make gymnasium's registry know the `ALE/...` ids (ale-py registers them on import)."""
    try:
        import ale_py
    except ImportError:
        raise EnvSpecError(extra_hint("the ALE/... env ids", "ale_py is not installed")) from None
    gym.register_envs(ale_py)
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no version banner per env


def register_minigrid() -> None:
    """Make gymnasium's registry know the `MiniGrid-...` and `BabyAI-...` ids (minigrid registers
    them on import)."""
    try:
        import minigrid
    except ImportError:
        raise EnvSpecError(extra_hint("the MiniGrid-... env ids", "minigrid is not installed")) from None
    gym.register_envs(minigrid)


# Env id prefixes whose package registers them on import (an optional extra each).
ENV_FAMILIES: dict[str, Callable[[], None]] = {
    "ALE/": register_ale,
    "MiniGrid-": register_minigrid,
    "BabyAI-": register_minigrid,
    "relay/": register_pomdp,
}


def register_family(env_id: str) -> None:
    """Import the package that registers `env_id`'s family, if it has one (ALE/..., MiniGrid-...)."""
    for prefix, register in ENV_FAMILIES.items():
        if env_id.startswith(prefix):
            register()


def make_env_fn(ec: EnvConfig) -> Callable[[], gym.Env]:
    """A picklable thunk creating one env (AsyncVectorEnv calls it in a subprocess)."""
    env_id, max_episode_steps, kwargs = ec.id, ec.max_episode_steps, dict(ec.kwargs)
    prep = preprocessor(ec.preprocess)
    folders = module_folders()  # carried into AsyncVectorEnv's subprocesses, however started

    def thunk() -> gym.Env:
        for top, folder in folders:
            add_finder(top, folder)
        if env_id.startswith(PETTINGZOO):  # a multi-agent env: no gymnasium wrapper applies
            return _wrapped(_resolve_pettingzoo(env_id)(**{**prep.multi_agent_kwargs, **kwargs}))
        register_family(env_id)
        factory = _resolve_factory(env_id) if ":" in env_id else None
        if factory is None and prep.make is not None:
            return prep.make(env_id, max_episode_steps, kwargs)
        if factory is None:
            return gym.make(env_id, max_episode_steps=max_episode_steps, **kwargs)
        env = _parallel_if_possible(factory(**kwargs))
        if not isinstance(env, gym.Env):
            return _wrapped(env)
        if max_episode_steps is None:
            return env
        return gym.wrappers.TimeLimit(env, max_episode_steps)

    def _wrapped(env: Any) -> Any:
        """A PettingZoo env with the configured preprocessing (SuperSuit's, for `pixels`)."""
        if prep.wrap_multi_agent is None or api_of(env) is None:
            return env
        return prep.wrap_multi_agent(env)

    return thunk


def check_env_id(env_id: str) -> None:
    """Fail early with one line if the id is neither registered nor an importable factory."""
    if env_id.startswith(PETTINGZOO):
        _resolve_pettingzoo(env_id)
        return
    if ":" in env_id:
        _resolve_factory(env_id)
        return
    register_family(env_id)
    if env_id not in gym.registry:
        raise EnvSpecError(f"env.id={env_id!r} is not a registered gymnasium env")


def action_spec(space: gym.Space) -> ActionSpec:
    """The ActionSpec of an env's (single) action space, from the first action distribution that
    acts in it (policy/distributions/, in registry order); EnvSpecError for what none can."""
    for dist in DISTRIBUTIONS.values():
        try:
            spec = dist.from_space(space)
        except ValueError as err:
            raise EnvSpecError(f"unsupported action space {space}: {err}") from None
        if spec is not None:
            return spec
    kinds = [d.space_name for d in DISTRIBUTIONS.values()]
    raise EnvSpecError(
        f"unsupported action space {space}: relay handles {', '.join(kinds[:-1])} and {kinds[-1]}"
    )


def _leaf(space: gym.Space, path: str) -> ObsLeaf:
    where = f"observation {path!r}" if path else "the observation"
    if isinstance(space, gym.spaces.Box):
        if int(np.prod(space.shape)) == 0:
            raise EnvSpecError(f"{where} ({space}) holds no numbers: there is nothing to learn from")
        low, high = float(np.min(space.low)), float(np.max(space.high))
        return ObsLeaf(path, "box", tuple(int(d) for d in space.shape), str(space.dtype), low, high)
    if isinstance(space, gym.spaces.Discrete):
        start = int(space.start)
        return ObsLeaf(
            path, "discrete", (), "int64", start, start + int(space.n) - 1, (int(space.n),), (start,)
        )
    if isinstance(space, gym.spaces.MultiDiscrete) and space.nvec.size:
        nvec = tuple(int(n) for n in space.nvec.reshape(-1))
        starts = tuple(int(v) for v in np.asarray(space.start).reshape(-1))
        return ObsLeaf(path, "multi_discrete", tuple(space.shape), "int64", nvec=nvec, start=starts)
    if isinstance(space, gym.spaces.MultiBinary) and int(np.prod(space.shape)) > 0:
        return ObsLeaf(path, "multi_binary", tuple(int(d) for d in space.shape), "int8", 0.0, 1.0)
    raise EnvSpecError(
        f"unsupported space for {where}: {space}; relay reads Box, Discrete, MultiDiscrete, "
        "MultiBinary, and Dict/Tuple of these"
    )


def is_text(space: gym.Space) -> bool:
    """Text spaces, and the text-like ones envs define (MiniGrid's MissionSpace: strings, dtype <U)."""
    dtype = getattr(space, "dtype", None)
    return isinstance(space, gym.spaces.Text) or (dtype is not None and np.dtype(dtype).kind == "U")


def _walk(space: gym.Space, path: str, notes: list[str], out: list[ObsLeaf]) -> None:
    """Every leaf of `space` below `path`, in the space's own order (Dict keys as gymnasium sorts them)."""
    if isinstance(space, gym.spaces.Dict | gym.spaces.Tuple):
        items = space.spaces.items() if isinstance(space, gym.spaces.Dict) else enumerate(space.spaces)
        for key, sub in items:
            key = str(key)
            if not key or PATH_SEP in key:
                raise EnvSpecError(
                    f"observation key {key!r} under {path or 'the root'}: keys may not be empty "
                    f"or hold {PATH_SEP!r}"
                )
            sub_path = f"{path}{PATH_SEP}{key}" if path else key
            if is_text(sub):
                notes.append(
                    f"observation {sub_path!r} is text ({type(sub).__name__}): skipped "
                    "(env.obs_keys chooses keys)"
                )
                continue
            _walk(sub, sub_path, notes, out)
        return
    out.append(_leaf(space, path))
    if len(out) > MAX_LEAVES:
        raise EnvSpecError(f"the observation has more than {MAX_LEAVES} leaves")


def _select_keys(obs: gym.Space, keys: list[str] | None, drop: str | None) -> gym.Space:
    """The Dict observation restricted to `keys` (all when None), without `drop` (the mask key)."""
    if not isinstance(obs, gym.spaces.Dict):
        if keys is not None:
            raise EnvSpecError(f"env.obs_keys is set but the observation is not a Dict ({obs})")
        return obs
    missing = [k for k in keys or () if k not in obs.spaces]
    if missing:
        have = ", ".join(map(str, obs.spaces))
        raise EnvSpecError(f"env.obs_keys: the observation has no key {missing[0]!r} (it has {have})")
    chosen = {k: v for k, v in obs.spaces.items() if (keys is None or k in keys) and k != drop}
    if not chosen:
        raise EnvSpecError("no observation key is left for the policy to read")
    return gym.spaces.Dict(chosen)


def mask_source(
    ec: EnvConfig | None, obs: gym.Space, act: gym.Space, reset_info: dict[str, Any] | None
) -> str | None:
    """Where the env's action masks come from ("obs:<key>" or "info:<key>"), or None."""
    setting = ec.action_mask if ec is not None else "none"
    if setting == "none":
        return None
    maskable = isinstance(act, gym.spaces.Discrete | gym.spaces.MultiDiscrete)
    if setting == "auto":
        if isinstance(obs, gym.spaces.Dict) and "action_mask" in obs.spaces and maskable:
            return "obs:action_mask"
        return "info:action_mask" if maskable and reset_info and "action_mask" in reset_info else None
    if not maskable:
        raise EnvSpecError(
            f"env.action_mask={setting}: masks apply to Discrete and MultiDiscrete actions, not {act}"
        )
    kind, _, key = setting.partition(":")
    if kind == "obs" and not (isinstance(obs, gym.spaces.Dict) and key in obs.spaces):
        raise EnvSpecError(f"env.action_mask={setting}: the observation has no key {key!r}")
    return setting


def kept_choices(action: ActionSpec, actions: list[int], mask: str | None) -> ActionSpec:
    """`env.actions`: the discrete spec whose choice i is the env's `actions[i]`; EnvSpecError (one
    line) for another action kind, a choice the env lacks, a repeat, or an env action mask (whose
    flags are the env's choices, not the kept ones)."""
    setting = f"env.actions={actions}"
    if action.kind != "discrete":
        raise EnvSpecError(f"{setting}: keeps choices of a Discrete action space, not {action.describe()}")
    first = int(action.offsets)
    outside = [a for a in actions if not first <= a < first + action.size]
    if outside:
        raise EnvSpecError(
            f"{setting}: {outside[0]} is not one of the env's choices {first}..{first + action.size - 1}"
        )
    if len(set(actions)) != len(actions):
        raise EnvSpecError(f"{setting}: names a choice twice")
    if mask is not None:
        raise EnvSpecError(
            f"{setting}: the env's action masks ({mask}) flag all its choices; set env.action_mask=none "
            "or keep every choice"
        )
    return ActionSpec("discrete", len(actions), choices=tuple(actions))


def needs_reset_info(ec: EnvConfig | None, act: gym.Space) -> bool:
    """Whether resolving the mask source needs one reset's info (auto, or info:<key>, on choices)."""
    return (
        ec is not None
        and ec.action_mask != "none"
        and not ec.action_mask.startswith("obs:")
        and isinstance(act, gym.spaces.Discrete | gym.spaces.MultiDiscrete)
    )


def env_spec(
    obs: gym.Space,
    act: gym.Space,
    ec: EnvConfig | None = None,
    reset_info: dict[str, Any] | None = None,
    notes: list[str] | None = None,
    multi_agent: tuple[str | None, tuple[str, ...], int, int] = (None, (), 0, 0),
) -> EnvSpec:
    """The EnvSpec of an env's (single) observation and action spaces: a plain Box stays one Box,
    anything else becomes leaves. `ec` brings env.obs_keys and env.action_mask; `reset_info`, an
    info dict of a reset, resolves info masks; `notes` collects what was skipped (one line each);
    `multi_agent`: a PettingZoo env's API, (parallel) agent columns, global state floats and the
    side of the grey image they are (0: a flat state)."""
    api, agents, global_state, global_image = multi_agent
    action = action_spec(act)
    mask = mask_source(ec, obs, act, reset_info)
    if ec is not None and ec.actions is not None:
        action = kept_choices(action, ec.actions, mask)
    if (
        mask is not None
        and mask.startswith("info:")
        and reset_info is not None
        and mask[5:] not in reset_info
    ):
        raise EnvSpecError(f"env.action_mask={mask}: the env's reset info has no {mask[5:]!r}")
    drop = mask[4:] if mask is not None and mask.startswith("obs:") else None
    if drop is not None:
        assert isinstance(obs, gym.spaces.Dict)  # mask_source checked it
        sub = obs[drop]
        if (
            not isinstance(sub, gym.spaces.Box | gym.spaces.MultiBinary)
            or int(np.prod(sub.shape)) != action.param_size
        ):
            raise EnvSpecError(
                f"env.action_mask=obs:{drop}: a mask is {action.param_size} flags for {action.describe()}, "
                f"the observation's {drop!r} is {sub}"
            )
    obs = _select_keys(obs, ec.obs_keys if ec is not None else None, drop)
    if isinstance(obs, gym.spaces.Box):
        if int(np.prod(obs.shape)) == 0:
            raise EnvSpecError(f"observation space {obs} holds no numbers: there is nothing to learn from")
        low, high = float(np.min(obs.low)), float(np.max(obs.high))
        shape = tuple(int(d) for d in obs.shape)
        return EnvSpec(
            shape,
            action,
            str(obs.dtype),
            low,
            high,
            action_mask=mask,
            multi_agent=api,
            agents=agents,
            global_state=global_state,
            global_image=global_image,
        )
    if is_text(obs):
        raise EnvSpecError(f"unsupported observation space {obs}: relay does not read text observations")
    leaves: list[ObsLeaf] = []
    _walk(obs, "", notes if notes is not None else [], leaves)
    if not leaves:
        raise EnvSpecError(f"observation space {obs} has no leaf relay reads")
    return EnvSpec(
        (),
        action,
        leaves=tuple(leaves),
        action_mask=mask,
        multi_agent=api,
        agents=agents,
        global_state=global_state,
        global_image=global_image,
    )


def env_actions(spec: ActionSpec, space: gym.Space, actions: np.ndarray) -> np.ndarray:
    """A policy's actions [N, *spec.shape] as the env's vector space takes them: Box actions
    clipped to its bounds and in its shape, choices moved to the space's `start`, bits in its
    shape and dtype. (Segments keep the sampled ones, so log-probs match.)"""
    actions = spec.to_env(actions)
    if spec.floats:
        low, high = getattr(space, "low", None), getattr(space, "high", None)
        return np.clip(actions, low, high) if low is not None else actions
    return actions.astype(space.dtype, copy=False)


def multi_agent_problem(ec: EnvConfig, ma: MultiAgentConfig, api: str) -> str | None:
    """What relay cannot do with a PettingZoo env of `api` as configured, or None."""
    if ec.vectorization != IN_PROCESS:
        return (
            f"env.vectorization={ec.vectorization}: a PettingZoo env's copies step in the rollout "
            f"worker's own process; use {IN_PROCESS} (add rollout workers to spread them)"
        )
    if ec.max_episode_steps is not None:
        return (
            "env.max_episode_steps does not apply to PettingZoo envs: set the env's own limit in "
            "env.kwargs (max_cycles)"
        )
    if not preprocessor(ec.preprocess).applies_to(multi_agent=True):
        takes = ", ".join(name for name, p in PREPROCESSORS.items() if p.applies_to(multi_agent=True))
        return f"env.preprocess={ec.preprocess} is for gymnasium envs; a PettingZoo env takes {takes}"
    kind = MULTI_AGENT_APIS[api]
    if ma.self_play is not None and not kind.one_seat:
        return (
            f"multi_agent.self_play plays the other seats of a turn-based (AEC) game; env.id={ec.id} "
            f"is {kind.described}"
        )
    if ma.central_critic and not kind.gives_global_state:
        return (
            f"multi_agent.central_critic reads a parallel env's global state; env.id={ec.id} is "
            f"{kind.described}"
        )
    return None


def _multi_agent_spec(
    ec: EnvConfig, ma: MultiAgentConfig, api: str, make: Callable[[], Any], env: Any, notes: list[str] | None
) -> EnvSpec:
    """The spec of a PettingZoo env's shared policy: one copy as a vector env of its columns."""
    problem = multi_agent_problem(ec, ma, api)
    if problem:
        raise EnvSpecError(problem)
    columns = MULTI_AGENT_APIS[api].columns_per_copy(env)
    try:
        vec = make_multi_agent(api, make, env, columns, ma, autoreset=True)
    except MultiAgentError as err:
        raise EnvSpecError(str(err)) from None
    except Exception as err:  # an env whose spaces or agents cannot be read
        raise EnvSpecError(f"env.id={ec.id!r} cannot be built ({one_line(err)})") from None
    try:
        spec = columns_spec(vec, ec, notes)
    finally:
        vec.close()
    for one in [spec, *(group for _, group in spec.groups)]:
        if one.action_mask is not None and one.action_mask.startswith("info:"):
            raise EnvSpecError(
                f"env.action_mask={one.action_mask}: PettingZoo envs give masks in observations (obs:<key>)"
            )
    return spec


def columns_spec(vec: gym.vector.VectorEnv, ec: EnvConfig, notes: list[str] | None = None) -> EnvSpec:
    """The spec of a multi-agent vector env of columns: its shared policy's, or where it is split
    into policy groups (multi_agent.policies), the whole env's with each group's inside
    (`EnvSpec.groups`; the whole's own spaces are the first group's)."""
    groups = getattr(vec, "policy_groups", None)
    if not groups:
        return env_spec(
            vec.single_observation_space, vec.single_action_space, ec, None, notes, columns_of(vec)
        )
    api, _, state, image = columns_of(vec)
    parts = tuple(
        (g.name, env_spec(g.spaces[0], g.spaces[1], ec, None, notes, (api, g.agents, state, image)))
        for g in groups
    )
    return replace(parts[0][1], agents=tuple(map(str, getattr(vec, "agents", ()))), groups=parts)


def probe_env_spec(
    ec: EnvConfig, notes: list[str] | None = None, ma: MultiAgentConfig | None = None
) -> EnvSpec:
    """Build one env, read its spec (one reset where masks may come from its info), close it.
    Whatever the env does wrong is one line; what was skipped goes to `notes`. A PettingZoo env's
    spec is its shared policy's, as `ma` (multi_agent) chooses its agents."""
    check_env_id(ec.id)
    make = make_env_fn(ec)
    try:
        env = make()
    except EnvSpecError:
        raise
    except gym.error.DependencyNotInstalled as err:
        raise EnvSpecError(extra_hint(f"env.id={ec.id}", err)) from None
    except Exception as err:  # a factory that raises, bad env.kwargs, a broken env
        raise EnvSpecError(f"env.id={ec.id!r} cannot be built ({one_line(err)})") from None
    api = api_of(env)
    if api is not None:
        return _multi_agent_spec(ec, ma or MultiAgentConfig(), api, make, env, notes)
    try:
        if ma is not None and ma.central_critic:
            raise EnvSpecError(
                f"multi_agent.central_critic reads a PettingZoo parallel env's global state; {ec.id} is a "
                "gymnasium env"
            )
        if not preprocessor(ec.preprocess).applies_to(multi_agent=False):
            raise EnvSpecError(
                f"env.preprocess={ec.preprocess} is for PettingZoo envs; {ec.id} is a gymnasium env"
            )
        if not isinstance(env, gym.Env):
            made = type(env).__name__
            raise EnvSpecError(f"env.id={ec.id!r} cannot be built (it made a {made}, not an env)")
        info = env.reset(seed=ec.seed)[1] if needs_reset_info(ec, env.action_space) else None
        return env_spec(env.observation_space, env.action_space, ec, info, notes)
    except EnvSpecError:
        raise
    except Exception as err:  # a reset that raises
        raise EnvSpecError(f"env.id={ec.id!r} cannot be reset ({one_line(err)})") from None
    finally:
        with contextlib.suppress(Exception):  # a broken env may fail to close too
            env.close()


def env_seeds(run_seed: int, worker_index: int, num_envs: int, stream: int = 0) -> list[int]:
    """Distinct, reproducible per-env seeds from the run seed, the worker index and a seed stream
    (0 for a fresh run; see `SamplerCore.reseed`)."""
    entropy = [run_seed, worker_index] + ([stream] if stream else [])
    state = np.random.SeedSequence(entropy).generate_state(num_envs)
    return [int(s) for s in state]
