"""A turn-based PettingZoo game (AECEnv) as a vector env: E copies, one column each.

The column is the learning policy's seat, which alternates every game (it learns to move first and
second). The other seats are played by `Opponents` between the seat's moves, so one vector step is
the seat's move and everything until its next turn: the step's reward is what the seat received
meanwhile, and the game's end is known in the step that caused it (no reward arrives after the
transition it belongs to has been recorded). A game that ends resets in the same step (SAME_STEP
autoreset); its outcome for the seat (win 1, draw 0.5, loss 0, from the sign of the seat's return)
is reported as `win_rate_<opponent kind>` in info[STATS_KEY].
"""

from __future__ import annotations

from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from ...rollout_workers.multi_agent.common import (
    ACTIVE_KEY,
    STATS_KEY,
    Build,
    ColumnsVectorEnv,
    played_agents,
    same_spaces,
)


class Opponents(Protocol):
    """Who plays the other seats: `draw(e)` picks the opponent of copy e's next game and returns
    its kind ("pool", "random", "self": scored as win_rate_<kind>, "self" not at all);
    `act(e, obs)` is its move for copy e's observation."""

    def draw(self, e: int) -> str: ...

    def act(self, e: int, obs: Any) -> Any: ...


class RandomOpponents:
    """A uniformly random player that keeps to the action mask where the observation has one
    ("action_mask" of a Dict observation, as PettingZoo's classic games give it)."""

    def __init__(self, space: gym.Space, seed: int = 0) -> None:
        self.space = space
        self.rng = np.random.default_rng(seed)

    def draw(self, e: int) -> str:
        return "random"

    def act(self, e: int, obs: Any) -> Any:
        mask = obs.get("action_mask") if isinstance(obs, dict) else None
        if mask is not None and isinstance(self.space, gym.spaces.Discrete) and np.any(mask):
            allowed = np.flatnonzero(np.asarray(mask).reshape(-1) > 0)
            return int(self.space.start + allowed[self.rng.integers(len(allowed))])
        self.space.seed(int(self.rng.integers(2**31)))
        return self.space.sample()


class TurnBasedVectorEnv(ColumnsVectorEnv):
    """E = num_envs copies of an AECEnv; the seat plays agents matching multi_agent.agents."""

    api = "aec"
    described = "a turn-based (AEC) game"
    one_seat = True
    pettingzoo_class = "AECEnv"

    def __init__(self, b: Build) -> None:
        make, first, num_envs, ma, autoreset = b.make, b.first, b.num_envs, b.ma, b.autoreset
        self.seats = played_agents(list(first.possible_agents), ma.agents, every=False)
        copies = [first] + [make() for _ in range(num_envs - 1)]
        self._setup(copies, num_envs, same_spaces(first, self.seats), autoreset)
        self.opponents: Opponents = b.opponents or RandomOpponents(self.single_action_space)
        self._games = np.zeros(num_envs, dtype=np.int64)  # games begun per copy (the seat rotates)
        self._seat = [self.seats[0]] * num_envs
        self._kind = ["random"] * num_envs  # the opponent kind of each copy's game
        self._return = np.zeros(num_envs, dtype=np.float64)  # the seat's return this game
        self._over = np.zeros(num_envs, dtype=bool)

    def attach(self, opponents: Opponents) -> None:
        """Play the other seats with `opponents` from the next game on."""
        self.opponents = opponents

    # ---- games ------------------------------------------------------------------------------------
    def _game_over(self, e: int) -> bool:
        env, seat = self.envs[e], self._seat[e]
        return not env.agents or bool(env.terminations.get(seat, False) or env.truncations.get(seat, False))

    def _others_play(self, e: int) -> float:
        """Opponents move until it is the seat's turn or the game is over; the seat's reward meanwhile."""
        env, seat, got = self.envs[e], self._seat[e], 0.0
        while not self._game_over(e) and env.agent_selection != seat:
            agent = env.agent_selection
            if env.terminations.get(agent, False) or env.truncations.get(agent, False):
                env.step(None)  # AEC's rule: a finished agent is stepped with None
            else:
                env.step(self.opponents.act(e, env.observe(agent)))
            got += float(env.rewards.get(seat, 0.0))
        return got

    def _new_game(self, e: int, seed: int | None) -> None:
        env = self.envs[e]
        env.reset(seed=seed)
        self._seat[e] = self.seats[int(self._games[e]) % len(self.seats)]
        self._games[e] += 1
        self._kind[e] = self.opponents.draw(e)
        self._return[e] = self._others_play(e)
        self._over[e] = self._game_over(e)  # an opponent may end it first (never in the usual games)
        self._obs[e] = env.observe(self._seat[e])

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        mask = (options or {}).get("reset_mask")
        for e in range(self.num_envs) if mask is None else np.flatnonzero(mask):
            copy_seed = (
                seed[e] if isinstance(seed, list | tuple) else None if seed is None else int(seed) + int(e)
            )
            self._new_game(int(e), copy_seed)
        return self._batch(), {}

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        N = self.num_envs
        reward = np.zeros(N, dtype=np.float64)
        terminated = np.zeros(N, dtype=bool)
        truncated = np.zeros(N, dtype=bool)
        active = ~self._over
        final_obs = np.full(N, None, dtype=object)
        stats: list[tuple[str, float]] = []
        for e, action in enumerate(np.asarray(actions)):  # [N, ...]: one array for every action kind
            if self._over[e]:  # over before the seat moved: a new game (autoreset), else until reset
                if self.autoreset:
                    self._new_game(e, None)
                continue
            env, seat = self.envs[e], self._seat[e]
            env.step(action)
            got = float(env.rewards.get(seat, 0.0)) + self._others_play(e)
            reward[e] = got
            self._return[e] += got
            self._obs[e] = env.observe(seat)
            if not self._game_over(e):
                continue
            terminated[e] = bool(env.terminations.get(seat, False))
            truncated[e] = not terminated[e]
            final_obs[e] = self._obs[e]
            if self._kind[e] != "self":
                score = 1.0 if self._return[e] > 0 else 0.5 if self._return[e] == 0 else 0.0
                stats.append((f"win_rate_{self._kind[e]}", score))
            self._over[e] = True
            if self.autoreset:
                self._new_game(e, None)
        info: dict[str, Any] = {ACTIVE_KEY: active.copy(), STATS_KEY: stats}
        ended = terminated | truncated
        if ended.any():
            info["final_obs"], info["_final_obs"] = final_obs, ended
        return self._batch(), reward, terminated, truncated, info
