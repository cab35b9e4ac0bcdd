"""Policy groups (multi_agent.policies): how a grouped run is one single-policy run per group.

A group's policy sees only its own agents: its config is the run's with `env.num_envs` = the
group's columns (env copies x its agents), the same ring-buffer segments and the same number of
minibatches per update as the whole run, so every group updates in the same rounds; its spec is
the run's `EnvSpec.policy(name)`. Everything that handles one policy (learner, sampler, export)
handles a group's with these two. Weights of all groups travel as one mapping whose keys are
prefixed `<group>/` (`joined` / `part_of`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np
from pydantic import ValidationError

from ..contracts.config import ConfigError, RelayConfig, build_config
from ..contracts.spaces import EnvSpec

SEP = "/"  # between a group's name and a key of its weights (group names hold no '/')
VERSION = "@version"  # a published group's weights version (no model key starts with '@')
T = TypeVar("T")


class PolicyGroupError(ValueError):
    """A grouped run that cannot be split into its groups as configured (one line)."""


def group_config(cfg: RelayConfig, whole: EnvSpec, name: str) -> RelayConfig:
    """The single-policy config group `name` of the run (`whole`: the run's spec) trains and acts
    with. PolicyGroupError names the group and the numbers when its share does not split (a
    minibatch count that does not divide its steps)."""
    spec = whole.policy(name)
    copies = cfg.env.num_envs // whole.columns
    columns = copies * spec.columns
    segment = cfg.rollout.rollout_len * columns
    steps = cfg.segments_per_update * segment
    minibatches = cfg.update_steps // cfg.learner.batch_size
    if steps % minibatches:
        raise PolicyGroupError(
            f"policy group {name}: its {steps} steps per update ({copies} env copies x {spec.columns} agents "
            f"x rollout.rollout_len={cfg.rollout.rollout_len} x {cfg.segments_per_update} segments) do not "
            f"split into the run's {minibatches} minibatches (learner.batch_size={cfg.learner.batch_size}): "
            "choose a batch size that divides every group's steps"
        )
    data = cfg.model_dump(mode="json")
    data["env"]["num_envs"] = columns
    data["learner"]["buffer_size"] = cfg.buffer_segments * segment
    data["learner"]["batch_size"] = steps // minibatches
    data["multi_agent"].update(policies=None, policy_mapping=None)
    try:
        return build_config(data)
    except (ConfigError, ValidationError) as err:
        raise PolicyGroupError(f"policy group {name}: {err}") from None


def group_configs(cfg: RelayConfig, whole: EnvSpec) -> dict[str, RelayConfig]:
    """Every group's config, in the groups' order."""
    return {name: group_config(cfg, whole, name) for name in whole.policy_names}


def joined(parts: Mapping[str, Mapping[str, T]]) -> dict[str, T]:
    """{group: {key: value}} -> {"group/key": value}: every group's weights in one mapping."""
    return {f"{group}{SEP}{k}": v for group, part in parts.items() for k, v in part.items()}


def part_of(weights: Mapping[str, T], group: str) -> dict[str, T]:
    """Group `group`'s weights out of a joined mapping, its prefix (and its version) taken off."""
    prefix = group + SEP
    return {
        k[len(prefix) :]: v
        for k, v in weights.items()
        if k.startswith(prefix) and not k.endswith(SEP + VERSION)
    }


def with_versions(weights: dict[str, Any], versions: Mapping[str, int]) -> dict[str, Any]:
    """Joined weights as published: each group's weights version rides along as "<group>/@version"
    (a 0-d int64 array; groups update apart, so a worker loads only the groups that changed)."""
    return {**weights, **{f"{g}{SEP}{VERSION}": np.array(v, dtype=np.int64) for g, v in versions.items()}}


def group_versions(weights: Mapping[str, Any]) -> dict[str, int]:
    """{group: weights version} of published joined weights."""
    tail = SEP + VERSION
    return {k[: -len(tail)]: int(np.asarray(v)) for k, v in weights.items() if k.endswith(tail)}


def without_versions(weights: Mapping[str, T]) -> dict[str, T]:
    """Published joined weights as a checkpoint's model holds them: the versions taken out."""
    return {k: v for k, v in weights.items() if not k.endswith(SEP + VERSION)}
