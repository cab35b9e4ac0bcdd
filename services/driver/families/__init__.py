"""The families of runs, a registry: `env` (a policy in an env), `language` (a causal LM on
prompts) and `preference` (a reward model on preference pairs). Everything that differs between
them is a field of their entry (`base.Family`): the preflight past the config, the algorithms
`learner.algo` names, the backend, what a checkpoint must match to be resumed, the learner's
precision, the export formats. A config's family is its model kind's (`contracts/config.py`
MODEL_FAMILIES), so shared modules ask the entry, never which family they run.

A new family is one module with a `Family` and one line here (and its model kinds' line in
MODEL_FAMILIES).
"""

from __future__ import annotations

from typing import Any

from ....contracts.checkpoint import Checkpoint
from ....contracts.config import ENV_FAMILY, LANGUAGE_FAMILY, PREFERENCE_FAMILY, RelayConfig
from ....contracts.spaces import EnvSpec
from ....services.driver.families import env, language, preference
from ....services.driver.families.base import Family
from ....services.runs.checkpoints import ResumeError

FAMILIES: dict[str, Family] = {
    ENV_FAMILY: env.FAMILY,
    LANGUAGE_FAMILY: language.FAMILY,
    PREFERENCE_FAMILY: preference.FAMILY,
}


def family(cfg: RelayConfig) -> Family:
    """The entry of the config's family."""
    return FAMILIES[cfg.family]


def backend_class(cfg: RelayConfig) -> type[Any]:
    """The class of the backend that trains `cfg` (its family's)."""
    return family(cfg).backend(cfg)


def make_backend(cfg: RelayConfig, spec: EnvSpec | None) -> Any:
    """The run's backend (`backend_class`), given what preflight returned; Ray must be initialized
    for one with actors."""
    return backend_class(cfg)(cfg, spec)


def check_resumable(cfg: RelayConfig, spec: EnvSpec | None, ckpt: Checkpoint, name: str) -> None:
    """ResumeError (one line) where the merged config cannot continue `ckpt`: a checkpoint of the
    other family, or what the config's family requires of its checkpoints."""
    if ckpt.family != cfg.family:
        saved = (ckpt.config.get("model") or {}).get("kind")
        raise ResumeError(
            f"{name} was trained by a {ckpt.family} run (model.kind={saved}); the config trains "
            f"model.kind={cfg.model.kind}, a {cfg.family} run"
        )
    family(cfg).check_resumable(cfg, spec, ckpt, name)


__all__ = ["FAMILIES", "Family", "backend_class", "check_resumable", "family", "make_backend"]
