"""The grouped layout (GRPO): N envs = N/G groups of G members reset with the same seed (one
"prompt"); every member plays one episode per segment and waits as padding (mask 0) once done, so
shapes never change; `outcome` [N] holds each member's episodic return.

Faults are handled by the same guard as the continuing layout, and cost only the member they hit:
a member whose step was not finite, or whose copy raised (and was rebuilt alone), has every step of
its episode masked and its episode not reported; its group's advantages are taken over the members
left (learner/losses.py `group_relative_advantages`' `valid`). Only a backend whose whole vector env
raised (EnvPool) loses every member's episode: the rest of that segment is padding.
"""

from __future__ import annotations

import numpy as np
import torch

from ..contracts.algorithm import AlgorithmTraits
from ..contracts.config import RelayConfig
from ..contracts.segment import Segment
from ..rollout_workers.sampler_core import SamplerCore


class GroupedSampler(SamplerCore):
    autoreset = False  # members finish at different steps and wait as padding; resets are ours

    @staticmethod
    def serves(cfg: RelayConfig, traits: AlgorithmTraits) -> bool:
        """An algorithm that compares whole episodes within groups (its traits say grouped)."""
        return traits.grouped

    def __init__(self, cfg: RelayConfig, traits: AlgorithmTraits, worker_index: int = 0) -> None:
        self.group_size = cfg.learner.group_size
        super().__init__(cfg, traits, worker_index)

    def reseed(self, stream: int) -> None:
        super().reseed(stream)
        # One "prompt" seed per group per segment, from its own stream.
        self._prompts = np.random.default_rng(self._seeds(20_000, 1)[0])

    @torch.no_grad()
    def sample(self) -> Segment:
        """An episode still running after T steps is cut there (flagged truncated) and scored by its
        return so far."""
        T, N, G = self.cfg.rollout.rollout_len, self.cfg.env.num_envs, self.group_size
        seg = self.layout.allocate()
        noise = self._draw_segment_noise()
        group_seeds = self._prompts.integers(0, 2**31 - 1, N // G)
        obs = self.envs.reset(seed=[int(group_seeds[i // G]) for i in range(N)])
        self.reset_state()  # every member starts an episode
        active = np.ones(N, dtype=bool)
        dropped = np.zeros(N, dtype=bool)
        ret = np.zeros(N, dtype=np.float64)
        length = np.zeros(N, dtype=np.int64)
        for t in range(T):
            if not active.any():
                break  # the rest of the segment stays zero padding
            act = self._act_and_record(seg, t, obs, noise[t])
            step = self.envs.step(self._env_actions(act[0]))
            if step is None:  # the env raised; the rebuilt env starts afresh: no episode survives
                dropped[:] = True
                break
            seg["mask"][t] = active
            seg["rewards"][t] = step.reward * active
            seg["terminated"][t] = step.terminated & active
            seg["truncated"][t] = step.truncated & ~step.terminated & active
            ret += step.reward * active
            length += active
            done = step.terminated | step.truncated
            if step.ok is not None:  # a faulted member loses its own episode, not its group's
                dropped |= ~step.ok & active
                done = done | ~step.ok
            active &= ~done & ~dropped
            self._carry_state(seg, t)
            obs = step.obs
            if done.any():
                # Finished members idle in fresh episodes whose steps are masked out.
                obs = self.envs.reset(options={"reset_mask": done})
        if active.any():
            seg["truncated"][T - 1] = np.maximum(seg["truncated"][T - 1], active)
        if dropped.any():
            self._drop(seg, dropped, ret)
        seg["outcome"] = ret.astype(np.float32)
        seg["last_value"] = np.zeros(N, dtype=np.float32)  # critic-free: nothing to bootstrap
        kept = np.flatnonzero(~dropped)
        return self._finish(seg, [float(ret[i]) for i in kept], [int(length[i]) for i in kept])

    @staticmethod
    def _drop(seg: Segment, members: np.ndarray, ret: np.ndarray) -> None:
        """Mask every step of `members` [N] bool: their outcomes are not an episode's return."""
        for name in ("mask", "rewards", "terminated", "truncated"):
            seg[name][:, members] = 0.0
        ret[members] = 0.0
