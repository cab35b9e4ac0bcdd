"""What a model kind (`model.kind`) provides: its trunk, its config rules and its env check.

Each kind is one module (`mlp.py`, `transformer.py`, ...) with a subclass of `ModelKind`, listed
once in `policy/models/__init__.py`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..contracts.config import ENV_FAMILY, EntrySection, RelayConfig, entry_section
from ..contracts.metrics import MetricKeys
from ..contracts.spaces import EnvSpec


class TrunkModule(nn.Module):
    """A policy trunk: observations -> features [B, out_dim]. `checkpointing` recomputes its
    activations in backward (gradient checkpointing) while training."""

    out_dim: int
    checkpointing: bool
    # A centralized critic's value trunk that reads the global state alone (S floats), not the
    # trunk input beside it (`ModelKind.value_trunk_factory`).
    reads_state_only: bool = False

    def synthetic_input(self, batch: int, obs_shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
        """[batch, *obs_shape] float inputs this trunk accepts, for checks that have no env
        (verify, the importer's cross-check): standard normals unless a kind reads something else."""
        return torch.randn(batch, *obs_shape, generator=generator)


class ModelKind:
    """A policy trunk family. `numpy_mirror`: rollout workers may act through the numpy mirror of
    the MLP forward pass (`policy/numpy_mirror.py`) instead of the torch model. `reads_global_state`:
    its kind builds a value trunk that reads the env's global state (`value_trunk_factory`)."""

    numpy_mirror = False
    # It builds a value trunk that reads the env's global state (a centralized critic).
    reads_global_state = False
    # The family of runs the kind trains in (contracts/config.py MODEL_FAMILIES says the same).
    family = ENV_FAMILY
    # The weight wire `learner.weight_wire: auto` means for it (policy/weight_wires.py), and
    # whether its policy acts from float32 weights (then only an exact wire may carry them: the
    # numpy mirror, the normalizer statistics).
    default_wire = "arrays"
    exact_weights = True
    # keys the runs of this kind add to the metrics line (services/runs/metric_keys.py)
    metrics = MetricKeys({})
    # its own settings, under `model.<its registry name>` (None: none beyond model's)
    settings: type[EntrySection] | None = None

    def settings_of(self, cfg: RelayConfig) -> EntrySection:
        """This kind's section of a config that uses it (`model.<model.kind>`), validated, its
        defaults filled (ConfigError naming the leaf otherwise)."""
        assert self.settings is not None, f"model.kind={cfg.model.kind} declares no settings"
        return entry_section(cfg.model, "model", cfg.model.kind, self.settings)

    def run_source(self, cfg: RelayConfig) -> str:
        """What a run of this kind trains on, for its default run name: the env id."""
        return cfg.env.id

    def config_problems(self, cfg: RelayConfig) -> list[str]:
        """Rules of this kind's settings, each naming fields and numbers (none by default)."""
        return []

    def env_problem(self, cfg: RelayConfig, env: EnvSpec) -> str | None:
        """Why this kind cannot read the env's observations, or None when it can (by default any
        plain Box, and trees through the encoders)."""
        return None

    def trunk_factory(self, cfg: RelayConfig, env: EnvSpec, in_dim: int) -> Callable[[], TrunkModule]:
        """A callable building one trunk: observations [B, obs_dim] (normalized) or [B, *obs_shape]
        (raw), or a tree observation's encoded features [B, in_dim], -> features [B, out_dim],
        with `out_dim` and `checkpointing` attributes. `in_dim` is the width of what it reads
        flat (env.obs_dim for a plain Box)."""
        raise NotImplementedError

    def value_trunk_factory(self, cfg: RelayConfig, env: EnvSpec, in_dim: int) -> Callable[[], TrunkModule]:
        """A centralized critic's value trunk (`reads_global_state` kinds): by default this kind's
        trunk over the flat trunk input with the global state beside it, [B, in_dim + S]."""
        return self.trunk_factory(cfg, env, in_dim + env.global_state)
