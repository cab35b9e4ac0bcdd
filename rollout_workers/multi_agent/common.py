"""What the multi-agent vector envs share: the info keys they report through, agent choice,
space checks. No Ray, no policy."""

from __future__ import annotations

import fnmatch
from typing import Any

import gymnasium as gym

ACTIVE_KEY = "relay_active"  # info key: bool [N], the columns whose step was an agent's real step
STATS_KEY = "relay_episode_stats"  # info key: [(name, value)] of episodes that ended in the step


class MultiAgentError(ValueError):
    """A multi-agent env relay cannot play as configured (one line)."""


def api_of(env: Any) -> str | None:
    """ "parallel" for a PettingZoo ParallelEnv, "aec" for an AECEnv, None for anything else
    (PettingZoo is imported only when it is installed)."""
    try:
        from pettingzoo.utils.env import AECEnv, ParallelEnv
    except ImportError:
        return None
    if isinstance(env, ParallelEnv):
        return "parallel"
    if isinstance(env, AECEnv):
        return "aec"
    return None


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
            "parallel env needs a policy (policy groups are not built yet)"
        )
    return chosen


def same_spaces(env: Any, agents: list[str]) -> tuple[gym.Space, gym.Space]:
    """The one observation and action space the agents share; MultiAgentError where they differ
    (one shared policy reads and acts in one pair of spaces)."""
    obs, act = env.observation_space(agents[0]), env.action_space(agents[0])
    for agent in agents[1:]:
        if env.observation_space(agent) != obs or env.action_space(agent) != act:
            raise MultiAgentError(
                f"agents {agents[0]} and {agent} have different spaces ({obs}, {act} vs "
                f"{env.observation_space(agent)}, {env.action_space(agent)}): a shared policy needs one "
                "pair; choose agents of one kind with multi_agent.agents"
            )
    return obs, act


def columns_of(vec: Any) -> tuple[str | None, tuple[str, ...]]:
    """(API, agent columns) of a vector env for EnvSpec.multi_agent/agents: (None, ()) for a
    gymnasium one."""
    return getattr(vec, "api", None), tuple(getattr(vec, "agents", ()))
