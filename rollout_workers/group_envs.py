"""A parallel env played by policy groups: one joint vector env, guarded as one, seen by each
group through a view of its own columns and spaces.

`JointEnvs` steps the joint env (rollout_workers/multi_agent/parallel.py) with every group's
actions at once and hands each group a `Step` of its own columns, with the fault handling of
`GuardedVectorEnv`: an env that raises is rebuilt (every group's step is then None), and a
non-finite observation or reward flags its whole env copy in every group (a copy resets as a
whole, so each group cuts its columns of it in the same step). Each group's sampler
(`SamplerCore`) holds a `GroupEnvs` where it would hold its own vector env: resets go through
it, and the first group to ask for a reset after a step does it for all (the others read the
observations it left), so every group asks and the env copies reset once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium.vector.utils import create_empty_array

from ..contracts.segment import ENV_FAULT_KINDS, Fields
from ..rollout_workers.env_guard import FaultGuard, Step
from ..rollout_workers.multi_agent.common import (
    ACTIVE_KEY,
    FINAL_GLOBAL_KEY,
    GLOBAL_KEY,
    STATS_KEY,
    GroupColumns,
)
from ..rollout_workers.multi_agent.parallel import ParallelVectorEnv
from ..rollout_workers.observations import ObsReader, finite_rows

log = logging.getLogger(__name__)


class JointEnvs(FaultGuard):
    """The joint vector env of a grouped parallel env; `views[name]` is each group's."""

    def __init__(self, make: Callable[[], Any], worker_index: int = 0) -> None:
        super().__init__(make, worker_index)
        self.groups: list[GroupColumns] = list(self.env.policy_groups)
        self.views = {g.name: GroupEnvs(self, g, first=i == 0) for i, g in enumerate(self.groups)}
        self._reset_by: set[str] = set()  # groups that took the newest reset (cleared by a step)

    # ---- resets ------------------------------------------------------------------------------------
    def reset(self, group: GroupColumns, seed: Any, options: dict[str, Any] | None) -> None:
        """A group asks for a reset (seeds and reset_mask in its own columns' terms): done by the
        first group that asks after a step, or again when the same group asks twice."""
        if self._reset_by and group.name not in self._reset_by:
            self._reset_by.add(group.name)
            return
        self._reset_by = {group.name}
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        if mask is not None:
            full = np.zeros(self.env.num_envs, dtype=bool)
            full[group.columns] = np.asarray(mask, dtype=bool)
            options["reset_mask"] = full
        self.env.reset_copies(joint_seeds(self.env, group, seed), options or None)

    # ---- steps ---------------------------------------------------------------------------------
    def step(self, actions: dict[str, np.ndarray]) -> dict[str, Step] | None:
        """Every group's actions [N_g, ...] in, each group's Step of its columns out; None when the
        env raised (it was rebuilt: every group resets before stepping again)."""
        acts = np.empty(self.env.num_envs, dtype=object)
        for g in self.groups:
            acts[g.columns] = list(actions[g.name])
        self._reset_by = set()
        try:
            reward, terminated, truncated, info = self.env.step_columns(acts)
        except Exception as err:  # any env failure is handled the same way
            self._rebuild(err)
            return None
        fields = {g.name: self.views[g.name].read() for g in self.groups}
        ok = self._finite(fields, reward)
        out = {}
        for g in self.groups:
            cols = g.columns
            part = {
                k: v[cols]
                for k, v in info.items()
                if k in (ACTIVE_KEY, "final_obs", "_final_obs", FINAL_GLOBAL_KEY)
            }
            part[STATS_KEY] = info.get(STATS_KEY, []) if g is self.groups[0] else []  # once per episode
            if ok is None:
                out[g.name] = Step(fields[g.name], reward[cols], terminated[cols], truncated[cols], part)
            else:
                good = ok[cols]
                out[g.name] = Step(
                    fields[g.name],
                    np.where(good, reward[cols], 0.0),
                    terminated[cols] & good,
                    truncated[cols] & good,
                    part,
                    good,
                )
        return out

    def _finite(self, fields: dict[str, Fields], reward: np.ndarray) -> np.ndarray | None:
        """None when every column's observation and reward are finite, else bool [N]: False for
        every column of an env copy with a non-finite one (a copy resets whole)."""
        good_obs = np.ones(self.env.num_envs, dtype=bool)
        for g in self.groups:
            rows = finite_rows(fields[g.name])
            if rows is not None:
                good_obs[g.columns] = rows
        good_reward = np.isfinite(reward)
        if good_obs.all() and good_reward.all():
            return None
        A = len(self.env.agents)
        ok = np.repeat((good_obs & good_reward).reshape(-1, A).all(axis=1), A)
        self._count_nonfinite(good_obs, good_reward, int((~ok).sum()))
        return ok


class GroupEnvs:
    """What a group's sampler holds in place of its own guarded vector env: its columns of the
    joint env, in its spaces (the part of `GuardedVectorEnv` a sampler uses between steps)."""

    api = ParallelVectorEnv.api  # a policy group is some agents of a parallel env

    def __init__(self, joint: JointEnvs, group: GroupColumns, first: bool) -> None:
        self.joint = joint
        self.group = group
        self.agents = group.agents
        self.env = self  # what `columns_of` reads the API, agents and global state from
        self.global_state = joint.env.global_state
        self.global_image = joint.env.global_image
        self.num_envs = len(group.columns)
        self.single_observation_space, self.single_action_space = group.spaces
        self.reader: ObsReader | None = None
        self._first = first  # the one that reports the joint env's faults
        self._out = create_empty_array(self.single_observation_space, self.num_envs)

    def read_with(self, reader: ObsReader) -> None:
        self.reader = reader

    def reset_info(self, seed: int) -> dict[str, Any]:
        return {}  # PettingZoo envs give masks in observations (checked with the spec)

    def read(self) -> Fields:
        """This group's columns' newest observations as its policy's input fields."""
        assert self.reader is not None, "read_with first"
        info = {GLOBAL_KEY: self.joint.env.global_states(self.group.columns)} if self.global_state else {}
        return self.reader.read(self.joint.env.batch(self.group, self._out), info)

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> Fields:
        self.joint.reset(self.group, seed, options)
        return self.read()

    @property
    def total_faults(self) -> int:
        return self.joint.total_faults

    def take_faults(self) -> dict[str, int]:
        return self.joint.take_faults() if self._first else dict.fromkeys(ENV_FAULT_KINDS, 0)

    def step(self, actions: np.ndarray) -> Step | None:
        raise RuntimeError("a policy group's columns step with the others' (JointEnvs.step)")

    def close(self) -> None:
        pass  # the joint env closes once (JointEnvs.close)


def joint_seeds(env: Any, group: GroupColumns, seed: Any) -> Any:
    """A group's reset seeds in the joint env's terms: a list of the group's N_g seeds becomes the
    joint env's N, copy e seeded with the group's first column of that copy; others pass as they are."""
    if not isinstance(seed, list | tuple):
        return seed
    A, copies = len(env.agents), env.num_envs // len(env.agents)
    per_copy = len(group.columns) // copies
    full: list[int | None] = [None] * env.num_envs
    for e in range(copies):
        full[e * A] = seed[e * per_copy]
    return full
