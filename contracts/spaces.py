"""What every layer must know of an env: its observation (one Box, or a tree of leaves from Dict and
Tuple spaces), its action space, and where its action masks come from. Plain data: it travels to
actors, into checkpoints and ONNX metadata, and back, and is rebuilt from a dict without importing
or calling anything.

A plain Box observation keeps the original fields (`obs_shape`, `obs_dtype`, bounds) and no
leaves, so specs, checkpoints and graphs written before trees existed read as they did. Any other
observation is a tuple of `ObsLeaf`s, one per Box/Discrete/MultiDiscrete/MultiBinary leaf of the
tree, each named by its path ("image", "pos/0"; "" for a lone non-Box observation).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

ActionKind = Literal["discrete", "continuous", "multi_discrete", "multi_binary"]
LeafKind = Literal["box", "discrete", "multi_discrete", "multi_binary"]
INTEGER_ACTIONS = ("discrete", "multi_discrete", "multi_binary")
# Leaf paths join Dict keys and Tuple indices with this; a key holding it is refused.
PATH_SEP = "/"
MAX_LEAVES = 256
MAX_AGENTS = 1024  # agents of one multi-agent env copy
# A policy group's name: part of metric keys (policy/<name>/...), weight keys (<name>/...) and
# file names (`relay export --policy`), so no '/', '.' or spaces.
POLICY_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,39}$")
# A multi-agent API's name (rollout_workers/multi_agent's registry) as an env spec file holds it.
API_NAME = re.compile(r"^[a-z][a-z0-9_]{0,19}$")
MAX_POLICY_GROUPS = 16
# Observation dtypes a segment keeps as they are; every other dtype is stored as float32.
# uint8 frames stay uint8 end to end (a quarter of the bytes); ids and floats become float32.
NATIVE_STORAGE_DTYPES = ("uint8",)
# Numbers in one observation a spec read from a file may name (a 4-frame 1024x1024 stack is 4M).
MAX_OBS_NUMBERS = 1 << 24
# A global state is read flat by an MLP beside each observation, or (`EnvSpec.global_image`) as a
# square grey image; an env's bigger image state (a whole screen) is reduced to one first.
MAX_GLOBAL_STATE = 4096


class SpecError(ValueError):
    """A spec read from data that is not well formed (one line)."""


def _sizes(data: Any, what: str, low: int = 1, high: int = 1 << 24, most: int = 8) -> tuple[int, ...]:
    """A tuple of whole numbers in [low, high] read from data (at most `most` of them)."""
    if not isinstance(data, list | tuple) or len(data) > most:
        raise SpecError(f"{what} must be a list of at most {most} numbers, got {str(data)[:80]}")
    if not all(isinstance(d, int) and not isinstance(d, bool) and low <= d <= high for d in data):
        raise SpecError(f"{what} must hold whole numbers in [{low}, {high}], got {str(data)[:80]}")
    return tuple(data)


@dataclass(frozen=True)
class ActionSpec:
    """The action space as the policy sees it.

    discrete: one of `size` choices (the env's are `start[0]` .. `start[0] + size - 1`);
    multi_discrete: `len(nvec)` components, component i one of nvec[i] choices from start[i];
    multi_binary: `size` bits; continuous: `size` floats (the env's Box of shape `env_shape`,
    flattened for the Gaussian, reshaped for the env). A discrete spec with `choices` (`env.actions`)
    is a subset of the env's choices: the policy's choice i is the env's `choices[i]`.
    """

    kind: ActionKind
    size: int  # choices, components' choices in all, bits, or numbers
    nvec: tuple[int, ...] = ()  # multi_discrete: choices per component
    start: tuple[int, ...] = ()  # discrete / multi_discrete: the env's first choice (0 if empty)
    env_shape: tuple[int, ...] = ()  # continuous / multi_binary: the env's shape (flat if empty)
    choices: tuple[int, ...] = ()  # discrete: the env's action for each choice (all of them if empty)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of one action as segments hold it: () for a choice, (components,) or (size,)."""
        if self.kind == "discrete":
            return ()
        if self.kind == "multi_discrete":
            return (len(self.nvec),)
        return (self.size,)

    @property
    def floats(self) -> bool:
        """Actions are float vectors (an env's Box: clipped to its bounds on the way to the env)."""
        return self.kind not in INTEGER_ACTIONS

    @property
    def dtype(self) -> np.dtype:
        """int64 choices and bits, float32 vectors."""
        return np.dtype(np.float32 if self.floats else np.int64)

    @property
    def param_size(self) -> int:
        """Numbers the policy's action head outputs: logits (all components'), bit logits, means."""
        return int(sum(self.nvec)) if self.kind == "multi_discrete" else self.size

    @property
    def maskable(self) -> bool:
        """Whether masks apply: one flag per choice, [param_size] (per component for multi_discrete)."""
        return self.kind in ("discrete", "multi_discrete")

    def noise_shape(self, batch: int) -> tuple[int, ...]:
        """Shape of the exploration noise a policy takes: uniforms [B] (a choice), [B, K] (one per
        component or bit), or standard normals [B, A] (continuous)."""
        return (batch,) if self.kind == "discrete" else (batch, self.shape[0])

    @property
    def offsets(self) -> np.ndarray:
        """The env's first choice: [] for discrete, [components] for multi_discrete (zeros where
        the space starts at 0); added to the policy's choices before they reach the env."""
        count = len(self.nvec) if self.kind == "multi_discrete" else 1
        start = self.start or (0,) * count
        return np.asarray(start[0] if self.kind == "discrete" else start, dtype=np.int64)

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        """Policy actions [B, *shape] (choices from 0, flat vectors) as the env's space holds them:
        choices moved to `start` (or looked up in `choices`), vectors and bits in `env_shape` (no
        clipping here)."""
        if self.choices:
            return np.asarray(self.choices, dtype=np.int64)[actions]
        if self.start:
            actions = actions + self.offsets
        return actions.reshape(actions.shape[0], *self.env_shape) if self.env_shape else actions

    def describe(self) -> str:
        """'Discrete(6)', 'MultiDiscrete([3 2])', 'MultiBinary(4)', 'Box of 3 floats'."""
        if self.kind == "discrete":
            return f"Discrete({self.size})" + (f" of the env's {list(self.choices)}" if self.choices else "")
        if self.kind == "multi_discrete":
            return f"MultiDiscrete({list(self.nvec)})"
        if self.kind == "multi_binary":
            return f"MultiBinary({self.size})"
        return f"Box of {self.size} floats"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "size": self.size}
        for name in ("nvec", "start", "env_shape", "choices"):
            if getattr(self, name):
                out[name] = list(getattr(self, name))
        return out

    @staticmethod
    def from_dict(data: Any) -> ActionSpec:
        if not isinstance(data, dict) or data.get("kind") not in ("discrete", "continuous", *INTEGER_ACTIONS):
            raise SpecError(f"not an action spec: {str(data)[:80]}")
        size = data.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= 1_000_000:
            raise SpecError(f"action spec size must be a whole number in [1, 1e6], got {str(size)[:40]}")
        kind = data["kind"]
        nvec = _sizes(data.get("nvec", []), "action spec nvec", most=1024)
        start = _sizes(data.get("start", []), "action spec start", low=-(1 << 62), high=1 << 62, most=1024)
        env_shape = _sizes(data.get("env_shape", []), "action spec env_shape")
        choices = _sizes(
            data.get("choices", []), "action spec choices", low=-(1 << 62), high=1 << 62, most=size
        )
        if kind == "multi_discrete" and (not nvec or sum(nvec) != size):
            raise SpecError(f"a multi_discrete action spec needs nvec summing to its size {size}")
        if kind != "multi_discrete" and nvec:
            raise SpecError(f"a {kind} action spec has no nvec")
        if start and len(start) != (len(nvec) if kind == "multi_discrete" else 1):
            raise SpecError("action spec start must give one first choice per component")
        numbers = len(nvec) if kind == "multi_discrete" else size
        if env_shape and int(np.prod(env_shape)) != numbers:
            raise SpecError(f"action spec env_shape {list(env_shape)} does not hold {numbers} numbers")
        if choices and (kind != "discrete" or start or len(choices) != size or len(set(choices)) != size):
            raise SpecError(
                "action spec choices must be a discrete spec's size distinct env actions, without start"
            )
        return ActionSpec(kind, size, nvec, start, env_shape, choices)


