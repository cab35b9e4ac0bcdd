"""Sampling fixed-shape [T, N] segments with the newest weights: the registry of rollout layouts.

A layout is a class that says which runs it serves (`serves(cfg, traits)`) and samples them:
- `policy_groups.py`: a multi-agent env split into policy groups, one continuing sampler per group
  around one joint env (`multi_agent.policies`);
- `grouped.py`: one whole episode per member of a group (an algorithm whose traits say grouped, GRPO);
- `continuing.py`: episodes that run on across segments (PPO), multi-agent columns included.
SAMPLERS is tried in order; the first layout that serves the run samples it. A new layout is one
module with a class that has `serves` and the `Sampler` calls, plus one line in SAMPLERS.
`rollout_workers/worker.py` wraps a sampler as a Ray actor; local mode uses one in the driver.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np
import torch

from ..contracts.algorithm import AlgorithmTraits
from ..contracts.config import RelayConfig
from ..contracts.segment import Sampled
from ..contracts.spaces import EnvSpec
from ..rollout_workers.continuing import ContinuingSampler
from ..rollout_workers.grouped import GroupedSampler
from ..rollout_workers.policy_groups import PolicyGroupsSampler


class Sampler(Protocol):
    """What a rollout worker (and local mode) calls on its sampler."""

    spec: EnvSpec
    version: int

    @property
    def seed_stream(self) -> int: ...
    def reseed(self, stream: int) -> None: ...
    def set_weights(self, version: int, weights: Mapping[str, torch.Tensor | np.ndarray]) -> None: ...
    def sample(self) -> Sampled: ...
    def close(self) -> None: ...


class Layout(Protocol):
    """A registry entry: the sampler class of one rollout layout."""

    @staticmethod
    def serves(cfg: RelayConfig, traits: AlgorithmTraits) -> bool: ...
    def __call__(self, cfg: RelayConfig, traits: AlgorithmTraits, worker_index: int = 0) -> Sampler: ...


# Tried in order: the most particular layout first, the one that serves any run last.
SAMPLERS: dict[str, Layout] = {
    "policy_groups": PolicyGroupsSampler,
    "grouped": GroupedSampler,
    "continuing": ContinuingSampler,
}


def layout_of(cfg: RelayConfig, traits: AlgorithmTraits) -> str:
    """The name of the first layout in SAMPLERS that serves this run and its algorithm's traits."""
    for name, cls in SAMPLERS.items():
        if cls.serves(cfg, traits):
            return name
    raise ValueError(f"no rollout layout serves learner.algo={cfg.learner.algo}")


def make_sampler(cfg: RelayConfig, traits: AlgorithmTraits, worker_index: int = 0) -> Sampler:
    """One worker's sampler, of the layout the run takes (`layout_of`)."""
    return SAMPLERS[layout_of(cfg, traits)](cfg, traits, worker_index)
