"""Sampling fixed-shape [T, N] segments from a vector env with the newest weights. No Ray here.

`rollout_workers/worker.py` wraps this as a Ray actor; local mode uses it in the driver.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from learner.learner import EnvSpec, build_policy
from learner.normalizer import Moments
from rollout_workers.cpu_policy import cpu_policy
from rollout_workers.envs import action_spec, env_seeds, make_vector_env
from services.config import RelayConfig

Segment = dict[str, Any]
log = logging.getLogger(__name__)


class SegmentSampler:
    """Owns one vector env of N envs and a CPU copy of the policy; `sample()` returns a Segment.

    Exploration noise comes from a CPU generator seeded by (run seed, worker index, seed stream),
    so a run reproduces bit for bit whatever device the learner uses.
    """

    def __init__(self, cfg: RelayConfig, worker_index: int = 0) -> None:
        self.cfg = cfg
        self.worker_index = worker_index
        ec = cfg.env
        self.grouped = cfg.learner.algo == "grpo"
        self.group_size = cfg.learner.group_size
        self.env_errors = 0
        self.env = self._make_env()
        obs_shape = tuple(self.env.single_observation_space.shape or ())
        self.spec = EnvSpec(obs_shape=obs_shape, action=action_spec(self.env.single_action_space))
        space = self.env.single_action_space
        self._low = getattr(space, "low", None)
        self._high = getattr(space, "high", None)
        torch.manual_seed(ec.seed)
        # MLPs act through numpy with the same weights (tied to the torch forward by a test).
        self.fast = cpu_policy(cfg.model, build_policy(cfg, self.spec))
        self.version = -1
        self.reseed(0)

    def _seeds(self, offset: int, count: int) -> list[int]:
        return env_seeds(self.cfg.env.seed, offset + self.worker_index, count, self.seed_stream)

    def reseed(self, stream: int) -> None:
        """Restart env seeds, exploration noise and prompts from seed stream `stream`.

        Stream 0 is a fresh run's. A resumed run continues on another stream, and a restarted
        worker on a fresh one, so neither replays the data the run already trained on.
        """
        self.seed_stream = stream
        n = self.cfg.env.num_envs
        self.noise = torch.Generator().manual_seed(self._seeds(10_000, 1)[0])
        # Grouped sampling draws one "prompt" seed per group per segment from its own stream.
        self._prompts = np.random.default_rng(self._seeds(20_000, 1)[0])
        self._obs, _ = self.env.reset(seed=self._seeds(0, n))
        self._ep_return = np.zeros(n, dtype=np.float64)
        self._ep_len = np.zeros(n, dtype=np.int64)

    def _make_env(self) -> Any:
        ec = self.cfg.env
        return make_vector_env(
            ec.id, ec.num_envs, ec.vectorization, ec.max_episode_steps, ec.kwargs, autoreset=not self.grouped
        )

    def set_weights(self, version: int, weights: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        """Load a published policy version (normalizer statistics ride along); tensors or arrays."""
        self.fast.load(weights)
        self.version = version

    def _env_actions(self, actions: np.ndarray) -> np.ndarray:
        a = actions
        if self.spec.action.kind == "continuous" and self._low is not None:
            # The env gets the clipped action; the segment keeps the sampled one so log-probs match.
            a = np.clip(a, self._low, self._high)
        return a

    def _bootstrap(self, truncated: np.ndarray, info: dict[str, Any]) -> np.ndarray:
        """V(final obs) for the envs whose episode was truncated in this step; 0 elsewhere [N]."""
        out = np.zeros(truncated.shape[0], dtype=np.float32)
        idx = np.flatnonzero(truncated)
        final = np.stack([info["final_obs"][i] for i in idx]).astype(np.float32)
        out[idx] = self.fast.value(final)
        return out

    @staticmethod
    def _finite_rows(reward: np.ndarray, obs: np.ndarray) -> np.ndarray | None:
        """None when every env's reward and observation are finite (the fast path), else ok [N]."""
        if np.isfinite(reward).all() and np.isfinite(obs).all():
            return None
        return np.isfinite(reward) & np.isfinite(obs.reshape(len(reward), -1)).all(axis=1)

    def _allocate(self) -> Segment:
        T, N = self.cfg.rollout.rollout_len, self.cfg.env.num_envs
        act = self.spec.action
        extra = {"outcome": np.zeros(N, dtype=np.float32)} if self.grouped else {}
        return {
            **extra,
            "obs": np.zeros((T, N, *self.spec.obs_shape), dtype=np.float32),
            "actions": np.zeros((T, N, *act.shape), dtype=np.int64 if act.kind == "discrete" else np.float32),
            **{
                k: np.zeros((T, N), dtype=np.float32)
                for k in ("logp", "values", "rewards", "bootstrap_value", "terminated", "truncated", "mask")
            },
        }

    def _draw_segment_noise(self) -> np.ndarray:
        """Noise for every step of a segment, [T, N] or [T, N, A], in one draw.

        From the seeded torch CPU generator: the same bits whatever runs the network.
        """
        T, N = self.cfg.rollout.rollout_len, self.cfg.env.num_envs
        flat = self.spec.action.draw_noise(T * N, self.noise).numpy()
        return flat.reshape(T, N, *flat.shape[1:])

    def _record(self, seg: Segment, t: int, obs: np.ndarray, act: tuple[np.ndarray, ...]) -> None:
        actions, logp, value = act
        seg["obs"][t] = obs
        seg["actions"][t] = actions
        seg["logp"][t] = logp
        seg["values"][t] = value

    def _finish(self, seg: Segment, returns: list[float], lengths: list[int]) -> Segment:
        seg["weights_version"] = self.version
        seg["worker_index"] = self.worker_index
        seg["episode_returns"] = returns
        seg["episode_lengths"] = lengths
        seg["env_steps"] = int(seg["mask"].sum())
        seg["env_errors"] = self.env_errors
        valid = seg["mask"].reshape(-1) > 0
        flat = torch.from_numpy(seg["obs"].reshape(-1, *self.spec.obs_shape)[valid])
        seg["obs_moments"] = Moments.of(flat).to_numpy() if flat.shape[0] else {"count": 0}
        return seg

    @torch.no_grad()
    def sample(self) -> Segment:
        """One Segment of exactly [T, N] (DESIGN.md), plus finished-episode statistics."""
        return self._sample_grouped() if self.grouped else self._sample_continuing()

    def _sample_continuing(self) -> Segment:
        """Envs run on across segments; a truncated step bootstraps from V(final obs).

        An env that raises, or returns non-finite observations or rewards, never reaches the
        learner: the failed step is masked, the step before it is cut (truncated, bootstrapped
        from V of the last good observation) and the env is reset; the run goes on.
        """
        seg = self._allocate()
        noise = self._draw_segment_noise()
        episodes: tuple[list[float], list[int]] = ([], [])
        for t in range(self.cfg.rollout.rollout_len):
            obs = self._obs.astype(np.float32, copy=False)
            act = self.fast.act(obs, noise[t])
            self._record(seg, t, obs, act)  # before stepping: the step overwrites obs's buffer
            try:
                next_obs, reward, terminated, truncated, info = self.env.step(self._env_actions(act[0]))
            except Exception as err:  # any env failure is handled the same way
                self._rebuild_env(seg, t, err)
                continue
            ok = self._finite_rows(reward, next_obs)
            if ok is not None:  # rare: some envs returned NaN/inf; their step is dropped below
                reward, terminated, truncated = np.where(ok, reward, 0.0), terminated & ok, truncated & ok
            cut = truncated & ~terminated
            seg["rewards"][t] = reward
            seg["terminated"][t] = terminated
            seg["truncated"][t] = cut
            seg["mask"][t] = 1.0 if ok is None else ok
            if cut.any():
                seg["bootstrap_value"][t] = self._bootstrap(cut, info)
            self._track_episodes(reward, terminated | truncated, episodes)
            if ok is not None:
                next_obs = self._reset_bad_envs(seg, t, ~ok, next_obs)
            self._obs = next_obs
        seg["last_value"] = self.fast.value(self._obs.astype(np.float32))
        return self._finish(seg, *episodes)

    def _track_episodes(
        self, reward: np.ndarray, done: np.ndarray, out: tuple[list[float], list[int]]
    ) -> None:
        self._ep_return += reward
        self._ep_len += 1
        if not done.any():
            return
        for i in np.flatnonzero(done):
            out[0].append(float(self._ep_return[i]))
            out[1].append(int(self._ep_len[i]))
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

    def _reset_bad_envs(self, seg: Segment, t: int, bad: np.ndarray, next_obs: np.ndarray) -> np.ndarray:
        self.env_errors += int(bad.sum())
        log.warning(
            "worker %d: %d env(s) returned non-finite values; resetting them", self.worker_index, bad.sum()
        )
        self._cut_before(seg, t, bad)
        reset_obs, _ = self.env.reset(options={"reset_mask": bad})
        return np.where(bad.reshape(-1, *([1] * (next_obs.ndim - 1))), reset_obs, next_obs)

    def _rebuild_env(self, seg: Segment, t: int, err: Exception) -> None:
        """The vector env raised: its state is unknown, so build a fresh one and reset it."""
        self.env_errors += 1
        log.warning("worker %d: env raised %s: %s; rebuilding it", self.worker_index, type(err).__name__, err)
        self._cut_before(seg, t, np.ones(self.cfg.env.num_envs, dtype=bool))
        with contextlib.suppress(Exception):  # a broken env may fail to close too
            self.env.close()
        self.env = self._make_env()
        self._obs, _ = self.env.reset(seed=self._seeds(1_000 * (self.env_errors + 1), self.cfg.env.num_envs))

    def _sample_grouped(self) -> Segment:
        """GRPO layout: N envs = N/G groups of G members reset with the same seed (one prompt).

        Every member plays one episode; a member that finishes waits as padding (mask 0) until
        the segment ends, and `outcome` [N] holds each member's episodic return. An episode still
        running after T steps is cut there (flagged truncated) and scored by its return so far.
        """
        T, N, G = self.cfg.rollout.rollout_len, self.cfg.env.num_envs, self.group_size
        seg = self._allocate()
        noise = self._draw_segment_noise()
        group_seeds = self._prompts.integers(0, 2**31 - 1, N // G)
        obs, _ = self.env.reset(seed=[int(group_seeds[i // G]) for i in range(N)])
        active = np.ones(N, dtype=bool)
        ret = np.zeros(N, dtype=np.float64)
        length = np.zeros(N, dtype=np.int64)
        for t in range(T):
            if not active.any():
                break  # the rest of the segment stays zero padding
            obs = obs.astype(np.float32, copy=False)
            act = self.fast.act(obs, noise[t])
            self._record(seg, t, obs, act)  # before stepping: the step overwrites obs's buffer
            next_obs, reward, terminated, truncated, _ = self.env.step(self._env_actions(act[0]))
            seg["mask"][t] = active
            seg["rewards"][t] = reward * active
            seg["terminated"][t] = terminated & active
            seg["truncated"][t] = truncated & ~terminated & active
            ret += reward * active
            length += active
            done = terminated | truncated
            active &= ~done
            if done.any():
                # Finished members idle in fresh episodes whose steps are masked out.
                next_obs, _ = self.env.reset(options={"reset_mask": done})
            obs = next_obs
        if active.any():
            seg["truncated"][T - 1] = np.maximum(seg["truncated"][T - 1], active)
        seg["outcome"] = ret.astype(np.float32)
        seg["last_value"] = np.zeros(N, dtype=np.float32)  # critic-free: nothing to bootstrap
        return self._finish(seg, [float(r) for r in ret], [int(n) for n in length])

    def close(self) -> None:
        self.env.close()
