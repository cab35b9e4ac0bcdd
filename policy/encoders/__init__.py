"""Observation encoders: the registry (`model.encoders`), the rule that picks one per leaf, and the
module that turns a tree observation into the trunk's input features.

A new encoder is one module with a `LeafEncoder` subclass plus one line in ENCODERS.

The rule, per leaf (overridable per path in `model.encoders`): a uint8 3-D Box large enough for
the Nature CNN -> `nature_cnn`; Discrete and MultiDiscrete -> `one_hot`; MultiBinary -> `binary`;
any other Box -> `flat` (normalized); `minigrid` (MiniGrid's symbolic view) is chosen by name only,
since its ids are only MiniGrid's by convention. The features are the flat leaves, concatenated and
normalized, then every other leaf's encoding in leaf order: [B, out_dim].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from ...contracts.spaces import EnvSpec, ObsLeaf
from ...policy.encoders.base import LeafEncoder
from ...policy.encoders.binary import BinaryEncoder
from ...policy.encoders.cnn import CnnEncoder, image_layout
from ...policy.encoders.flat import FlatEncoder
from ...policy.encoders.minigrid import MiniGridEncoder
from ...policy.encoders.one_hot import OneHotEncoder

ENCODERS: dict[str, LeafEncoder] = {
    "flat": FlatEncoder(),
    "one_hot": OneHotEncoder(),
    "binary": BinaryEncoder(),
    "nature_cnn": CnnEncoder(),
    "minigrid": MiniGridEncoder(),
}


def default_encoder(leaf: ObsLeaf) -> str:
    """The rule (module docstring)."""
    if leaf.kind in ("discrete", "multi_discrete"):
        return "one_hot"
    if leaf.kind == "multi_binary":
        return "binary"
    return "nature_cnn" if image_layout(leaf) is not None else "flat"


@dataclass(frozen=True)
class EncoderPlan:
    """Which encoder reads each leaf, in leaf order: (leaf, encoder name)."""

    leaves: tuple[tuple[ObsLeaf, str], ...]

    @property
    def flat(self) -> tuple[ObsLeaf, ...]:
        """The normalized leaves, in order: their concatenation is what the normalizer sees."""
        return tuple(leaf for leaf, name in self.leaves if ENCODERS[name].normalized)

    @property
    def others(self) -> tuple[tuple[ObsLeaf, str], ...]:
        return tuple((leaf, name) for leaf, name in self.leaves if not ENCODERS[name].normalized)

    @property
    def flat_dim(self) -> int:
        return sum(leaf.numbers for leaf in self.flat)

    @property
    def out_dim(self) -> int:
        return self.flat_dim + sum(ENCODERS[name].out_dim(leaf) for leaf, name in self.others)

    @property
    def numpy_mirror(self) -> bool:
        return all(ENCODERS[name].numpy_mirror for _, name in self.leaves)


def encoder_plan(env: EnvSpec, overrides: Mapping[str, str]) -> EncoderPlan:
    """Each leaf's encoder: `overrides` by path, else the rule. ValueError (one line) for an
    unknown name, a path the env lacks, or an encoder that cannot read its leaf."""
    paths = {leaf.path for leaf in env.obs_leaves}
    unknown = [p for p in overrides if p not in paths]
    if unknown:
        raise ValueError(
            f"model.encoders names {unknown[0]!r}, not a leaf of the observation "
            f"(leaves: {', '.join(repr(p) for p in sorted(paths))})"
        )
    plan = []
    for leaf in env.obs_leaves:
        name = overrides.get(leaf.path) or default_encoder(leaf)
        if name not in ENCODERS:
            raise ValueError(
                f"model.encoders[{leaf.path!r}]={name!r} is not an encoder: choose {', '.join(ENCODERS)}"
            )
        problem = ENCODERS[name].problem(leaf)
        if problem:
            raise ValueError(
                f"model.encoders[{leaf.path!r}]={name}: {problem}, and {leaf.path!r} is a "
                f"{leaf.kind} {list(leaf.shape)}"
            )
        plan.append((leaf, name))
    return EncoderPlan(tuple(plan))


class ObsEncoder(nn.Module):
    """Input fields ({"obs/<path>": [B, *leaf]}) -> features [B, out_dim] float32, the flat leaves
    through `normalizer` (the policy's, so its statistics keep their place in the state dict)."""

    def __init__(self, plan: EncoderPlan) -> None:
        super().__init__()
        self.plan = plan
        self.flat_fields = [leaf.field for leaf in plan.flat]
        self.other_fields = [leaf.field for leaf, _ in plan.others]
        modules = [ENCODERS[name].module(leaf) for leaf, name in plan.others]
        # Keys are positions: leaf paths may hold characters a module name cannot.
        self.encoders = nn.ModuleList(m if m is not None else nn.Identity() for m in modules)
        self.out_dim = plan.out_dim

    def forward(self, inputs: Mapping[str, Tensor], normalizer: nn.Module) -> Tensor:
        parts = []
        if self.flat_fields:
            batch = inputs[self.flat_fields[0]].shape[0]
            flat = torch.cat([inputs[f].reshape(batch, -1).float() for f in self.flat_fields], dim=-1)
            parts.append(normalizer(flat))
        parts += [enc(inputs[f]).float() for f, enc in zip(self.other_fields, self.encoders, strict=True)]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def flat_obs(plan: EncoderPlan, fields: Mapping[str, np.ndarray], batch: int) -> np.ndarray | None:
    """The flat leaves of `batch` rows, concatenated in float32 [batch, flat_dim] (what the
    normalizer reads and its statistics are gathered from), or None when there are none."""
    if not plan.flat:
        return None
    return np.concatenate(
        [fields[leaf.field].reshape(batch, -1).astype(np.float32, copy=False) for leaf in plan.flat], axis=-1
    )


def np_encode_others(plan: EncoderPlan, fields: Mapping[str, np.ndarray], batch: int) -> list[np.ndarray]:
    """The numpy mirror of every non-normalized leaf's encoder, in order."""
    return [
        ENCODERS[name].np_encode(leaf, fields[leaf.field].reshape(batch, *leaf.shape))
        for leaf, name in plan.others
    ]


__all__ = [
    "ENCODERS",
    "EncoderPlan",
    "LeafEncoder",
    "ObsEncoder",
    "default_encoder",
    "encoder_plan",
    "flat_obs",
    "normalizer_input",
    "np_encode_others",
]


def normalizer_input(
    env: EnvSpec, plan: EncoderPlan | None, fields: Mapping[str, np.ndarray], batch: int
) -> np.ndarray | None:
    """What the observation normalizer reads of `batch` rows of input fields, float32 [batch, D]:
    a plain Box observation flattened, a tree's flat leaves concatenated (None when it has none)."""
    if not env.structured:
        return fields["obs"].reshape(batch, -1).astype(np.float32, copy=False)
    assert plan is not None
    return flat_obs(plan, fields, batch)
