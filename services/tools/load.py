"""Loading a policy file as data: a relay checkpoint, a relay ONNX export, or an ML-Agents `.onnx`
or `.pt`.

Nothing read from a file imports a module, calls a factory or builds an env: the policy is rebuilt
from the env spec the file carries (or its weights' shapes) and the model settings of its config.
An env is built only for `recorded_observations`, and only the one the user names on the command
line (`--env`), with only the kwargs they type there (`--env-kwargs`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from pydantic import ValidationError

from ...contracts.checkpoint import Checkpoint, CheckpointError
from ...contracts.config import IN_PROCESS, EnvConfig, RelayConfig
from ...contracts.policy_groups import PolicyGroupError, group_config, part_of
from ...contracts.segment import Fields
from ...contracts.spaces import EnvSpec
from ...policy.actor_critic import STATE, draw_noise, fields_to_torch
from ...policy.models import ActorCritic, infer_env_spec
from ...rollout_workers.envs import EnvSpecError, check_env_id, env_actions, env_spec
from ...rollout_workers.evaluation import eval_env_config
from ...rollout_workers.observations import ObsReader
from ...rollout_workers.scenes import open_scene
from ...rollout_workers.vector_backends import make_vector_env
from ...services.runs.checkpoints import read_data
from ...services.tools.handle import (
    PolicyHandle,
    PolicyLoadError,
    concat_fields,
    rows_of,
)
from ...services.tools.mlagents import mlagents_policy_from_state_dict
from ...services.tools.onnx_import import import_onnx_policy
from ...services.tools.relay_policy import relay_policy


def _read_checkpoint(raw: Any, name: str) -> tuple[Checkpoint, EnvSpec]:
    try:
        ckpt = Checkpoint.from_dict(raw)
        return ckpt, ckpt.env or infer_env_spec(ckpt.learner["model"])
    except (CheckpointError, KeyError, AttributeError, TypeError) as err:
        raise PolicyLoadError(f"{name}: not a relay checkpoint ({err})") from None


def _relay_checkpoint(raw: Any, name: str, policy: str | None = None) -> PolicyHandle:
    ckpt, env = _read_checkpoint(raw, name)
    if not env.groups:
        if policy is not None:
            raise PolicyLoadError(f"{name} holds one policy, not policy groups: drop --policy {policy}")
        return relay_policy(ckpt.config, env, ckpt.learner["model"], f"relay checkpoint {name}")
    if policy is None:
        raise PolicyLoadError(
            f"{name} holds policy groups ({', '.join(env.policy_names)}): choose one with --policy NAME"
        )
    try:
        env.policy(policy)  # KeyError naming the groups
        run_cfg = RelayConfig.model_validate(ckpt.config)
        groups = {group: (env.policy(group), group_config(run_cfg, env, group)) for group in env.policy_names}
    except KeyError as err:
        raise PolicyLoadError(f"{name}: {err.args[0]}") from None
    except (ValidationError, PolicyGroupError, ValueError) as err:
        first = " ".join(str(err).split())[:200]
        raise PolicyLoadError(f"{name}: unreadable relay config ({first})") from None
    handles = {
        group: replace(
            relay_policy(
                cfg.model_dump(mode="json"),
                spec,
                part_of(ckpt.learner["model"], group),
                f"relay checkpoint {name}, policy {group}",
            ),
            group=group,
        )
        for group, (spec, cfg) in groups.items()
    }
    focus = handles.pop(policy)  # the others are its scene-mates
    return replace(focus, others=handles)


def load_policy(path: str | Path, relay_only: bool = False, policy: str | None = None) -> PolicyHandle:
    """A relay checkpoint (.pt), an ML-Agents checkpoint (.pt with a Policy state dict), or an ONNX
    file (relay export or ML-Agents); `relay_only` accepts relay checkpoints alone. `policy`: the
    policy group to load from a checkpoint of policy groups (required there, refused elsewhere)."""
    p = Path(path)
    if not p.is_file():
        raise PolicyLoadError(f"{p}: no such file")
    if policy is not None and p.suffix == ".onnx":
        raise PolicyLoadError(f"{p.name}: an ONNX file holds one policy: drop --policy {policy}")
    if p.suffix == ".onnx" and not relay_only:
        return import_onnx_policy(p)
    try:
        raw = read_data(p)
    except CheckpointError as err:
        raise PolicyLoadError(str(err)) from None
    if isinstance(raw, dict) and "Policy" in raw and not relay_only:
        if policy is not None:
            raise PolicyLoadError(
                f"{p.name}: an ML-Agents checkpoint holds one policy: drop --policy {policy}"
            )
        return mlagents_policy_from_state_dict(raw["Policy"], f"ML-Agents checkpoint {p.name}")
    return _relay_checkpoint(raw, p.name, policy)


@dataclass(frozen=True)
class NamedEnv:
    """The env a user names on the command line: `--env ID`, and the constructor kwargs they type
    with `--env-kwargs JSON` (JSON values: data). A file's stored `env.kwargs` never reach a
    constructor: they would reach the user's factory, and a crafted file could steer what it does
    (where it writes, say)."""

    id: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def config(self, handle: PolicyHandle, num_envs: int) -> EnvConfig:
        """Its env config. When it is the run's own id, the run's stored preprocessing and time limit
        apply (settings, not code), with the kwargs typed here in place of the stored ones."""
        stored = handle.config.env if handle.config is not None else None
        if stored is not None and stored.id == self.id:
            return stored.model_copy(update={"num_envs": num_envs, "kwargs": dict(self.kwargs)})
        return EnvConfig(id=self.id, num_envs=num_envs, kwargs=dict(self.kwargs))

    def kwargs_hint(self, handle: PolicyHandle) -> str:
        """What to add to an error when the run was trained on this id with kwargs that were not typed
        here (pistonball with `continuous: false`, say): the stored kwargs, shown, never used."""
        stored = handle.config.env if handle.config is not None else None
        if stored is None or stored.id != self.id or not stored.kwargs or dict(self.kwargs) == stored.kwargs:
            return ""
        shown = json.dumps(stored.kwargs, default=str)  # ASCII with escapes: one line, whatever it holds
        shown = shown if len(shown) <= 200 else shown[:197] + "..."
        return f" (the run was trained with env.kwargs {shown}: type any you want with --env-kwargs)"


def scene_policies(handle: PolicyHandle) -> dict[str, tuple[EnvSpec, ActorCritic]]:
    """A policy group's scene's policies: its own, then the other groups' of its checkpoint."""
    mates = {name: (h.env, h.model) for name, h in handle.others.items()}
    return {str(handle.group): (handle.env, handle.model), **mates}


