"""Advantage estimators of a language run: `learner.algo` names one.

A new estimator is one module with an `AdvantageEstimator` and one line in ESTIMATORS (or
`ESTIMATORS["name"] = ...` from a user's script before the run starts): its settings then appear
under `learner.<name>` in `relay validate --help-config`, sweeps and config.yaml, and its metric
keys in the sinks and dashboards.
"""

from __future__ import annotations

from ....learner.lm.estimators import grpo, reinforce_pp, rloo
from ....learner.lm.estimators.base import AdvantageEstimator, Estimate, RoundRewards

ESTIMATORS: dict[str, AdvantageEstimator] = {
    "grpo": grpo.ESTIMATOR,
    "rloo": rloo.ESTIMATOR,
    "reinforce_pp": reinforce_pp.ESTIMATOR,
}


def estimator(name: str) -> AdvantageEstimator:
    """The registered estimator; ValueError naming the known ones otherwise."""
    if name not in ESTIMATORS:
        raise ValueError(
            f"learner.algo={name!r} is not an advantage estimator of a language run: choose "
            f"{', '.join(ESTIMATORS)}"
        )
    return ESTIMATORS[name]


__all__ = ["ESTIMATORS", "AdvantageEstimator", "Estimate", "RoundRewards", "estimator"]