@dataclass(frozen=True)
class ObsLeaf:
    """One leaf of an observation tree: its path, kind, shape and dtype as the env gives it, and
    its bounds (Box) or choices per component (`nvec`, from `start`; Discrete has one)."""

    path: str
    kind: LeafKind
    shape: tuple[int, ...]
    dtype: str
    low: float = float("-inf")
    high: float = float("inf")
    nvec: tuple[int, ...] = ()
    start: tuple[int, ...] = ()

    @property
    def field(self) -> str:
        """The Segment field holding it: "obs" for a lone observation, else "obs/<path>"."""
        return "obs" if not self.path else f"obs{PATH_SEP}{self.path}"

    @property
    def storage_dtype(self) -> np.dtype:
        """uint8 Box leaves stay uint8, choices int64, bits uint8, every other Box float32."""
        if self.kind in ("discrete", "multi_discrete"):
            return np.dtype(np.int64)
        if self.kind == "multi_binary" or self.dtype in NATIVE_STORAGE_DTYPES:
            return np.dtype(np.uint8)
        return np.dtype(np.float32)

    @property
    def numbers(self) -> int:
        return int(np.prod(self.shape))

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "low": self.low,
            "high": self.high,
            "nvec": list(self.nvec),
            "start": list(self.start),
        }

    @staticmethod
    def from_dict(data: Any) -> ObsLeaf:
        if not isinstance(data, dict) or data.get("kind") not in (
            "box",
            "discrete",
            "multi_discrete",
            "multi_binary",
        ):
            raise SpecError(f"not an observation leaf: {str(data)[:80]}")
        path = data.get("path")
        if not isinstance(path, str) or len(path) > 300:
            raise SpecError("observation leaf path must be a string of at most 300 characters")
        shape = _sizes(data.get("shape"), f"observation leaf {path!r} shape", most=8)
        dtype = _check_dtype(data.get("dtype", "float32"))
        low, high = _bounds(data)
        nvec = _sizes(data.get("nvec", []), f"observation leaf {path!r} nvec", most=1 << 16)
        start = _sizes(
            data.get("start", []), "observation leaf start", low=-(1 << 62), high=1 << 62, most=1 << 16
        )
        if data["kind"] in ("discrete", "multi_discrete") and (not nvec or int(np.prod(shape)) != len(nvec)):
            raise SpecError(f"observation leaf {path!r}: a choice leaf needs one nvec entry per number")
        return ObsLeaf(path, data["kind"], shape, dtype, low, high, nvec, start)


