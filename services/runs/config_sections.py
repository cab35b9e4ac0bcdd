"""The config sections registry entries declare beside their own code, assembled from the
registries: a learner entry's `learner.<name>` (an env algorithm's `Algorithm.settings`; a
language run's `learner.lm`, its estimator's and its policy loss's), a model kind's
`model.<name>` (`ModelKind.settings`), a tracker's `metrics.<name>` (its module's `Settings`).
Checked and resolved before a run starts (preflight), listed by `relay validate --help-config`,
swept like any other leaf.

The config contract carries such a section as a plain mapping (`contracts/config.py`,
`EntrySection`), so a config means the same in every process whatever it imported. Here, where the
registries are, each section is validated by its entry's class and stored resolved (its defaults
filled, the sections of the entries the config chose added), so a run's config.yaml states every
setting. A new entry with settings therefore edits nothing here. Which learner entries a run may
configure is its family's: `learner.grpo` means the language GRPO estimator's settings in a
language run, and nothing (an error, not a silent no-op) in an env run, whose GRPO has none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...contracts.config import (
    ENV_FAMILY,
    LANGUAGE_FAMILY,
    PREFERENCE_FAMILY,
    ConfigError,
    EntrySection,
    RelayConfig,
    config_leaves,
    entry_section,
)
from ...learner import algorithms
from ...learner.lm import reward_model
from ...learner.lm import settings as lm
from ...policy.models import MODEL_KINDS
from ...services.tracking import TRACKERS, tracker_module

# Each family's learner sections ({name: settings}) and the ones a config of it reads.
LEARNER_SECTIONS: dict[
    str, tuple[Callable[[], dict[str, type[EntrySection]]], Callable[[RelayConfig], list[str]]]
] = {
    ENV_FAMILY: (algorithms.learner_sections, lambda cfg: [cfg.learner.algo]),
    LANGUAGE_FAMILY: (lm.learner_sections, lm.chosen_sections),
    PREFERENCE_FAMILY: (reward_model.learner_sections, lambda cfg: [cfg.learner.algo]),
}


def entry_sections(family: str | None = None) -> dict[str, type[EntrySection]]:
    """{"learner.lm": LmSettings, "metrics.mlflow": ..., ...}: every registered entry's section,
    the learner's of `family` (None: of every family, for the help and sweeps' listings). Read at
    call time: a registry may gain an entry after import, as in a user's script."""
    out: dict[str, type[EntrySection]] = {}
    for name, (sections, _chosen) in LEARNER_SECTIONS.items():
        if family is None or name == family:
            out.update({f"learner.{k}": v for k, v in sections().items()})
    out.update({f"model.{name}": k.settings for name, k in MODEL_KINDS.items() if k.settings is not None})
    out.update({f"metrics.{name}": tracker_module(name).Settings for name in TRACKERS})
    return out


def all_leaves() -> list[tuple[str, Any, str]]:
    """(path, default, description) of every leaf, the entry sections' included."""
    return config_leaves(sections=entry_sections())


def _owner(cfg: RelayConfig, where: str, name: str) -> str:
    """What a section `where.name` that no entry of the run's family declares is, in words."""
    if where == "learner" and name in algorithms.ALGORITHMS and name == cfg.learner.algo:
        return f"learner.{name}: the {name} algorithm has no settings of its own"
    if where == "learner" and f"learner.{name}" in entry_sections():
        return (
            f"learner.{name}: runs of model.kind={cfg.model.kind} have no such section (another family "
            "of runs has it)"
        )
    if where == "model" and name in MODEL_KINDS:
        return f"model.{name}: the {name} model kind has no settings of its own"
    return f"{where}.{name}: unknown key (check the spelling)"


def resolve_sections(cfg: RelayConfig) -> None:
    """Validate every entry section of `cfg` by its entry's class and store it resolved; the
    sections of the entries the config chose (its learner entries, its model kind), where they
    declare one, are added with their defaults. A tracker's null section stays null (off).
    ConfigError naming every problem at once."""
    sections = entry_sections(cfg.family)
    problems: list[str] = []
    resolved: list[tuple[Any, str, dict[str, Any]]] = []
    chosen = {"learner": LEARNER_SECTIONS[cfg.family][1](cfg), "model": [cfg.model.kind]}
    for where, parent in (("learner", cfg.learner), ("model", cfg.model), ("metrics", cfg.metrics)):
        names = list(parent.model_extra or {})
        for name in chosen.get(where, []):
            if f"{where}.{name}" in sections and name not in names:
                names.append(name)
        for name in names:
            settings = sections.get(f"{where}.{name}")
            if settings is None:
                problems.append(_owner(cfg, where, name))
                continue
            if where == "metrics" and parent.entry_data(name) is None:
                continue
            try:
                found = entry_section(parent, where, name, settings)
            except ConfigError as err:
                problems.append(str(err).removeprefix("invalid config: "))
                continue
            resolved.append((parent, name, found.model_dump(mode="json")))
    if problems:
        raise ConfigError("invalid config: " + "; ".join(problems))
    for parent, name, data in resolved:
        parent.set_entry_data(name, data)
