"""`module:factory` ids that make real PettingZoo envs (mpe2's simple_spread): its AEC form, which
relay converts with PettingZoo's own aec_to_parallel (the env says it is parallelizable), and its
parallel form as it is."""

import numpy as np
from mpe2 import simple_spread_v3, simple_tag_v3
from pettingzoo.utils.env import ParallelEnv


def spread_aec(**kwargs):
    return simple_spread_v3.env(**kwargs)


def spread_parallel(**kwargs):
    return simple_spread_v3.parallel_env(**kwargs)


class FaultyTag(ParallelEnv):
    """mpe2's simple_tag (predators and prey: two kinds of agents) that goes wrong once, at its
    `at`-th step: `fault="nan"` gives the prey a non-finite observation, `fault="raise"` raises."""

    def __init__(self, fault, at, **kwargs):
        self.env = simple_tag_v3.parallel_env(**kwargs)
        self.fault, self.at, self.steps = fault, at, 0
        self.possible_agents = self.env.possible_agents
        self.metadata = self.env.metadata

    @property
    def agents(self):
        return self.env.agents

    def observation_space(self, agent):
        return self.env.observation_space(agent)

    def action_space(self, agent):
        return self.env.action_space(agent)

    def reset(self, seed=None, options=None):
        return self.env.reset(seed=seed, options=options)

    def step(self, actions):
        self.steps += 1
        if self.fault == "raise" and self.steps == self.at:
            raise RuntimeError("the env's physics blew up")
        obs, rew, term, trunc, info = self.env.step(actions)
        if self.fault == "nan" and self.steps == self.at:
            obs = {**obs, "agent_0": np.full_like(obs["agent_0"], np.nan)}
        return obs, rew, term, trunc, info

    def close(self):
        self.env.close()


def faulty_tag(fault="nan", at=5, **kwargs):
    return FaultyTag(fault, at, **kwargs)


def tag_roles(agent):
    """simple_tag's agents to policy groups in code (multi_agent.policy_mapping)."""
    return "predator" if agent.startswith("adversary") else "prey"


def tag_roles_raising(agent):
    raise KeyError(f"no role for {agent}")


def tag_roles_unknown(agent):
    return "wolf"


class ReturningSpread(ParallelEnv):
    """mpe2's simple_spread whose `agent_0` leaves at step `at` (no longer listed: relay ends its
    column's episode) and comes back two steps later, mid-episode; the inner env gets a no-op for
    it while it is away."""

    def __init__(self, at, **kwargs):
        self.env = simple_spread_v3.parallel_env(**kwargs)
        self.at, self.steps, self.away = at, 0, False
        self.possible_agents = self.env.possible_agents
        self.metadata = self.env.metadata

    @property
    def agents(self):
        return [a for a in self.env.agents if not (self.away and a == "agent_0")]

    def observation_space(self, agent):
        return self.env.observation_space(agent)

    def action_space(self, agent):
        return self.env.action_space(agent)

    def reset(self, seed=None, options=None):
        self.steps, self.away = 0, False
        return self.env.reset(seed=seed, options=options)

    def step(self, actions):
        self.steps += 1
        obs, rew, term, trunc, info = self.env.step({a: actions.get(a, 0) for a in self.env.agents})
        self.away = self.at <= self.steps < self.at + 2
        return obs, rew, term, trunc, info

    def close(self):
        self.env.close()


def returning_spread(at=3, **kwargs):
    return ReturningSpread(at, **kwargs)