def _check_dtype(dtype: Any) -> str:
    if dtype not in ("float32", "float64", "float16", "uint8", "int8", "int16", "int32", "int64", "bool"):
        raise SpecError(f"env spec obs_dtype {str(dtype)[:20]!r} is not a numeric dtype")
    return str(dtype)


def _bounds(data: dict[str, Any], low_key: str = "low", high_key: str = "high") -> tuple[float, float]:
    low, high = data.get(low_key, float("-inf")), data.get(high_key, float("inf"))
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (low, high)):
        raise SpecError("env spec bounds must be numbers")
    return float(low), float(high)


@dataclass(frozen=True)
class EnvSpec:
    """The observation and the action spec. A plain Box observation is `obs_shape`, its native
    dtype and bounds (min over the Box's low, max over its high) with no `leaves`; any other is its
    `leaves`. `action_mask`: where masks come from ("obs:<key>", "info:<key>") or None. The bounds
    let model kinds check an env (token ids, image pixels) without it."""

    obs_shape: tuple[int, ...]
    action: ActionSpec
    obs_dtype: str = "float32"
    obs_low: float = float("-inf")
    obs_high: float = float("inf")
    leaves: tuple[ObsLeaf, ...] = ()
    action_mask: str | None = None
    # A PettingZoo env's API (a name of rollout_workers/multi_agent's registry) or None, and the
    # agents that are its columns: one segment column each per env copy (a parallel env's,
    # parameter sharing). With `agents` () a multi-agent env is played from one seat per copy (a
    # turn-based game). What each API does is its registry entry's to say; here only columns.
    multi_agent: str | None = None
    agents: tuple[str, ...] = ()
    # Policy groups (multi_agent.policies) of a parallel env, in order: (name, the group's own spec:
    # its spaces and its agents). The spec around them describes the whole env (`agents`: every
    # agent; its spaces: the first group's); () for one shared policy.
    groups: tuple[tuple[str, EnvSpec], ...] = ()
    # Floats in a parallel env's global state (PettingZoo's state(), flattened) that each column's
    # value trunk reads beside its agent's observation (multi_agent.central_critic); 0: none.
    global_state: int = 0
    # The side of the square grey image the global state is (global_state = side * side grey
    # levels 0-255, row-major), where the env's state is a screen; 0: a flat state.
    global_image: int = 0

    @property
    def policy_names(self) -> tuple[str, ...]:
        """The policy groups' names; () for one shared policy."""
        return tuple(name for name, _ in self.groups)

    def policy(self, name: str | None) -> EnvSpec:
        """The spec group `name`'s policy is built for (None: the one policy of an ungrouped run);
        KeyError (naming the groups) otherwise."""
        if name is None and not self.groups:
            return self
        for group, spec in self.groups:
            if group == name:
                return spec
        have = ", ".join(self.policy_names) or "none: one policy for every agent"
        raise KeyError(f"no policy group {name!r} (groups: {have})")

    @property
    def columns(self) -> int:
        """Segment columns one env copy fills: a parallel env's agents, else 1."""
        return len(self.agents) or 1

    @property
    def structured(self) -> bool:
        """Whether the observation is a tree (or a lone non-Box leaf) rather than one Box."""
        return bool(self.leaves)

    @property
    def obs_leaves(self) -> tuple[ObsLeaf, ...]:
        """Every leaf; a plain Box observation is one Box leaf at path ""."""
        if self.leaves:
            return self.leaves
        return (ObsLeaf("", "box", self.obs_shape, self.obs_dtype, self.obs_low, self.obs_high),)

    @property
    def obs_dim(self) -> int:
        """Numbers in one observation (all leaves')."""
        return sum(leaf.numbers for leaf in self.obs_leaves)

    @property
    def storage_dtype(self) -> np.dtype:
        """How segments and the ring buffer hold a plain Box observation."""
        return np.dtype(self.obs_dtype if self.obs_dtype in NATIVE_STORAGE_DTYPES else np.float32)

    def describe_obs(self) -> str:
        """'a float32 Box of shape (4,) in [-4.8, 4.8]' (integers printed as integers), or the
        leaves of a tree."""
        if self.leaves:
            parts = [f"{leaf.path or 'obs'}: {leaf.kind} {list(leaf.shape)}" for leaf in self.leaves[:8]]
            more = f" and {len(self.leaves) - 8} more" if len(self.leaves) > 8 else ""
            return f"a tree of {len(self.leaves)} leaves ({', '.join(parts)}{more})"
        integer = np.issubdtype(np.dtype(self.obs_dtype), np.integer)
        low, high = (int(self.obs_low), int(self.obs_high)) if integer else (self.obs_low, self.obs_high)
        return f"a {self.obs_dtype} Box of shape {self.obs_shape} in [{low}, {high}]"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "obs_shape": list(self.obs_shape),
            "obs_dtype": self.obs_dtype,
            "obs_low": self.obs_low,
            "obs_high": self.obs_high,
            "action": self.action.to_dict(),
        }
        if self.leaves:
            out["leaves"] = [leaf.to_dict() for leaf in self.leaves]
        if self.action_mask is not None:
            out["action_mask"] = self.action_mask
        if self.multi_agent is not None:
            out["multi_agent"] = self.multi_agent
            out["agents"] = list(self.agents)
        if self.groups:
            out["groups"] = [{"name": name, "spec": spec.to_dict()} for name, spec in self.groups]
        if self.global_state:
            out["global_state"] = self.global_state
        if self.global_image:
            out["global_image"] = self.global_image
        return out

    @staticmethod
    def from_dict(data: Any) -> EnvSpec:
        """Rebuilt from plain data, every field checked (it may come from a file)."""
        if not isinstance(data, dict):
            raise SpecError("not an env spec")
        shape = _sizes(data.get("obs_shape"), "env spec obs_shape")
        if int(np.prod(shape, dtype=object)) > MAX_OBS_NUMBERS:
            raise SpecError(f"env spec obs_shape {list(shape)} holds more than {MAX_OBS_NUMBERS} numbers")
        dtype = _check_dtype(data.get("obs_dtype", "float32"))
        low, high = _bounds(data, "obs_low", "obs_high")
        raw_leaves = data.get("leaves", [])
        if not isinstance(raw_leaves, list) or len(raw_leaves) > MAX_LEAVES:
            raise SpecError(f"env spec leaves must be a list of at most {MAX_LEAVES}")
        leaves = tuple(ObsLeaf.from_dict(leaf) for leaf in raw_leaves)
        if sum(leaf.numbers for leaf in leaves) > MAX_OBS_NUMBERS:
            raise SpecError(f"env spec leaves hold more than {MAX_OBS_NUMBERS} numbers")
        if len({leaf.path for leaf in leaves}) != len(leaves):
            raise SpecError("env spec leaves repeat a path")
        mask = data.get("action_mask")
        if mask is not None and not (
            isinstance(mask, str) and mask.startswith(("obs:", "info:")) and len(mask) < 300
        ):
            raise SpecError(f"env spec action_mask must be 'obs:<key>' or 'info:<key>', got {str(mask)[:40]}")
        api, agents, global_state, image = _multi_agent_from(data)
        action = ActionSpec.from_dict(data.get("action"))
        spec = EnvSpec(
            shape,
            action,
            dtype,
            low,
            high,
            leaves,
            mask,
            api,
            tuple(agents),
            global_state=global_state,
            global_image=image,
        )
        return replace(spec, groups=_groups_from(data.get("groups", []), spec))


