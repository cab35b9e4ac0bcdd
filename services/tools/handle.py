"""The policy handle: what `relay export` and `relay verify` work with, whatever file it came from.

A torch ActorCritic, the env spec it was built for, the run's config when the file carried one
(as data), and the post-processing its source applies to actions (identity for relay, ML-Agents'
clip for imports).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import psutil
import torch
from torch import Tensor, nn

from ...contracts.config import RelayConfig
from ...contracts.segment import Fields, as_fields
from ...contracts.spaces import EnvSpec, ObsLeaf
from ...policy.actor_critic import STATE
from ...policy.distributions import distribution
from ...policy.models import ActorCritic

RELAY_CONFIG_KEY = "relay_config"  # ONNX metadata: the resolved config of the run that trained the graph
RELAY_ENV_KEY = "relay_env"  # ONNX metadata: the env spec (observation shape, dtype, bounds; actions)


class PolicyLoadError(ValueError):
    """The file is not a policy relay can load (one line, exit 2)."""


def identity(actions: Tensor) -> Tensor:
    return actions


@dataclass
class PolicyHandle:
    model: ActorCritic
    source: str
    env: EnvSpec
    config: RelayConfig | None = None
    action_transform: Callable[[Tensor], Tensor] = identity
    group: str | None = None  # the policy group of a run of policy groups (multi_agent.policies)
    # A group's scene-mates: the other groups' policies of the same checkpoint, which play their
    # agents where this one is evaluated or its observations are recorded.
    others: dict[str, PolicyHandle] = field(default_factory=dict)

    @property
    def obs_dim(self) -> int:
        return self.env.obs_dim

    def nonfinite_weights(self) -> str | None:
        """Where the model's weights are NaN or inf ("'pi_head.weight': 3 of 130 values"), or None."""
        for name, tensor in self.model.state_dict().items():
            if tensor.is_floating_point():
                bad = int((~torch.isfinite(tensor)).sum())
                if bad:
                    return f"{name!r}: {bad} of {tensor.numel()} values are NaN or inf"
        return None

    @property
    def obs_shape(self) -> tuple[int, ...]:
        return self.env.obs_shape

    @property
    def input_names(self) -> list[str]:
        """The policy's inputs, in order: "obs" (a plain Box), or "obs/<path>" per leaf of a tree,
        then "action_mask" where the env has masks, then "h_in" (the state entering the step) for
        a recurrent policy. The exported graph's inputs are these."""
        names = [leaf.field for leaf in self.env.obs_leaves]
        names += ["action_mask"] if self.env.action_mask is not None else []
        return names + ([STATE] if self.recurrent else [])

    @property
    def recurrent(self) -> bool:
        return self.model.recurrent

    def initial_state(self, batch: int) -> np.ndarray:
        """The state an episode starts acting from: zeros [batch, acting_state_size]."""
        return np.zeros((batch, self.model.acting_state_size), dtype=np.float32)

    def as_input(self, obs: Fields | np.ndarray, with_state: bool = True) -> Fields:
        """Input fields (a bare array is a plain observation) in the dtypes the policy reads:
        uint8 frames, int64 choices, bool masks, float32 else; without the state "h_in" when not
        `with_state` (a request's, before its session's state joins it). KeyError names a missing
        input."""
        fields = as_fields(obs)
        dtypes = {leaf.field: leaf.storage_dtype for leaf in self.env.obs_leaves}
        dtypes["action_mask"] = np.dtype(np.bool_)
        dtypes[STATE] = np.dtype(np.float32)
        names = [n for n in self.input_names if with_state or n != STATE]
        return {name: np.asarray(fields[name]).astype(dtypes[name], copy=False) for name in names}

    def check_fits(self, batch: int) -> None:
        """PolicyLoadError, before anything is allocated, when `batch` observations (and the
        two float64 copies of them) would not fit in the
        memory this machine has free: the sizes come from a file, or from --batch."""
        need = 2 * 8 * batch * max(self.obs_dim, 1)
        free = psutil.virtual_memory().available
        if need > free:
            raise PolicyLoadError(
                f"{self.source}: {batch} observations of shape {self.obs_shape} need about "
                f"{need / 2**30:.1f} GB; this machine has {free / 2**30:.1f} GB free"
            )

    def synthetic_obs(self, batch: int, generator: torch.Generator) -> dict[str, Tensor]:
        """Input fields [batch, ...] the policy accepts: standard normals; uint8 noise frames for
        an image policy; for a token policy random contexts (ids in its vocabulary, a random
        number of slots filled, -1 after); for a tree, each leaf its own way (choices in range,
        bits); masks allowing each choice with probability 0.7."""
        self.check_fits(batch)
        if not self.env.structured:
            if self.env.storage_dtype == np.uint8:
                obs = torch.randint(0, 256, (batch, *self.obs_shape), generator=generator, dtype=torch.uint8)
            else:
                obs = self.model.synthetic_obs(batch, self.obs_shape, generator)
            out = {"obs": obs}
        else:
            out = {leaf.field: synthetic_leaf(leaf, batch, generator) for leaf in self.env.obs_leaves}
        if self.env.action_mask is not None:
            out["action_mask"] = torch.rand(batch, self.env.action.param_size, generator=generator) < 0.7
        if self.recurrent:  # states a core meets: tanh-bounded h, c of either sign
            out[STATE] = torch.randn(batch, self.model.acting_state_size, generator=generator) * 0.5
        return out

    @property
    def continuous(self) -> bool:
        return self.model.action.floats


