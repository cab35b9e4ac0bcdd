"""Sampling fixed-shape [T, N] segments with the newest weights: the sampler for a config.

The layout comes from the algorithm: continuing episodes (`continuing.py`, PPO) or one episode per
member of a group (`grouped.py`, GRPO), both on `SamplerCore` (`sampler_core.py`).
`rollout_workers/worker.py` wraps a sampler as a Ray actor; local mode uses one in the driver.
"""

from __future__ import annotations

from contracts.algorithm import AlgorithmTraits
from contracts.config import RelayConfig
from rollout_workers.continuing import ContinuingSampler
from rollout_workers.grouped import GroupedSampler
from rollout_workers.sampler_core import SamplerCore


def make_sampler(cfg: RelayConfig, traits: AlgorithmTraits, worker_index: int = 0) -> SamplerCore:
    """The sampler of the layout the configured algorithm (its `traits`) trains on."""
    return (GroupedSampler if traits.grouped else ContinuingSampler)(cfg, traits, worker_index)
