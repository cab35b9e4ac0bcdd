"""The continuing layout (PPO): envs run on across segments; a truncated step bootstraps from
V(final obs).

A fault never reaches the learner: the failed step is masked, the step before it is cut
(truncated, bootstrapped from V of the last good observation) and the env is reset (or rebuilt,
when it raised); the run goes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..contracts.algorithm import AlgorithmTraits
from ..contracts.config import RelayConfig
from ..contracts.segment import Fields, Segment
from ..rollout_workers.env_guard import Step
from ..rollout_workers.multi_agent import ACTIVE_KEY, STATS_KEY
from ..rollout_workers.observations import select_rows
from ..rollout_workers.sampler_core import SamplerCore


def reported_episodes(info: dict[str, Any]) -> dict[int, tuple[float, int]]:
    """{env: (return, length)} of the true episodes that ended in this step, from the final infos
    of a SAME_STEP vector env (gymnasium's RecordEpisodeStatistics convention)."""
    final = info.get("final_info") or {}
    stats, ended = final.get("episode"), final.get("_episode")
    if stats is None or ended is None:
        return {}
    return {int(i): (float(stats["r"][i]), int(stats["l"][i])) for i in np.flatnonzero(ended)}


@dataclass
class Sampling:
    """A segment being sampled: its arrays, its noise [T, N, ...], the episodes that finished in it
    ((returns, lengths)) and the other statistics of episodes that did ((name, value))."""

    seg: Segment
    noise: np.ndarray
    episodes: tuple[list[float], list[int]] = field(default_factory=lambda: ([], []))
    stats: list[tuple[str, float]] = field(default_factory=list)


class ContinuingSampler(SamplerCore):
    """`sample` is `begin`, then (`act`, the env's step, `observe`) T times, then `end`: policy
    groups (rollout_workers/policy_groups.py) run those phases for each group around one step of
    their joint env."""

    autoreset = True

    @staticmethod
    def serves(cfg: RelayConfig, traits: AlgorithmTraits) -> bool:
        """Any run: episodes run on across segments."""
        return True

    @torch.no_grad()
    def sample(self) -> Segment:
        sampling = self.begin()
        for t in range(self.cfg.rollout.rollout_len):
            self.observe(sampling, t, self.envs.step(self.act(sampling, t)))
        return self.end(sampling)

    def begin(self) -> Sampling:
        return Sampling(self.layout.allocate(), self._draw_segment_noise())

    def act(self, sampling: Sampling, t: int) -> np.ndarray:
        """Act for step t and record it; the actions in the env's terms [N, ...]."""
        act = self._act_and_record(sampling.seg, t, self._obs, sampling.noise[t])
        return self._env_actions(act[0])

    def observe(self, sampling: Sampling, t: int, step: Step | None) -> None:
        """Record what step t did (None: the env raised and was rebuilt)."""
        seg = sampling.seg
        if step is None:  # every env's chain ends here
            self._cut_before(seg, t, np.ones(self.cfg.env.num_envs, dtype=bool))
            self._carry_state(seg, t)
            n = self.cfg.env.num_envs
            self._obs = self.envs.reset(seed=self._seeds(1_000 * (self.envs.total_faults + 1), n))
            return
        terminated, truncated = step.terminated, step.truncated
        cut = truncated & ~terminated
        seg["rewards"][t] = step.reward
        seg["terminated"][t] = terminated
        seg["truncated"][t] = cut
        seg["mask"][t] = 1.0 if step.ok is None else step.ok
        active = step.info.get(ACTIVE_KEY)  # a multi-agent env's columns that really stepped
        if active is not None:
            seg["mask"][t] *= active
        sampling.stats += step.info.get(STATS_KEY, ())
        if cut.any():
            seg["bootstrap_value"][t] = self._bootstrap(cut, step.info)
        self._note_returns(t, step.reward, terminated | truncated)
        self._track_episodes(step.reward, terminated | truncated, step.info, sampling.episodes)
        next_obs = step.obs
        if step.ok is not None:  # rare: some envs returned NaN/inf; their step is dropped
            next_obs = self._reset_bad_envs(seg, t, ~step.ok, next_obs)
        self._carry_state(seg, t)
        self._obs = next_obs

    def end(self, sampling: Sampling) -> Segment:
        seg = sampling.seg
        seg["last_value"] = self.fast.value(self._inputs(self._obs))
        for name, value in sampling.stats:
            seg.episode_stats.setdefault(name, []).append(value)
        return self._finish(seg, *sampling.episodes)

    def _bootstrap(self, truncated: np.ndarray, info: dict[str, Any]) -> np.ndarray:
        """V(final obs) for the envs whose episode was truncated in this step; 0 elsewhere [N]."""
        out = np.zeros(truncated.shape[0], dtype=np.float32)
        idx = np.flatnonzero(truncated)
        final = self.reader.stack([self.reader.read_final(info, int(i)) for i in idx])
        out[idx] = self.fast.value(self._stepped_inputs(final, idx))
        return out

    def _track_episodes(
        self, reward: np.ndarray, done: np.ndarray, info: dict[str, Any], out: tuple[list[float], list[int]]
    ) -> None:
        """Finished episodes' return and length: the sampler's own accounting, or where the env
        reports the true episodes itself (`reports_episodes`), those."""
        self._ep_return += reward
        self._ep_len += 1
        if not done.any():
            return
        reported = reported_episodes(info) if self.reports_episodes else None
        for i in map(int, np.flatnonzero(done)):
            if reported is None:
                out[0].append(float(self._ep_return[i]))
                out[1].append(int(self._ep_len[i]))
            elif i in reported:
                out[0].append(reported[i][0])
                out[1].append(reported[i][1])
        self._ep_return[done] = 0.0
        self._ep_len[done] = 0

    def _cut_before(self, seg: Segment, t: int, envs: np.ndarray) -> None:
        """Step t of `envs` is lost: end their chain at t-1, bootstrapping from V(obs_t)."""
        seg["mask"][t, envs] = 0.0
        if t > 0:
            prev_ok = (seg["mask"][t - 1, envs] > 0) & (seg["terminated"][t - 1, envs] == 0)
            seg["truncated"][t - 1, envs] = np.maximum(seg["truncated"][t - 1, envs], prev_ok)
            seg["bootstrap_value"][t - 1, envs] = np.where(prev_ok, seg["values"][t, envs], 0.0)
        self._ep_return[envs] = 0.0
        self._ep_len[envs] = 0

    def _reset_bad_envs(self, seg: Segment, t: int, bad: np.ndarray, next_obs: Fields) -> Fields:
        self._cut_before(seg, t, bad)
        reset_obs = self.envs.reset(options={"reset_mask": bad})
        return select_rows(next_obs, bad, reset_obs)
