"""Sampling a parallel env played by policy groups (multi_agent.policies): one continuing sampler
per group, stepping one joint env together.

Each group's sampler is an ordinary `ContinuingSampler` for its group's config and spec
(contracts/policy_groups.py) over its view of the joint env (rollout_workers/group_envs.py): it
keeps its own policy, noise, recurrent state and episode accounting, and fills its own
fixed-shape [T, N_g] segment. Each step, every group acts on its columns, the joint env steps
once with all their actions, and every group records its part, so one env step is data for every
group. `sample()` returns {group: Segment}; the learner (learner/policy_groups.py) gives each
segment to its group's learner.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from ..contracts.algorithm import AlgorithmTraits
from ..contracts.config import RelayConfig
from ..contracts.policy_groups import group_config, group_versions, part_of
from ..contracts.segment import Segment
from ..contracts.spaces import EnvSpec
from ..rollout_workers.continuing import ContinuingSampler
from ..rollout_workers.envs import columns_spec
from ..rollout_workers.group_envs import JointEnvs
from ..rollout_workers.vector_backends import make_vector_env

GROUP_SALT = 1_000_000  # between groups' seed offsets (worker indices stay far below it)


class PolicyGroupsSampler:
    """The samplers of every policy group of one rollout worker, around one joint env."""

    @staticmethod
    def serves(cfg: RelayConfig, traits: AlgorithmTraits) -> bool:
        """A multi-agent env whose agents are split into policy groups (multi_agent.policies)."""
        return cfg.multi_agent.policies is not None

    def __init__(self, cfg: RelayConfig, traits: AlgorithmTraits, worker_index: int = 0) -> None:
        if traits.grouped:
            raise ValueError(
                f"learner.algo={cfg.learner.algo} samples groups of whole episodes: not multi-agent envs"
            )
        self.cfg = cfg
        self.joint = JointEnvs(lambda: make_vector_env(cfg.env, ma=cfg.multi_agent), worker_index)
        self.spec: EnvSpec = columns_spec(self.joint.env, cfg.env)
        self.samplers = {
            name: ContinuingSampler(
                group_config(cfg, self.spec, name),
                traits,
                worker_index,
                envs=self.joint.views[name],
                salt=GROUP_SALT * k,
            )
            for k, name in enumerate(self.spec.policy_names)
        }
        self.version = -1

    @property
    def seed_stream(self) -> int:
        return next(iter(self.samplers.values())).seed_stream

    def reseed(self, stream: int) -> None:
        """Every group continues on seed stream `stream` (the first resets the joint env)."""
        for sampler in self.samplers.values():
            sampler.reseed(stream)

    def set_weights(self, version: int, weights: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        """Every group's weights out of the joined mapping, loaded where its version is new."""
        versions = group_versions(weights)
        for name, sampler in self.samplers.items():
            if versions[name] != sampler.version:
                sampler.set_weights(versions[name], part_of(weights, name))
        self.version = version

    @torch.no_grad()
    def sample(self) -> dict[str, Segment]:
        """One [T, N_g] segment per group, from T steps of the joint env."""
        sampling = {name: s.begin() for name, s in self.samplers.items()}
        for t in range(self.cfg.rollout.rollout_len):
            actions = {name: s.act(sampling[name], t) for name, s in self.samplers.items()}
            steps = self.joint.step(actions)
            for name, s in self.samplers.items():
                s.observe(sampling[name], t, None if steps is None else steps[name])
        return {name: s.end(sampling[name]) for name, s in self.samplers.items()}

    def close(self) -> None:
        self.joint.close()
