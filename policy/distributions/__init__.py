"""Action distributions: the registry by action kind (`ActionSpec.kind`).

A new distribution is one module with an `ActionDistribution` subclass (its torch math and its
numpy acting mirror side by side, tied by tests) plus one line in DISTRIBUTIONS.
"""

from __future__ import annotations

from ...policy.distributions.base import ActionDistribution
from ...policy.distributions.bernoulli import Bernoulli
from ...policy.distributions.categorical import Categorical
from ...policy.distributions.gaussian import DiagGaussian
from ...policy.distributions.multi_categorical import MultiCategorical

DISTRIBUTIONS: dict[str, ActionDistribution] = {
    "discrete": Categorical(),
    "multi_discrete": MultiCategorical(),
    "multi_binary": Bernoulli(),
    "continuous": DiagGaussian(),
}


def distribution(kind: str) -> ActionDistribution:
    """The distribution of an action kind; ValueError naming the known ones otherwise."""
    if kind not in DISTRIBUTIONS:
        raise ValueError(f"no action distribution for {kind!r}: known {', '.join(DISTRIBUTIONS)}")
    return DISTRIBUTIONS[kind]


__all__ = ["DISTRIBUTIONS", "ActionDistribution", "distribution"]
