"""A PettingZoo ParallelEnv's E copies x A agents as one vector env of N = E·A columns.

Column e·A + a is agent a of env copy e; one policy (parameter sharing) acts for every column. An
agent that finishes before its copy's episode does (killed, done early) ends its own episode in
that step (terminated or truncated, as the env says, its final observation in info["final_obs"])
and stays a *dead* column until the whole copy's episode ends: its steps are flagged inactive
(info[ACTIVE_KEY]), so the sampler masks them and the segment keeps its fixed shape. When no agent
of a copy is left, the copy resets in the same step (SAME_STEP autoreset) and every column of it is
live again.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium.vector.utils import concatenate

from ...contracts.config import MultiAgentConfig
from ...rollout_workers.multi_agent.common import (
    ACTIVE_KEY,
    FINAL_GLOBAL_KEY,
    GLOBAL_KEY,
    STATS_KEY,
    UNACTED_KEY,
    Build,
    ColumnsVectorEnv,
    GroupColumns,
    MultiAgentError,
    columns_problem,
    played_agents,
    policy_groups,
    same_spaces,
)
from ...rollout_workers.multi_agent.global_state import GlobalStateReader
from ...rollout_workers.user_code import UserCodeError, import_callable


class ParallelVectorEnv(ColumnsVectorEnv):
    """E copies of a ParallelEnv; `num_envs` (N) columns, a multiple of its A agents."""

    api = "parallel"
    described = "a parallel env"
    gives_global_state = True
    pettingzoo_class = "ParallelEnv"

    @classmethod
    def columns_per_copy(cls, env: Any) -> int:
        return len(env.possible_agents)  # every agent is played (played_agents, every=True)

    def __init__(self, b: Build) -> None:
        make, first, num_envs, ma, autoreset = b.make, b.first, b.num_envs, b.ma, b.autoreset
        self.agents = played_agents(list(first.possible_agents), ma.agents, every=True)
        A = len(self.agents)
        problem = columns_problem(num_envs, A)
        if problem:
            raise MultiAgentError(problem)
        # Policy groups: each its agents' columns and spaces; the joint env's own spaces are then
        # the first group's, and its columns are read per group (`batch`), never as one batch.
        self.policy_groups = (
            policy_groups(first, self.agents, ma.policies, num_envs // A, _mapping(ma)) if ma.policies else []
        )
        spaces = self.policy_groups[0].spaces if self.policy_groups else same_spaces(first, self.agents)
        copies = [first] + [make() for _ in range(num_envs // A - 1)]
        self._setup(copies, num_envs, spaces, autoreset)
        # Placeholders for agents absent at a reset are drawn from a copy of their space (the env's
        # own is left alone), seeded, so a sync run's segments (padding included) reproduce.
        self._placeholders = [copy.deepcopy(first.observation_space(agent)) for agent in self.agents]
        for space in self._placeholders:
            space.seed(0)
        E = len(self.envs)
        self._live = np.zeros((E, A), dtype=bool)  # in its copy's episode and not finished
        self._returns = np.zeros((E, A), dtype=np.float64)  # this episode's return per agent
        # Each copy's global state [E, S] (multi_agent.central_critic), read after every reset and
        # step; S = 0 without a centralized critic. A screen is read as a grey image (global_state.py).
        self._state_reader = GlobalStateReader(first) if ma.central_critic else None
        self.global_state = self._state_reader.size if self._state_reader else 0
        self.global_image = self._state_reader.image_side if self._state_reader else 0
        self._global = np.zeros((E, self.global_state), dtype=np.float32)

    def _read_global(self, e: int) -> None:
        if self._state_reader is not None:
            self._global[e] = self._state_reader(self.envs[e].state())

    def global_states(self, columns: np.ndarray | None = None) -> np.ndarray:
        """Each column's (of `columns`, or all N) copy's global state, float32 [N, S] (a new array:
        column c is agent c % A of copy c // A)."""
        if columns is None:
            columns = np.arange(self.num_envs)
        return self._global[columns // len(self.agents)]

    def _global_info(self) -> dict[str, Any]:
        return {GLOBAL_KEY: self.global_states()} if self.global_state else {}

    # ---- episodes ---------------------------------------------------------------------------------
    def _begin(self, e: int, obs: dict[str, Any]) -> None:
        """Copy e's episode began with `obs`: the agents it holds are live columns."""
        for a, agent in enumerate(self.agents):
            present = agent in obs
            self._live[e, a] = present
            if present:
                self._obs[e * len(self.agents) + a] = obs[agent]
            elif self._obs[e * len(self.agents) + a] is None:  # never seen yet: a valid placeholder
                self._obs[e * len(self.agents) + a] = self._placeholders[a].sample()
        self._returns[e] = 0.0
        self._read_global(e)

    def _reset_copy(self, e: int, seed: int | None, options: dict[str, Any] | None) -> None:
        obs, _ = self.envs[e].reset(seed=seed, options=options)
        self._begin(e, obs)

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every copy (or those with a column in options["reset_mask"], [N] bool); a list of
        N seeds seeds copy e with its first column's."""
        self.reset_copies(seed, options)
        return self._batch(), self._global_info()

    def reset_copies(self, seed: int | list[int | None] | None, options: dict[str, Any] | None) -> None:
        """`reset` without the batch (policy groups read their columns with `batch`)."""
        A, E = len(self.agents), len(self.envs)
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        chosen = range(E) if mask is None else np.flatnonzero(np.asarray(mask).reshape(E, A).any(axis=1))
        for e in chosen:
            if isinstance(seed, list | tuple):
                copy_seed = seed[e * A]
            else:
                copy_seed = None if seed is None else int(seed) + int(e)
            self._reset_copy(int(e), copy_seed, options or None)

    def batch(self, group: GroupColumns, out: Any) -> Any:
        """Group `group`'s columns' newest observations as one batch, written into `out`."""
        return concatenate(group.spaces[0], [self._obs[c] for c in group.columns], out)

    # ---- stepping ---------------------------------------------------------------------------------
    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        # [N, ...]: every action kind relay acts in is one array. The batch is read after the step
        # (`_batch` copies the columns' observations as they are when it is called).
        reward, terminated, truncated, info = self.step_columns(np.asarray(actions))
        return self._batch(), reward, terminated, truncated, {**info, **self._global_info()}

    def step_columns(self, acts: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """`step` without the batch: `acts[c]` is column c's action (one array, or a sequence of
        each column's when groups act in different spaces); (reward, terminated, truncated, info)."""
        A, N = len(self.agents), self.num_envs
        reward = np.zeros(N, dtype=np.float64)
        terminated = np.zeros(N, dtype=bool)
        truncated = np.zeros(N, dtype=bool)
        active = np.zeros(N, dtype=bool)
        final_obs = np.full(N, None, dtype=object)
        final_global = np.zeros((N, self.global_state), dtype=np.float32)
        stats: list[tuple[str, float]] = []
        unacted: Counter[str] = Counter()
        for e, env in enumerate(self.envs):
            live = np.flatnonzero(self._live[e]).tolist()
            if not live:  # autoreset off: the copy stays over until reset
                continue
            # env.agents once per step: behind PettingZoo's wrappers every read is a chain of calls
            present = set(env.agents)
            step = {self.agents[a]: acts[e * A + a] for a in live if self.agents[a] in present}
            # An agent back after it left (its column waits for the next episode), or one not in
            # possible_agents: the env steps without an action for it. Said, never silent.
            unacted.update(str(agent) for agent in present.difference(step))
            obs, rew, term, trunc, _ = env.step(step)
            self._read_global(e)
            left = set(env.agents)
            for a in live:
                col, agent = e * A + a, self.agents[a]
                active[col] = True
                reward[col] = rew.get(agent, 0.0)
                terminal = bool(term.get(agent, False))
                terminated[col] = terminal
                if agent in obs:
                    self._obs[col] = obs[agent]
                # An agent the env no longer lists has left, whatever its flags said.
                truncated[col] = not terminal and (bool(trunc.get(agent, False)) or agent not in left)
                if terminated[col] or truncated[col]:
                    self._live[e, a] = False
                    final_obs[col] = self._obs[col]
                    final_global[col] = self._global[e]
            self._returns[e, live] += reward[[e * A + a for a in live]]
            if not self._live[e].any():
                stats += self._episode_stats(e)
                if self.autoreset:
                    self._reset_copy(e, None, None)
        # (The columns' global states join the info in `step`: policy groups read theirs per group.)
        info: dict[str, Any] = {ACTIVE_KEY: active, STATS_KEY: stats, UNACTED_KEY: dict(unacted)}
        ended = terminated | truncated
        if ended.any():
            info["final_obs"], info["_final_obs"] = final_obs, ended
            if self.global_state:
                info[FINAL_GLOBAL_KEY] = final_global
        return reward, terminated, truncated, info

    def _episode_stats(self, e: int) -> list[tuple[str, float]]:
        """Copy e's finished episode: the team's return and each agent's."""
        out = [("team_return_mean", float(self._returns[e].sum()))]
        return out + [
            (f"agent_return_mean/{a}", float(r)) for a, r in zip(self.agents, self._returns[e], strict=True)
        ]


def _mapping(ma: MultiAgentConfig) -> Callable[[str], Any] | None:
    """The user's agent-to-group function (multi_agent.policy_mapping), imported here: the config
    naming it came from the command line (a resume has it named again)."""
    if ma.policy_mapping is None:
        return None
    try:
        return import_callable(ma.policy_mapping, "multi_agent.policy_mapping")
    except UserCodeError as err:
        raise MultiAgentError(str(err)) from None