def _multi_agent_from(data: dict[str, Any]) -> tuple[str | None, tuple[str, ...], int, int]:
    """(multi_agent, agents, global_state, global_image) of an env spec read from a file, each
    checked."""
    agents = data.get("agents", [])
    if (
        not isinstance(agents, list)
        or len(agents) > MAX_AGENTS
        or not all(isinstance(a, str) and 0 < len(a) <= 100 for a in agents)
        or len(set(agents)) != len(agents)
    ):
        raise SpecError(f"env spec agents must be at most {MAX_AGENTS} distinct names of 1-100 characters")
    api = data.get("multi_agent")
    if api is not None and not (isinstance(api, str) and API_NAME.match(api)):
        raise SpecError(f"env spec multi_agent must be an API name, got {str(api)[:20]!r}")
    if agents and api is None:
        raise SpecError("env spec agents are the columns of a multi-agent env: multi_agent is missing")
    global_state = data.get("global_state", 0)
    if (
        not isinstance(global_state, int)
        or isinstance(global_state, bool)
        or not 0 <= global_state <= MAX_GLOBAL_STATE
        or (global_state and not agents)
    ):
        raise SpecError(
            f"env spec global_state must be 0 to {MAX_GLOBAL_STATE} floats, of an env whose agents "
            "are its columns only"
        )
    image = data.get("global_image", 0)
    if (
        not isinstance(image, int)
        or isinstance(image, bool)
        or image < 0
        or image * image != (image and global_state)
    ):
        raise SpecError(
            "env spec global_image must be 0 or the side of a square global state of side^2 floats"
        )
    return api, tuple(agents), global_state, image


