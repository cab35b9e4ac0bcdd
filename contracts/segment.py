"""The Segment: T steps of N envs as fixed-shape arrays, plus what the round needs to know of them.

One field table (`SEGMENT_FIELDS`) names every array, its shape rule and dtype rule; the sampler
allocates from it, the ring buffer stores from it and validation checks against it, so a new field
is one line here. Shapes never depend on episode lengths: padding is `mask = 0`.

A Segment travels from a rollout worker to the learner through Ray's object store; its arrays are
numpy, which Ray hands over without copying.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..contracts.spaces import PATH_SEP, EnvSpec

ShapeRule = Literal["TN", "N", "TN+obs", "TN+action", "TN+mask", "N+state", "TN+global"]
DtypeRule = Literal["float32", "obs", "action", "bool"]


@dataclass(frozen=True)
class SegmentField:
    name: str
    shape: ShapeRule
    dtype: DtypeRule
    description: str
    grouped_only: bool = False  # present only in grouped (GRPO) segments
    masked_only: bool = False  # present only where the env has action masks
    recurrent_only: bool = False  # present only where the policy has a recurrent core
    global_only: bool = False  # present only where a centralized critic reads the env's global state


SEGMENT_FIELDS: tuple[SegmentField, ...] = (
    SegmentField(
        "obs", "TN+obs", "obs", "observation each action was taken from: one field per leaf of a tree"
    ),
    SegmentField("action_mask", "TN+mask", "bool", "the actions allowed at the step", masked_only=True),
    SegmentField(
        "global_state",
        "TN+global",
        "float32",
        "the env copy's global state at the step, for the value trunk alone (multi_agent.central_critic)",
        global_only=True,
    ),
    SegmentField("actions", "TN+action", "action", "the sampled action (unclipped)"),
    SegmentField("logp", "TN", "float32", "behaviour policy log-prob of the action"),
    SegmentField("values", "TN", "float32", "V(obs) under the behaviour policy (0 without a critic)"),
    SegmentField("rewards", "TN", "float32", "reward of the step"),
    SegmentField("terminated", "TN", "float32", "1 where the episode ended in a terminal state"),
    SegmentField("truncated", "TN", "float32", "1 where the episode was cut (time limit, fault, end)"),
    SegmentField("mask", "TN", "float32", "1 for a valid step, 0 for padding or a lost step"),
    SegmentField("bootstrap_value", "TN", "float32", "V(final obs) where truncated, else 0"),
    SegmentField("last_value", "N", "float32", "V of the observation after the last step"),
    SegmentField("outcome", "N", "float32", "each member's episodic return (GRPO)", grouped_only=True),
    SegmentField(
        "initial_state",
        "N+state",
        "float32",
        "the recurrent core's state entering step 0 (zeros where an episode starts there)",
        recurrent_only=True,
    ),
)
FIELD_NAMES = tuple(f.name for f in SEGMENT_FIELDS)
PER_ENV_FIELDS = tuple(f.name for f in SEGMENT_FIELDS if f.shape in ("N", "N+state"))
# raised: a copy's step raised (it was rebuilt); nonfinite_*: NaN/inf in a step's observation or
# reward (the step is masked); empty_mask: an active env masked every action (relay acts uniformly,
# as documented); unacted_agent: a PettingZoo agent present in a step that relay has no live column
# for (it came back mid-episode, or is not in possible_agents), so no action was given for it.
ENV_FAULT_KINDS = ("raised", "nonfinite_obs", "nonfinite_reward", "empty_mask", "unacted_agent")
# A policy's input fields by Segment field name ("obs", "obs/<path>", "action_mask"), each [B, ...].
Fields = dict[str, np.ndarray]


def as_fields(x: Fields | np.ndarray) -> Fields:
    """A bare array is a plain observation batch, {"obs": x}; fields stay as they are."""
    return {"obs": x} if isinstance(x, np.ndarray) else x


class SegmentRejected(ValueError):
    """A segment that does not fit the layout or holds non-finite numbers."""


@dataclass
class Segment:
    """One sample call's data: `arrays` by field name (see SEGMENT_FIELDS), and its bookkeeping.

    episode_returns / episode_lengths: episodes that finished in it; env_steps: valid steps;
    env_faults: faults since the previous segment of this worker, by kind (ENV_FAULT_KINDS);
    obs_moments: normalizer moments of its valid observations ({"count": 0} when none);
    global_moments: the same of its valid steps' global states (multi_agent.central_critic);
    return_moments: moments of the discounted returns of its valid steps, for reward scaling
    (env.normalize_reward; {"count": 0} otherwise);
    episode_stats: other values of the episodes that finished in it, by name (a multi-agent env's
    team return and per-agent returns, a self-play game's outcome: contracts.metrics.stat_means).
    """

    arrays: dict[str, np.ndarray]
    weights_version: int = -1
    worker_index: int = 0
    incarnation: str = ""
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    env_steps: int = 0
    env_faults: dict[str, int] = field(default_factory=dict)
    obs_moments: dict[str, Any] = field(default_factory=lambda: {"count": 0})
    global_moments: dict[str, Any] = field(default_factory=lambda: {"count": 0})
    return_moments: dict[str, Any] = field(default_factory=lambda: {"count": 0})
    episode_stats: dict[str, list[float]] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        """A field's array; "obs" of a tree observation is the tree itself (nested dicts of the
        leaves' arrays, Tuple positions as "0", "1", ...)."""
        if name == "obs" and name not in self.arrays:
            return obs_tree(self.arrays)
        return self.arrays[name]

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self.arrays[name] = value

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


# What one sample call returns: a Segment, or where the env is split into policy groups
# (multi_agent.policies) one per group, {group: Segment}, each in its group's layout.
Sampled = Segment | dict[str, Segment]


def obs_tree(fields: dict[str, Any]) -> Any:
    """The observation tree of flat fields ("obs", or "obs/<path>" per leaf) as nested dicts."""
    if "obs" in fields:
        return fields["obs"]
    tree: dict[str, Any] = {}
    for name, value in fields.items():
        if not name.startswith("obs" + PATH_SEP):
            continue
        *parents, leaf = name.split(PATH_SEP)[1:]
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return tree


def state_resets(terminated: Any, truncated: Any, mask: Any) -> Any:
    """[T, N] (or [N]) bool, numpy arrays or torch tensors alike: where a recurrent policy's
    state is zeroed after step t (its episode ended, or the step was lost and the env reset).
    Both sides apply this one rule: the rollout worker as it steps, the learner when it replays
    a segment (`starts[t] = resets[t - 1]`)."""
    return (terminated > 0) | (truncated > 0) | (mask <= 0)


def is_policy_input(name: str) -> bool:
    """Whether a Segment field is one a policy reads: an observation leaf, the action mask, or the
    global state its value trunk reads."""
    return name == "obs" or name.startswith("obs" + PATH_SEP) or name in ("action_mask", "global_state")


@dataclass(frozen=True)
class SegmentLayout:
    """The exact shapes and dtypes of a run's segments: T steps of N envs of `env`; `state_size`
    floats of recurrent state per env where the policy has a core (0: none)."""

    rollout_len: int
    num_envs: int
    env: EnvSpec
    grouped: bool = False
    state_size: int = 0

    def fields(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Every array field: name -> (shape, dtype)."""
        tn = (self.rollout_len, self.num_envs)
        shapes: dict[ShapeRule, tuple[int, ...]] = {
            "TN": tn,
            "N": (self.num_envs,),
            "TN+action": tn + self.env.action.shape,
            "TN+mask": (*tn, self.env.action.param_size),
            "N+state": (self.num_envs, self.state_size),
            "TN+global": (*tn, self.env.global_state),
        }
        dtypes: dict[DtypeRule, np.dtype] = {
            "float32": np.dtype(np.float32),
            "action": self.env.action.dtype,
            "bool": np.dtype(np.bool_),
        }
        out = {}
        for f in SEGMENT_FIELDS:
            if (
                (f.grouped_only and not self.grouped)
                or (f.masked_only and self.env.action_mask is None)
                or (f.recurrent_only and not self.state_size)
                or (f.global_only and not self.env.global_state)
            ):
                continue
            if f.shape == "TN+obs":  # one field per leaf, each in its own dtype
                out.update(
                    {leaf.field: (tn + leaf.shape, leaf.storage_dtype) for leaf in self.env.obs_leaves}
                )
            else:
                out[f.name] = (shapes[f.shape], dtypes[f.dtype])
        return out

    def allocate(self) -> Segment:
        """A zero-filled segment (all padding) of this layout."""
        return Segment({name: np.zeros(shape, dtype) for name, (shape, dtype) in self.fields().items()})

    def nbytes(self) -> int:
        """Bytes of one segment's arrays."""
        return sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in self.fields().values())

    def validate(self, segment: Any) -> dict[str, np.ndarray]:
        """The segment's arrays, each checked for shape, dtype and finiteness. Raises SegmentRejected.

        Booleans are accepted for float32 fields (flags); nothing else is converted.
        """
        arrays = getattr(segment, "arrays", None)
        if not isinstance(arrays, dict):
            raise SegmentRejected(f"not a Segment ({type(segment).__name__})")
        out = {}
        for name, (shape, dtype) in self.fields().items():
            if name not in arrays:
                raise SegmentRejected(f"segment lacks field {name!r}")
            arr = np.asarray(arrays[name])
            if arr.shape != shape:
                raise SegmentRejected(f"segment field {name!r} has shape {arr.shape}, layout expects {shape}")
            if arr.dtype != dtype and not (arr.dtype == np.bool_ and dtype == np.float32):
                raise SegmentRejected(f"segment field {name!r} has dtype {arr.dtype}, layout expects {dtype}")
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                raise SegmentRejected(f"segment field {name!r} holds non-finite values")
            out[name] = arr
        return out
