"""The config sections registry entries declare beside their own code, assembled from the
registries: an algorithm's `learner.<name>` (`Algorithm.settings`), a model kind's `model.<name>`
(`ModelKind.settings`), a tracker's `metrics.<name>` (its module's `Settings`). Checked and
resolved before a run starts (preflight), listed by `relay validate --help-config`, swept like any
other leaf.

The config contract carries such a section as a plain mapping (`contracts/config.py`,
`EntrySection`), so a config means the same in every process whatever it imported. Here, where the
registries are, each section is validated by its entry's class and stored resolved (its defaults
filled, the configured algorithm's and model kind's sections added), so a run's config.yaml
states every setting. A new entry with settings therefore edits nothing here.
"""

from __future__ import annotations

from typing import Any

from ..contracts.config import ConfigError, EntrySection, RelayConfig, config_leaves, entry_section
from ..learner.algorithms import ALGORITHMS
from ..policy.models import MODEL_KINDS
from ..services.tracking import TRACKERS, tracker_module


def entry_sections() -> dict[str, type[EntrySection]]:
    """{"learner.grpo": GrpoSettings, "metrics.mlflow": ..., ...}: every registered entry's section
    (read at call time: a registry may gain an entry after import, as in a user's script)."""
    out: dict[str, type[EntrySection]] = {
        f"learner.{name}": algo.settings for name, algo in ALGORITHMS.items() if algo.settings is not None
    }
    out.update({f"model.{name}": k.settings for name, k in MODEL_KINDS.items() if k.settings is not None})
    out.update({f"metrics.{name}": tracker_module(name).Settings for name in TRACKERS})
    return out


def all_leaves() -> list[tuple[str, Any, str]]:
    """(path, default, description) of every leaf, the entry sections' included."""
    return config_leaves(sections=entry_sections())


def _owner(where: str, name: str) -> str:
    """What a section `where.name` that no entry declares is, in words."""
    if where == "learner" and name in ALGORITHMS:
        return f"learner.{name}: the {name} algorithm has no settings of its own"
    if where == "model" and name in MODEL_KINDS:
        return f"model.{name}: the {name} model kind has no settings of its own"
    return f"{where}.{name}: unknown key (check the spelling)"


def resolve_sections(cfg: RelayConfig) -> None:
    """Validate every entry section of `cfg` by its entry's class and store it resolved; the
    configured algorithm's and model kind's sections, where they declare one, are added with
    their defaults. A tracker's null section stays null (off). ConfigError naming every problem
    at once."""
    sections = entry_sections()
    problems: list[str] = []
    resolved: list[tuple[Any, str, dict[str, Any]]] = []
    chosen = {"learner": cfg.learner.algo, "model": cfg.model.kind}  # sections added with defaults
    for where, parent in (("learner", cfg.learner), ("model", cfg.model), ("metrics", cfg.metrics)):
        names = list(parent.model_extra or {})
        name = chosen.get(where)
        if name is not None and f"{where}.{name}" in sections and name not in names:
            names.append(name)
        for name in names:
            settings = sections.get(f"{where}.{name}")
            if settings is None:
                problems.append(_owner(where, name))
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
