"""What a family of runs is to the driver: everything that differs between training a policy in
an env and training a language model on prompts, so no shared module asks which one it runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ....contracts.checkpoint import Checkpoint
from ....contracts.config import RelayConfig
from ....contracts.spaces import EnvSpec


@dataclass(frozen=True)
class Family:
    """One family of runs (`contracts/config.py` MODEL_FAMILIES says which model kind is whose).

    algorithms: its `learner.algo` names (read when asked: a registry may grow);
    config_problems: its registry names and its chosen entries' rules, each one line;
    check: its preflight past the config (reads its inputs, builds nothing that lasts): the env
      spec its runs act in, or None for a family without an env;
    precision: what its learner computes in, in words, for `relay validate`;
    backend: the backend class that trains a config of it (`services/driver/loop.py` Backend);
    check_resumable: ResumeError where a config cannot continue a checkpoint of it;
    export_formats: what `relay export --format` writes of its checkpoints;
    panels: the dashboard's charts for its runs, by id, in order (None: every chart of the
      catalog, in its order); x_axis: the key its charts are drawn against, and its name;
    memory: its learner's memory per device, estimated, in words (None: no estimate), for
      `relay validate` and the start of a run."""

    algorithms: Callable[[], list[str]]
    config_problems: Callable[[RelayConfig], list[str]]
    check: Callable[[RelayConfig, str | None], EnvSpec | None]
    precision: Callable[[RelayConfig, Any, str | None], str]
    backend: Callable[[RelayConfig], type[Any]]
    check_resumable: Callable[[RelayConfig, Any, Checkpoint, str], None]
    export_formats: tuple[str, ...]
    panels: tuple[str, ...] | None = None
    x_axis: tuple[str, str] = ("env_steps", "env steps")
    memory: Callable[[RelayConfig], str | None] = lambda cfg: None
