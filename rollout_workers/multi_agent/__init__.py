"""PettingZoo envs as vector envs of agent columns: the registry of multi-agent APIs.

A multi-agent env becomes one gymnasium VectorEnv whose sub-envs are *columns* of the [T, N]
segment, so the sampler, the ring buffer and the learner see what they always see:
- `parallel.py`: a ParallelEnv's E copies x A agents, one column per agent (parameter sharing);
  an agent that leaves mid-episode is a masked column until its env copy's episode ends.
- `turns.py`: a turn-based (AEC) game's E copies, one column each: the learning policy's seat,
  alternating every game; the other seats are played by `Opponents` (self-play snapshots, a random
  player, or the current weights).

Both say per step which columns took a real step (`info[ACTIVE_KEY]`, bool [N]) and hand back
finished episodes' other statistics (`info[STATS_KEY]`, a list of (name, value)); the sampler
masks the others and reports the statistics (contracts.metrics: team_return_mean, win_rate_*).
A new API is one module with a `make` function and one line in MULTI_AGENT_APIS.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from ...contracts.config import MultiAgentConfig
from ...rollout_workers.multi_agent import parallel, turns
from ...rollout_workers.multi_agent.common import (
    ACTIVE_KEY,
    FINAL_GLOBAL_KEY,
    GLOBAL_KEY,
    STATS_KEY,
    Build,
    ColumnsVectorEnv,
    MultiAgentError,
    columns_of,
)

__all__ = [
    "ACTIVE_KEY",
    "FINAL_GLOBAL_KEY",
    "GLOBAL_KEY",
    "MULTI_AGENT_APIS",
    "STATS_KEY",
    "ColumnsVectorEnv",
    "MultiAgentError",
    "api_of",
    "attach_opponents",
    "columns_of",
    "make_multi_agent",
]

# API (api_of) -> its vector env of columns, built from a Build; its class says what the API's
# columns are (ColumnsVectorEnv: one seat, global state, columns per copy, the class it plays)
MULTI_AGENT_APIS: dict[str, type[ColumnsVectorEnv]] = {
    parallel.ParallelVectorEnv.api: parallel.ParallelVectorEnv,
    turns.TurnBasedVectorEnv.api: turns.TurnBasedVectorEnv,
}


def api_of(env: Any) -> str | None:
    """The registered API `env` is of (a PettingZoo ParallelEnv: "parallel", an AECEnv: "aec"),
    None for anything else, or where PettingZoo is not installed."""
    if importlib.util.find_spec("pettingzoo") is None:
        return None
    return next((name for name, kind in MULTI_AGENT_APIS.items() if kind.plays(env)), None)


def make_multi_agent(
    api: str,
    make: Callable[[], Any],
    first: Any,
    num_envs: int,
    ma: MultiAgentConfig,
    autoreset: bool,
    opponents: Any = None,
) -> gym.vector.VectorEnv:
    """The vector env of `api`'s kind (api_of) with `num_envs` columns; `first` is an env already
    built (it becomes copy 0), `make` builds the others; `opponents` play a turn-based game's
    other seats."""
    return MULTI_AGENT_APIS[api](Build(make, first, num_envs, ma, autoreset, opponents))


def attach_opponents(envs: gym.vector.VectorEnv, opponents: turns.Opponents) -> None:
    """Let `opponents` play the other seats of a turn-based game's vector env (no-op otherwise)."""
    if isinstance(envs, turns.TurnBasedVectorEnv):
        envs.attach(opponents)
