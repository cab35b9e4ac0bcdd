"""A policy group's scene: the env one group of a run of policy groups is evaluated in (and its
observations recorded in, for `--env`), every other group played by its own policy.

`scene_config` names every group's agents exactly (whatever patterns or mapping chose them in
training), sized so the focus group gets the columns asked for; `GroupScene` shows the focus
group's columns as a plain vector env and moves the other groups inside `step`; `scene_players`
turns the other groups' policies into their acting steps; `open_scene` builds it all. `relay eval
--policy`, export's and verify's recorded observations and the evaluation during training use it.
"""

from __future__ import annotations

import glob
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space, create_empty_array

from ..contracts.config import EnvConfig, MultiAgentConfig
from ..contracts.segment import Fields
from ..contracts.spaces import EnvSpec
from ..policy.actor_critic import STATE
from ..policy.protocol import EnvPolicy
from ..rollout_workers.envs import env_actions
from ..rollout_workers.evaluation import build_eval_env, model_act
from ..rollout_workers.group_envs import joint_seeds
from ..rollout_workers.multi_agent.common import ACTIVE_KEY, GroupColumns
from ..rollout_workers.observations import ObsReader

# (a group's input fields [N_g, ...], with "h_in" for a recurrent policy) -> (its actions, the
# state after the step or None): rollout_workers/evaluation.py's acting step
GroupAct = Callable[[Fields], tuple[np.ndarray, np.ndarray | None]]


@dataclass
class OtherGroup:
    """A group the scene plays itself: its columns, its spec, its acting step and state size."""

    group: GroupColumns
    spec: EnvSpec
    act: GroupAct
    state_size: int = 0


class GroupScene(gym.vector.VectorEnv):
    """One policy group's columns of a grouped parallel env as a plain vector env, every other
    group played by its own policy inside `step`: the whole scene of a run of policy groups, seen
    by the group being evaluated (`relay eval --policy`). It renders copy 0's whole scene."""

    def __init__(self, env: Any, focus: str, others: dict[str, tuple[EnvSpec, GroupAct, int]]) -> None:
        self.env = env
        groups = {g.name: g for g in env.policy_groups}
        self.focus = groups[focus]
        self.others = [OtherGroup(groups[g], spec, act, size) for g, (spec, act, size) in others.items()]
        self.num_envs = len(self.focus.columns)
        self.single_observation_space, self.single_action_space = self.focus.spaces
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata, self.render_mode = env.metadata, env.render_mode
        self._out = create_empty_array(self.single_observation_space, self.num_envs)
        self._readers = [ObsReader(o.spec, len(o.group.columns)) for o in self.others]
        self._outs = [create_empty_array(o.group.spaces[0], len(o.group.columns)) for o in self.others]
        self._states = [np.zeros((len(o.group.columns), o.state_size), np.float32) for o in self.others]

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self.env.reset_copies(joint_seeds(self.env, self.focus, seed), options)
        for state in self._states:
            state[:] = 0.0
        return self.env.batch(self.focus, self._out), {}

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        acts = np.empty(self.env.num_envs, dtype=object)
        acts[self.focus.columns] = list(actions)
        for k, other in enumerate(self.others):
            fields = self._readers[k].read(self.env.batch(other.group, self._outs[k]), {})
            chosen, after = other.act({**fields, STATE: self._states[k]} if other.state_size else fields)
            acts[other.group.columns] = list(env_actions(other.spec.action, other.group.spaces[1], chosen))
            if after is not None:
                self._states[k] = after
        reward, terminated, truncated, info = self.env.step_columns(acts)
        for k, other in enumerate(self.others):  # a column's state starts over with its episode
            done = (terminated | truncated)[other.group.columns]
            self._states[k][done] = 0.0
        cols = self.focus.columns
        part = {k: v[cols] for k, v in info.items() if k in (ACTIVE_KEY, "final_obs", "_final_obs")}
        batch = self.env.batch(self.focus, self._out)
        return batch, reward[cols], terminated[cols], truncated[cols], part

    @property
    def envs(self) -> list[Any]:
        """The env copies (copy 0 renders the scene for a video)."""
        return list(self.env.envs)

    def render(self) -> Any:
        return self.env.render()

    def close_extras(self, **kwargs: Any) -> None:
        self.env.close()


def scene_config(
    ec: EnvConfig, focus: str, specs: Mapping[str, EnvSpec]
) -> tuple[EnvConfig, MultiAgentConfig]:
    """The env config and groups of `focus`'s scene: as many copies as `ec.num_envs` gives the
    focus group columns, every group's agents (`specs`: each group's spec) named exactly."""
    copies = ec.num_envs // specs[focus].columns
    columns = copies * sum(s.columns for s in specs.values())
    ma = MultiAgentConfig(policies={name: [glob.escape(a) for a in s.agents] for name, s in specs.items()})
    return ec.model_copy(update={"num_envs": columns}), ma


def scene_players(
    others: Mapping[str, tuple[EnvSpec, EnvPolicy]], stochastic: bool, seed: int
) -> dict[str, tuple[EnvSpec, GroupAct, int]]:
    """The other groups' acting steps (GroupScene's `others`): greedy, or sampled with noise seeded
    per group apart from the focus group's."""
    return {
        name: (spec, model_act(model, stochastic, seed + k + 1), model.acting_state_size)
        for k, (name, (spec, model)) in enumerate(others.items())
    }


def open_scene(
    ec: EnvConfig,
    focus: str,
    policies: Mapping[str, tuple[EnvSpec, EnvPolicy]],
    stochastic: bool = False,
    seed: int = 0,
) -> tuple[GroupScene, str | None]:
    """`focus`'s scene (`policies`: every group's spec and policy, the focus group's included; `ec`
    sized in the focus group's columns) and build_eval_env's note; EnvSpecError when it cannot be
    built."""
    specs = {name: spec for name, (spec, _) in policies.items()}
    scene_ec, ma = scene_config(ec, focus, specs)
    env, note = build_eval_env(scene_ec, ma)
    others = {name: p for name, p in policies.items() if name != focus}
    return GroupScene(env, focus, scene_players(others, stochastic, seed)), note
