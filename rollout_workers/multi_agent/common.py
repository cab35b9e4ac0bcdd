"""What the multi-agent vector envs share: the info keys they report through, agent choice,
space checks. No Ray, no policy."""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from ...contracts.config import MultiAgentConfig

ACTIVE_KEY = "relay_active"  # info key: bool [N], the columns whose step was an agent's real step
UNACTED_KEY = "relay_unacted_agents"  # info key: {agent: steps} present in the env with no live column
STATS_KEY = "relay_episode_stats"  # info key: [(name, value)] of episodes that ended in the step
# info keys of a parallel env read with its global state (multi_agent.central_critic): float32
# [N, S], each column's env copy's state after the step (or reset); and where a column's episode
# ended in the step, the state it ended in (its final observation's, for the bootstrap value).
GLOBAL_KEY = "relay_global_state"
FINAL_GLOBAL_KEY = "relay_final_global_state"


class MultiAgentError(ValueError):
    """A multi-agent env relay cannot play as configured (one line)."""


def played_agents(possible: list[str], patterns: list[str], every: bool) -> list[str]:
    """The agents (in the env's order) the shared policy plays: those matching a pattern of
    multi_agent.agents. With `every` (a parallel env steps all its agents at once) an agent left
    out is an error; MultiAgentError when none matches."""
    chosen = [a for a in possible if any(fnmatch.fnmatchcase(str(a), p) for p in patterns)]
    if not chosen:
        raise MultiAgentError(
            f"multi_agent.agents={patterns} matches none of the env's agents "
            f"({', '.join(map(str, possible))})"
        )
    left = [a for a in possible if a not in chosen]
    if every and left:
        raise MultiAgentError(
            f"multi_agent.agents={patterns} leaves out {', '.join(map(str, left))}: every agent of a "
            "parallel env needs a policy (give agents of another kind their own with multi_agent.policies)"
        )
    return chosen


@dataclass(frozen=True)
class GroupColumns:
    """A policy group of a parallel env: its name, its agents (in the env's order), its columns of
    the joint vector env (copy-major: every copy's agents of the group, then the next copy's) and
    the one pair of spaces its agents share."""

    name: str
    agents: tuple[str, ...]
    columns: np.ndarray
    spaces: tuple[gym.Space, gym.Space]


def policy_groups(
    env: Any,
    agents: list[str],
    policies: dict[str, list[str]],
    copies: int,
    mapping: Callable[[str], Any] | None = None,
) -> list[GroupColumns]:
    """multi_agent.policies resolved for an env's agents (all of them, in its order): each agent
    plays for the first group a pattern of which it matches, or where `mapping` is given
    (multi_agent.policy_mapping) for the group it returns. MultiAgentError (one line) where an
    agent has no group, a group has no agent, or a group's agents' spaces differ."""
    owner = {agent: _group_of(agent, policies, mapping) for agent in agents}
    members_of = {name: [a for a, agent in enumerate(agents) if owner[agent] == name] for name in policies}
    for name, index in members_of.items():
        if not index:
            raise MultiAgentError(
                f"multi_agent.policies.{name}={policies[name]} matches no agent the earlier groups left "
                f"({', '.join(map(str, agents))})"
                if mapping is None
                else f"multi_agent.policy_mapping gave no agent to group {name} "
                f"({', '.join(map(str, agents))})"
            )
    out = []
    for name, index in members_of.items():
        members = [agents[a] for a in index]
        columns = np.array([e * len(agents) + a for e in range(copies) for a in index], dtype=np.int64)
        out.append(GroupColumns(name, tuple(map(str, members)), columns, same_spaces(env, members, name)))
    return out


def _group_of(agent: str, policies: dict[str, list[str]], mapping: Callable[[str], Any] | None) -> str:
    if mapping is not None:
        try:
            name = mapping(agent)
        except Exception as err:  # the user's function: whatever it raises is one line
            raise MultiAgentError(
                f"multi_agent.policy_mapping raised for agent {agent}: {type(err).__name__}: "
                f"{' '.join(str(err).split())[:200]}"
            ) from None
        if not isinstance(name, str) or name not in policies:
            raise MultiAgentError(
                f"multi_agent.policy_mapping gave agent {agent} {str(name)[:60]!r}, not a group of "
                f"multi_agent.policies ({', '.join(policies)})"
            )
        return name
    found = next(
        (g for g, pats in policies.items() if any(fnmatch.fnmatchcase(str(agent), p) for p in pats)), None
    )
    if found is None:
        raise MultiAgentError(
            f"agent {agent} matches no group of multi_agent.policies ({', '.join(policies)}): every "
            "agent of a parallel env needs a policy"
        )
    return found