@torch.no_grad()
def recorded_observations(handle: PolicyHandle, env: NamedEnv, count: int = 1000, seed: int = 0) -> Fields:
    """Input fields of `count` observations met by the policy acting in `env`, which the user
    named (its leaves and masks must be the policy's). A policy group's are met in its scene, the
    other groups of its checkpoint playing their agents."""
    ec = env.config(handle, 8).model_copy(update={"vectorization": IN_PROCESS})
    try:
        check_env_id(ec.id)
        ec = eval_env_config(ec, ec.num_envs, False, handle.env.columns)  # whole copies of agents
        if handle.group is None:
            vec = make_vector_env(ec)
        else:
            vec = open_scene(ec, handle.group, scene_policies(handle), seed=seed)[0]
    except EnvSpecError as err:
        raise PolicyLoadError(str(err)) from None
    except Exception as err:
        raise PolicyLoadError(
            f"--env {env.id}: cannot be built ({type(err).__name__}: {err}){env.kwargs_hint(handle)}"
        ) from None
    try:
        return _record(handle, vec, env, count, seed)
    finally:
        vec.close()


def check_env_fits(
    handle: PolicyHandle, env: gym.vector.VectorEnv, named: NamedEnv, info: dict, acting: bool = False
) -> None:
    """PolicyLoadError unless `env` (built from `named`) observes what the policy reads (its leaves
    and shapes) and, when the policy will `act` in it, takes the actions it chooses."""
    env_id, hint = named.id, named.kwargs_hint(handle)
    ec = handle.config.env if handle.config is not None and handle.config.env.id == env_id else None
    try:
        spec = env_spec(env.single_observation_space, env.single_action_space, ec, info)
    except EnvSpecError as err:
        raise PolicyLoadError(f"--env {env_id}: {err}{hint}") from None
    if [(f.field, f.shape) for f in spec.obs_leaves] != [(f.field, f.shape) for f in handle.env.obs_leaves]:
        raise PolicyLoadError(
            f"--env {env_id} observes {spec.describe_obs()}, "
            f"the policy reads {handle.env.describe_obs()}{hint}"
        )
    if acting and spec.action != handle.env.action:
        raise PolicyLoadError(
            f"--env {env_id} takes {spec.action.describe()}, "
            f"the policy chooses {handle.env.action.describe()}{hint}"
        )


def _record(
    handle: PolicyHandle, env: gym.vector.VectorEnv, named: NamedEnv, count: int, seed: int
) -> Fields:
    obs, info = env.reset(seed=seed)
    check_env_fits(handle, env, named, info)
    reader = ObsReader(handle.env, env.num_envs)
    gen = torch.Generator().manual_seed(seed)
    out: list[Fields] = []
    state = handle.initial_state(env.num_envs)  # a recurrent policy's, carried as it acts
    model = handle.model
    while sum(rows_of(o) for o in out) < count:
        fields = reader.read(obs, info)
        out.append(handle.as_input({**fields, STATE: state} if handle.recurrent else fields))
        noise = draw_noise(model.action, env.num_envs, gen)
        x = fields_to_torch(out[-1])
        params, after = model.policy_step(x)
        actions = model.sample_actions(params, noise, x.get("action_mask"))
        obs, _, terminated, truncated, info = env.step(
            env_actions(handle.env.action, env.single_action_space, actions.numpy())
        )
        if after is not None:
            state = np.where((terminated | truncated)[:, None], np.float32(0.0), after.numpy())
    return {k: v[:count] for k, v in concat_fields(out).items()}