def _groups_from(data: Any, whole: EnvSpec) -> tuple[tuple[str, EnvSpec], ...]:
    """Policy groups read from a file: named, of a parallel env, each a group spec (no groups of
    its own) whose agents are the whole env's, every agent in exactly one group."""
    if not isinstance(data, list) or len(data) > MAX_POLICY_GROUPS:
        raise SpecError(f"env spec groups must be a list of at most {MAX_POLICY_GROUPS}")
    if not data:
        return ()
    out = []
    for item in data:
        if not isinstance(item, dict) or not (
            isinstance(item.get("name"), str) and POLICY_NAME.match(item["name"])
        ):
            raise SpecError("env spec groups: each is {name, spec} with a group name")
        if not isinstance(item.get("spec"), dict) or "groups" in item["spec"]:
            raise SpecError(f"env spec group {item['name']}: its spec is not a group's")
        spec = EnvSpec.from_dict(item["spec"])
        if not spec.agents:
            raise SpecError(f"env spec group {item['name']}: not agents of a parallel env")
        out.append((item["name"], spec))
    members = [a for _, spec in out for a in spec.agents]
    if not whole.agents or sorted(members) != sorted(whole.agents):
        raise SpecError("env spec groups do not hold every agent of the env exactly once")
    if len({name for name, _ in out}) != len(out):
        raise SpecError("env spec groups repeat a name")
    return tuple(out)
