"""Update rules: the algorithm registry (`learner.algo`).

A new algorithm is one module with an `Algorithm` subclass plus one line in ALGORITHMS.
"""

from __future__ import annotations

from ...contracts.algorithm import AlgorithmTraits
from ...contracts.config import EntrySection, RelayConfig
from ...contracts.segment import SegmentLayout
from ...contracts.spaces import EnvSpec
from ...learner.algorithms.base import Algorithm, Batch
from ...learner.algorithms.grpo import GRPO
from ...learner.algorithms.ppo import PPO
from ...policy.cores import state_size

ALGORITHMS: dict[str, type[Algorithm]] = {
    "ppo": PPO,
    "grpo": GRPO,
}


def algorithm_class(name: str) -> type[Algorithm]:
    """The registered algorithm; ValueError naming the known ones otherwise."""
    if name not in ALGORITHMS:
        raise ValueError(f"learner.algo={name!r} is not an algorithm: choose {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


def learner_sections() -> dict[str, type[EntrySection]]:
    """The `learner.<name>` sections an env run may hold: each algorithm's that declares one."""
    return {name: algo.settings for name, algo in ALGORITHMS.items() if algo.settings is not None}


def segment_layout(cfg: RelayConfig, env: EnvSpec) -> SegmentLayout:
    """The exact shape of this run's segments (the algorithm decides grouped or continuing; the
    recurrent core, the state each segment starts from)."""
    algo = algorithm_class(cfg.learner.algo)
    return SegmentLayout(
        cfg.rollout.rollout_len,
        cfg.env.num_envs,
        env,
        grouped=algo.grouped,
        state_size=state_size(cfg.model, algo.critic),
    )


def algorithm_traits(cfg: RelayConfig) -> AlgorithmTraits:
    """What the configured algorithm's rollout workers must know of it."""
    return algorithm_class(cfg.learner.algo).traits()


__all__ = ["ALGORITHMS", "Algorithm", "Batch", "algorithm_class", "algorithm_traits", "segment_layout"]
