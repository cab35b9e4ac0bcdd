"""Sampling fixed-shape [T, N] segments with the newest weights: the sampler for a config.

The layout comes from the algorithm: continuing episodes (`continuing.py`, PPO) or one episode per
member of a group (`grouped.py`, GRPO), both on `SamplerCore` (`sampler_core.py`); policy groups
of a multi-agent env run one continuing sampler each (`policy_groups.py`).
`rollout_workers/worker.py` wraps a sampler as a Ray actor; local mode uses one in the driver.
"""

from __future__ import annotations

from ..contracts.algorithm import AlgorithmTraits
from ..contracts.config import RelayConfig
from ..rollout_workers.continuing import ContinuingSampler
from ..rollout_workers.grouped import GroupedSampler
from ..rollout_workers.policy_groups import PolicyGroupsSampler
from ..rollout_workers.sampler_core import SamplerCore


def make_sampler(
    cfg: RelayConfig, traits: AlgorithmTraits, worker_index: int = 0
) -> SamplerCore | PolicyGroupsSampler:
    """The sampler of the layout the configured algorithm (its `traits`) trains on; a parallel env
    split into policy groups has one per group (rollout_workers/policy_groups.py)."""
    if cfg.multi_agent.policies is not None:
        return PolicyGroupsSampler(cfg, traits, worker_index)
    return (GroupedSampler if traits.grouped else ContinuingSampler)(cfg, traits, worker_index)
