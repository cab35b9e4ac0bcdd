"""Recurrent cores (`model.recurrent`): the registry. A new core is one module with a
`RecurrentCore` subclass plus one line in CORES."""

from __future__ import annotations

from ...contracts.config import ModelConfig, RelayConfig
from ...policy.cores.base import RecurrentCore
from ...policy.cores.gru import GruCore
from ...policy.cores.lstm import LstmCore

# name -> core class, built as cls(in_dim, model.recurrent_size, model.post_core_size)
CORES: dict[str, type[RecurrentCore]] = {"lstm": LstmCore, "gru": GruCore}
NO_CORE = "none"


def core_class(kind: str) -> type[RecurrentCore] | None:
    """The core `model.recurrent` names (None for 'none'); ValueError naming the known ones."""
    if kind == NO_CORE:
        return None
    if kind not in CORES:
        raise ValueError(f"model.recurrent={kind!r} is not a core: choose none, {', '.join(CORES)}")
    return CORES[kind]


def core_count(model: ModelConfig, critic: bool) -> int:
    """Cores a policy holds: one, or two where the value head has its own trunk (and core)."""
    return 2 if critic and not model.shared_trunk else 1


def state_size(model: ModelConfig, critic: bool) -> int:
    """Floats of recurrent state per env the policy carries (0 without a core): what a segment's
    `initial_state` row holds, the policy core's state then the value core's."""
    cls = core_class(model.recurrent)
    return 0 if cls is None else cls.state_per_unit * model.recurrent_size * core_count(model, critic)


def config_problems(cfg: RelayConfig) -> list[str]:
    """The recurrent core's rules, each naming fields and numbers."""
    m, T = cfg.model, cfg.rollout.rollout_len
    if m.recurrent == NO_CORE:
        needs = [f"model.{k}={getattr(m, k)}" for k in ("burn_in", "post_core_size") if getattr(m, k)]
        return [f"{k} needs a recurrent core (model.recurrent)" for k in needs]
    problems = []
    if cfg.learner.minibatch != "sequences":
        problems.append(
            f"model.recurrent={m.recurrent} replays whole segments from their stored state: "
            "set learner.minibatch=sequences"
        )
    if m.burn_in >= T:
        problems.append(
            f"model.burn_in={m.burn_in} leaves no step of a rollout.rollout_len={T} sequence to learn from"
        )
    return problems


__all__ = ["CORES", "NO_CORE", "RecurrentCore", "config_problems", "core_class", "state_size"]