def synthetic_leaf(leaf: ObsLeaf, batch: int, generator: torch.Generator) -> Tensor:
    """[batch, *leaf.shape] values a leaf can hold, in its storage dtype."""
    shape = (batch, *leaf.shape)
    if leaf.kind in ("discrete", "multi_discrete"):
        nvec = torch.tensor(leaf.nvec, dtype=torch.float64).reshape(leaf.shape)
        return (torch.rand(shape, generator=generator, dtype=torch.float64) * nvec).long()
    if leaf.kind == "multi_binary" or leaf.dtype == "uint8":
        high = 2 if leaf.kind == "multi_binary" else 256
        return torch.randint(0, high, shape, generator=generator, dtype=torch.uint8)
    return torch.randn(shape, generator=generator)


def concat_fields(batches: list[Fields]) -> Fields:
    """Batches of input fields, one after the other."""
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def rows_of(fields: Fields) -> int:
    return len(next(iter(fields.values())))


class DeterministicPolicy(nn.Module):
    """The exported graph: the policy's inputs (`PolicyHandle.input_names`: observation leaves
    in their dtypes, the action mask) -> (action, ...), with the normalizer (or the CNN's /255) and
    the encoders folded in.

    A recurrent policy also takes "h_in" [B, S] and returns "h_out" [B, S] last: the state
    entering and leaving the step (the caller carries it, zeros at an episode's start).

    `action` is what the env takes, [B, *env action shape]: the greedy allowed choice per component
    from the space's start (the env's own where env.actions keeps some of them; int64), bits with
    p > 0.5 (int64), or the mean after the source's action transform (float32). Continuous actions
    add `mean` and `std` [B, A]; the others `logits` [B, param_size] (as the head outputs them,
    unmasked).
    """

    offsets: Tensor | None  # the env's first choice per component, where it is not 0
    choices: Tensor | None  # the env's action for each choice, where env.actions keeps some

    def __init__(self, handle: PolicyHandle) -> None:
        super().__init__()
        self.model = handle.model
        self.transform = handle.action_transform
        self.names = handle.input_names
        spec = handle.env.action
        self.env_shape = spec.env_shape
        self.register_buffer(
            "offsets", torch.from_numpy(spec.offsets) if spec.start else None, persistent=False
        )
        self.register_buffer(  # env.actions: the env's action for each of the policy's choices
            "choices",
            torch.tensor(spec.choices, dtype=torch.long) if spec.choices else None,
            persistent=False,
        )

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        fields = dict(zip(self.names, inputs, strict=True))
        params, state = self.model.policy_step(fields)
        carried = () if state is None else (state,)
        if distribution(self.model.action.kind).learned_log_std:  # mean and std, as ML-Agents exports
            std = self.model.log_std.exp().expand_as(params)
            action = self.transform(params)
            if self.env_shape:
                action = action.reshape(-1, *self.env_shape)
            return action, params, std, *carried
        action = self.model.dist.deterministic(self.model.action, params, fields.get("action_mask"))
        if self.offsets is not None:
            action = action + self.offsets
        if self.choices is not None:
            action = self.choices[action]
        if self.env_shape:
            action = action.reshape(-1, *self.env_shape)
        return action, params, *carried


def output_names(handle: PolicyHandle) -> list[str]:
    names = ["action", "mean", "std"] if handle.continuous else ["action", "logits"]
    return names + (["h_out"] if handle.recurrent else [])
