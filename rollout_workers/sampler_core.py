"""What every sampler shares: the guarded vector env (one fault handling for all layouts), the
CPU copy of the policy, seeds and exploration noise, recording and finishing a segment. No Ray here.
"""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import numpy as np
import torch

from ..contracts.algorithm import AlgorithmTraits
from ..contracts.config import RelayConfig
from ..contracts.segment import Fields, Segment, SegmentLayout, state_resets
from ..policy.actor_critic import STATE, draw_noise
from ..policy.cores import state_size
from ..policy.encoders import encoder_plan, normalizer_input
from ..policy.models import build_policy
from ..policy.normalizer import Moments
from ..policy.numpy_mirror import Acted, cpu_policy
from ..rollout_workers.env_guard import GuardedVectorEnv
from ..rollout_workers.envs import env_actions, env_seeds, env_spec, needs_reset_info
from ..rollout_workers.group_envs import GroupEnvs
from ..rollout_workers.multi_agent import MULTI_AGENT_APIS, attach_opponents, columns_of
from ..rollout_workers.observations import ObsReader
from ..rollout_workers.preprocess import preprocessor
from ..rollout_workers.self_play import SelfPlayOpponents
from ..rollout_workers.vector_backends import make_vector_env


class SamplerCore:
    """Owns one vector env of N envs and a CPU copy of the policy; `sample()` returns a Segment.

    Exploration noise comes from a CPU generator seeded by (run seed, worker index, seed stream),
    so a run reproduces bit for bit whatever device the learner uses.
    """

    autoreset = True

    def __init__(
        self,
        cfg: RelayConfig,
        traits: AlgorithmTraits,
        worker_index: int = 0,
        envs: GuardedVectorEnv | GroupEnvs | None = None,
        salt: int = 0,
    ) -> None:
        """`envs`: a policy group's view of a joint env (rollout_workers/group_envs.py), whose
        columns this sampler acts for, in place of a vector env of its own; `salt` keeps a
        group's seeds (exploration noise) apart from the other groups' of the same worker."""
        self.cfg = cfg
        self.worker_index = worker_index
        self.salt = salt
        self.opponents: SelfPlayOpponents | None = None  # a turn-based game's other seats
        self.envs = envs if envs is not None else GuardedVectorEnv(self._make_envs, worker_index)
        obs_space, space = self.envs.single_observation_space, self.envs.single_action_space
        info = self.envs.reset_info(cfg.env.seed) if needs_reset_info(cfg.env, space) else None
        self.spec = env_spec(obs_space, space, cfg.env, info, multi_agent=columns_of(self.envs.env))
        if self.spec.multi_agent is not None and traits.grouped:
            raise ValueError(
                f"learner.algo={cfg.learner.algo} samples groups of whole episodes: not multi-agent envs"
            )
        self.reader = ObsReader(self.spec, cfg.env.num_envs, value_inputs=True)
        self.envs.read_with(self.reader)
        self.plan = encoder_plan(self.spec, cfg.model.encoders) if self.spec.structured else None
        self.layout = SegmentLayout(
            cfg.rollout.rollout_len,
            cfg.env.num_envs,
            self.spec,
            traits.grouped,
            state_size=state_size(cfg.model, traits.critic),
        )
        self.reports_episodes = preprocessor(cfg.env.preprocess).reports_episodes
        # [T, N] discounted returns of the segment's steps, for reward scaling's statistics.
        self._returns = (
            np.zeros((cfg.rollout.rollout_len, cfg.env.num_envs)) if cfg.env.normalize_reward else None
        )
        torch.manual_seed(cfg.env.seed)
        # MLPs act through numpy with the same weights (tied to the torch forward by a test).
        self.fast = cpu_policy(cfg.model, build_policy(cfg, self.spec, traits.critic))
        if self.spec.multi_agent is not None and MULTI_AGENT_APIS[self.spec.multi_agent].one_seat:
            self._bind_opponents(traits)
        # A recurrent policy's state per env [N, S], carried from step to step and segment to
        # segment; zeroed where an episode starts (contracts.segment.state_resets).
        self._state: np.ndarray | None = None
        self._stepped: np.ndarray | None = None  # the state after the step being taken, before resets
        self.version = -1
        self.reseed(0)

    def _make_envs(self) -> gym.vector.VectorEnv:
        """The vector env (rebuilt after a fault); a turn-based game's with this sampler's opponents."""
        envs = make_vector_env(self.cfg.env, autoreset=self.autoreset, ma=self.cfg.multi_agent)
        if self.opponents is not None:
            attach_opponents(envs, self.opponents)
        return envs

    def _bind_opponents(self, traits: AlgorithmTraits) -> None:
        """A turn-based game's other seats: snapshots of this policy, a random player, or the
        current weights (rollout_workers/self_play.py)."""
        if self.layout.state_size:
            raise ValueError("model.recurrent: a turn-based game's opponents play without a recurrent state")
        obs_space, space = self.envs.single_observation_space, self.envs.single_action_space
        self.opponents = SelfPlayOpponents(obs_space, space, self.cfg.env.seed)  # reseed() seeds it
        self.opponents.bind(
            self.spec,
            self.fast,
            lambda: cpu_policy(self.cfg.model, build_policy(self.cfg, self.spec, traits.critic)),
            self.cfg.multi_agent.self_play,
        )
        if isinstance(self.envs, GuardedVectorEnv):  # a game's seats: never a policy group's view
            attach_opponents(self.envs.env, self.opponents)

    def _seeds(self, offset: int, count: int) -> list[int]:
        return env_seeds(self.cfg.env.seed, offset + self.worker_index + self.salt, count, self.seed_stream)

    def reseed(self, stream: int) -> None:
        """Restart env seeds and exploration noise from seed stream `stream`.

        Stream 0 is a fresh run's. A resumed run continues on another stream, and a restarted
        worker on a fresh one, so neither replays the data the run already trained on.
        """
        self.seed_stream = stream
        n = self.cfg.env.num_envs
        if self.opponents is not None:
            self.opponents.reseed(self._seeds(20_000, 1)[0])
        self.noise = torch.Generator().manual_seed(self._seeds(10_000, 1)[0])
        self._obs = self.envs.reset(seed=self._seeds(0, n))
        self._ep_return = np.zeros(n, dtype=np.float64)
        self._ep_len = np.zeros(n, dtype=np.int64)
        self._discounted = np.zeros(n, dtype=np.float64)  # env.normalize_reward's return process
        self.reset_state()

    def reset_state(self) -> None:
        """Every env's recurrent state back to an episode's start (zeros); nothing without a core."""
        if self.layout.state_size:
            self._state = np.zeros((self.cfg.env.num_envs, self.layout.state_size), dtype=np.float32)

    def _inputs(self, obs: Fields) -> Fields:
        """The policy's input fields for the current step: the observation, plus the state."""
        return obs if self._state is None else {**obs, STATE: self._state}

    def _stepped_inputs(self, obs: Fields, rows: np.ndarray | slice = slice(None)) -> Fields:
        """Input fields for observations that follow the step just taken (a truncated episode's
        final observation, the next segment's first), in `rows`: the state after that step."""
        return obs if self._stepped is None else {**obs, STATE: self._stepped[rows]}

    def _carry_state(self, seg: Segment, t: int) -> None:
        """Step t is recorded: the state after it goes on, zeroed where the step ended an episode
        or was lost (the rule the learner replays with)."""
        if self._stepped is None:
            return
        resets = state_resets(seg["terminated"][t], seg["truncated"][t], seg["mask"][t])
        self._state = np.where(resets[:, None], np.float32(0.0), self._stepped)
        self._stepped = None

    def set_weights(self, version: int, weights: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        """Load a published policy version (normalizer statistics ride along); tensors or arrays."""
        self.fast.load(weights)
        self.version = version
        if self.opponents is not None:
            self.opponents.observe_weights(version, weights)

    def _env_actions(self, actions: np.ndarray) -> np.ndarray:
        return env_actions(self.spec.action, self.envs.single_action_space, actions)

    def _draw_segment_noise(self) -> np.ndarray:
        """Noise for every step of a segment, [T, N] or [T, N, A], in one draw.

        From the seeded torch CPU generator: the same bits whatever runs the network.
        """
        T, N = self.cfg.rollout.rollout_len, self.cfg.env.num_envs
        flat = draw_noise(self.spec.action, T * N, self.noise).numpy()
        return flat.reshape(T, N, *flat.shape[1:])

    def _act_and_record(self, seg: Segment, t: int, obs: Fields, noise: np.ndarray) -> Acted:
        """Act on the input fields (each [N, ...]) and record step t; before stepping, which
        overwrites their buffers."""
        if self._state is not None and t == 0:
            seg["initial_state"][:] = self._state
        act = self.fast.act(self._inputs(obs), noise)
        self._stepped = act[3]
        for name, arr in obs.items():
            seg.arrays[name][t] = arr
        seg["actions"][t] = act[0]
        seg["logp"][t] = act[1]
        seg["values"][t] = act[2]
        return act

    def _finish(self, seg: Segment, returns: list[float], lengths: list[int]) -> Segment:
        seg.weights_version = self.version
        seg.worker_index = self.worker_index
        seg.episode_returns = returns
        seg.episode_lengths = lengths
        seg.env_steps = int(seg["mask"].sum())
        seg.env_faults = self.envs.take_faults()
        valid = seg["mask"].reshape(-1) > 0
        if self.cfg.model.normalize_obs and valid.any():
            normalized = normalizer_input(self.spec, self.plan, seg.arrays, valid.shape[0])
            if normalized is not None:
                seg.obs_moments = Moments.of(torch.from_numpy(normalized[valid])).to_numpy()
        if self.spec.global_state and self.cfg.model.normalize_obs and valid.any():
            states = seg["global_state"].reshape(-1, self.spec.global_state)[valid]
            seg.global_moments = Moments.of(torch.from_numpy(states)).to_numpy()
        if self._returns is not None and valid.any():
            seg.return_moments = Moments.of(torch.from_numpy(self._returns.reshape(-1, 1)[valid])).to_numpy()
        return seg

    def _note_returns(self, t: int, reward: np.ndarray, done: np.ndarray) -> None:
        """Step t of the discounted-return process G = gamma * G + r, restarted at episode ends
        (env.normalize_reward's statistics: the scale of the returns the critic learns)."""
        if self._returns is None:
            return
        self._discounted = self._discounted * self.cfg.learner.gamma + reward
        self._returns[t] = self._discounted
        self._discounted[done] = 0.0

    def sample(self) -> Segment:
        """One Segment of exactly [T, N] (contracts/segment.py), plus finished-episode statistics."""
        raise NotImplementedError

    def close(self) -> None:
        self.envs.close()