def same_spaces(env: Any, agents: list[str], group: str | None = None) -> tuple[gym.Space, gym.Space]:
    """The one observation and action space the agents (of policy group `group`) share;
    MultiAgentError where they differ (one shared policy reads and acts in one pair of spaces)."""
    obs, act = env.observation_space(agents[0]), env.action_space(agents[0])
    for agent in agents[1:]:
        if env.observation_space(agent) != obs or env.action_space(agent) != act:
            fix = (
                f"split policy group {group} in multi_agent.policies"
                if group
                else "give each kind of agent its own policy with multi_agent.policies"
            )
            raise MultiAgentError(
                f"agents {agents[0]} and {agent} have different spaces ({obs}, {act} vs "
                f"{env.observation_space(agent)}, {env.action_space(agent)}): a shared policy needs one "
                f"pair; {fix}"
            )
    return obs, act


def columns_problem(num_envs: int, agents: int, env_id: str = "the env") -> str | None:
    """Why `num_envs` columns cannot be whole copies of an env of `agents` agents, or None."""
    if num_envs % agents == 0:
        return None
    lower, upper = max(agents, num_envs // agents * agents), (num_envs // agents + 1) * agents
    return (
        f"env.num_envs={num_envs} counts agent columns and is not a multiple of {env_id}'s {agents} "
        f"agents (each env copy is {agents} columns): use {lower} or {upper}"
    )


def columns_of(vec: Any) -> tuple[str | None, tuple[str, ...], int, int]:
    """(API, agent columns, global state floats, the side of the grey image they are) of a vector
    env for EnvSpec.multi_agent/agents/global_state/global_image: (None, (), 0, 0) for a gymnasium
    one."""
    return (
        getattr(vec, "api", None),
        tuple(getattr(vec, "agents", ())),
        int(getattr(vec, "global_state", 0)),
        int(getattr(vec, "global_image", 0)),
    )


@dataclass(frozen=True)
class Build:
    """What a multi-agent vector env is built from: `make` builds a copy of the env, `first` is one
    already built (copy 0), `num_envs` the columns, `ma` the multi_agent config, `opponents` who
    plays a turn-based game's other seats (None: a random player)."""

    make: Callable[[], Any]
    first: Any
    num_envs: int
    ma: MultiAgentConfig
    autoreset: bool = True
    opponents: Any = None


class ColumnsVectorEnv(gym.vector.VectorEnv):
    """What both multi-agent vector envs are: copies of a PettingZoo env (`envs`) whose columns
    share one observation and one action space, batched from each column's newest observation.

    What an API's entry tells the rest of relay, so nothing outside this package spells its name:
    `one_seat`, a copy is one seat whose other seats `Opponents` play (self-play applies, and
    opponents act without a recurrent state); `gives_global_state`, a copy can give the env's
    global state to a central critic; `pettingzoo_class`, the base class in `pettingzoo.utils.env`
    its envs are (`plays`)."""

    api: ClassVar[str] = ""
    described: ClassVar[str] = ""  # what an env of this API is, in a message ("a parallel env")
    pettingzoo_class: ClassVar[str] = ""
    one_seat: ClassVar[bool] = False
    gives_global_state: ClassVar[bool] = False

    def __init__(self, b: Build) -> None:
        """E = b.num_envs columns of copies of b.first's env (the API's own rule: agents or seats)."""
        raise NotImplementedError

    @classmethod
    def plays(cls, env: Any) -> bool:
        """Whether `env` is of this API (PettingZoo is installed: api_of checks)."""
        from pettingzoo.utils import env as pettingzoo_env

        return isinstance(env, getattr(pettingzoo_env, cls.pettingzoo_class))

    @classmethod
    def columns_per_copy(cls, env: Any) -> int:
        """Segment columns one copy of `env` fills (its spec's EnvSpec.columns): one seat."""
        return 1

    def _setup(
        self, envs: list[Any], num_envs: int, spaces: tuple[gym.Space, gym.Space], autoreset: bool
    ) -> None:
        self.envs = envs
        self.num_envs = num_envs
        self.single_observation_space, self.single_action_space = spaces
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.autoreset = autoreset
        mode = gym.vector.AutoresetMode.SAME_STEP if autoreset else gym.vector.AutoresetMode.DISABLED
        self.metadata = {**getattr(envs[0], "metadata", {}), "autoreset_mode": mode}
        self.render_mode = getattr(envs[0], "render_mode", None)
        self._obs: list[Any] = [None] * num_envs  # each column's newest observation
        self._out: Any = create_empty_array(self.single_observation_space, num_envs)

    def _batch(self) -> Any:
        """Every column's newest observation as one batch (the buffer is reused: the sampler copies)."""
        return concatenate(self.single_observation_space, self._obs, self._out)

    def render(self) -> Any:
        """The first copy's whole scene."""
        return self.envs[0].render()

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            with contextlib.suppress(Exception):  # a broken env may fail to close too
                env.close()
