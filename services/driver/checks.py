"""Checks every family's preflight shares (`services/driver/preflight.py` runs them, each
family's entry in `services/driver/families/` adds its own): the error they raise, where the
learner runs, and the weight wire."""

from __future__ import annotations

import os

from ...contracts.config import RelayConfig
from ...policy import weight_wires
from ...policy.models import model_kind

GB = 1 << 30


class PreflightError(ValueError):
    """The config is valid but cannot run here (one line, exit 2)."""


def registry_problems(lookups: list[tuple[object, str]]) -> list[str]:
    """The ValueError line of each registry lookup `(lookup, name)` that fails."""
    problems = []
    for lookup, name in lookups:
        try:
            lookup(name)  # type: ignore[operator]
        except ValueError as err:
            problems.append(str(err))
    return problems


def wire_problems(cfg: RelayConfig) -> list[str]:
    """The weight wire is registered, and exact where the policy acts from float32 weights."""
    try:
        wire = weight_wires.wire_for(cfg)
    except ValueError as err:
        return [str(err)]
    if wire.exact or not model_kind(cfg.model.kind).exact_weights:
        return []
    exact = ", ".join(name for name, w in weight_wires.WIRES.items() if w.exact)
    return [
        f"learner.weight_wire={weight_wires.wire_name(cfg)} rounds the weights: an env policy acts "
        f"from float32 weights (its numpy mirror, its normalizer statistics); choose {exact}"
    ]


def runs_here(cfg: RelayConfig, address: str | None) -> bool:
    """True when the learner runs on this machine: local mode, or a local Ray this command starts."""
    return cfg.rollout.num_workers == 0 or not (address or os.environ.get("RAY_ADDRESS"))
