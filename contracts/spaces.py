"""What every layer must know of an env: the observation's shape, dtype and bounds, and the action
space. Plain data: it travels to actors, into checkpoints and ONNX metadata, and back, and is
rebuilt from a dict without importing or calling anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

ActionKind = Literal["discrete", "continuous"]
# Observation dtypes a segment keeps as they are; every other dtype is stored as float32.
# uint8 frames stay uint8 end to end (a quarter of the bytes); ids and floats become float32.
NATIVE_STORAGE_DTYPES = ("uint8",)
# Numbers in one observation a spec read from a file may name (a 4-frame 1024x1024 stack is 4M).
MAX_OBS_NUMBERS = 1 << 24


class SpecError(ValueError):
    """A spec read from data that is not well formed (one line)."""


@dataclass(frozen=True)
class ActionSpec:
    """Discrete (n choices) or continuous (dim floats, with bounds applied by the env side)."""

    kind: ActionKind
    size: int  # number of choices or action dimensions

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of one action: () for a choice, (size,) for a vector."""
        return () if self.kind == "discrete" else (self.size,)

    @property
    def dtype(self) -> np.dtype:
        """int64 choices or float32 vectors."""
        return np.dtype(np.int64 if self.kind == "discrete" else np.float32)

    def noise_shape(self, batch: int) -> tuple[int, ...]:
        """Shape of the exploration noise a policy takes: uniforms [B] or standard normals [B, A]."""
        return (batch,) if self.kind == "discrete" else (batch, self.size)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "size": self.size}

    @staticmethod
    def from_dict(data: Any) -> ActionSpec:
        if not isinstance(data, dict) or data.get("kind") not in ("discrete", "continuous"):
            raise SpecError(f"not an action spec: {str(data)[:80]}")
        size = data.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= 1_000_000:
            raise SpecError(f"action spec size must be a whole number in [1, 1e6], got {str(size)[:40]}")
        return ActionSpec(data["kind"], size)


@dataclass(frozen=True)
class EnvSpec:
    """Observation shape, native dtype and bounds (min over the Box's low, max over its high), and
    the action spec. The bounds let model kinds check an env (token ids, image pixels) without it."""

    obs_shape: tuple[int, ...]
    action: ActionSpec
    obs_dtype: str = "float32"
    obs_low: float = float("-inf")
    obs_high: float = float("inf")

    @property
    def obs_dim(self) -> int:
        """Numbers in one observation."""
        return int(np.prod(self.obs_shape))

    @property
    def storage_dtype(self) -> np.dtype:
        """How segments and the ring buffer hold observations."""
        return np.dtype(self.obs_dtype if self.obs_dtype in NATIVE_STORAGE_DTYPES else np.float32)

    def describe_obs(self) -> str:
        """'a float32 Box of shape (4,) in [-4.8, 4.8]' (integers printed as integers)."""
        integer = np.issubdtype(np.dtype(self.obs_dtype), np.integer)
        low, high = (int(self.obs_low), int(self.obs_high)) if integer else (self.obs_low, self.obs_high)
        return f"a {self.obs_dtype} Box of shape {self.obs_shape} in [{low}, {high}]"

    def to_dict(self) -> dict[str, Any]:
        return {
            "obs_shape": list(self.obs_shape),
            "obs_dtype": self.obs_dtype,
            "obs_low": self.obs_low,
            "obs_high": self.obs_high,
            "action": self.action.to_dict(),
        }

    @staticmethod
    def from_dict(data: Any) -> EnvSpec:
        """Rebuilt from plain data, every field checked (it may come from a file)."""
        if not isinstance(data, dict):
            raise SpecError("not an env spec")
        shape = data.get("obs_shape")
        if (
            not isinstance(shape, list | tuple)
            or len(shape) > 8
            or not all(isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= 1 << 24 for d in shape)
        ):
            raise SpecError(f"env spec obs_shape must be a list of at most 8 sizes, got {str(shape)[:80]}")
        if int(np.prod(shape, dtype=object)) > MAX_OBS_NUMBERS:
            raise SpecError(f"env spec obs_shape {list(shape)} holds more than {MAX_OBS_NUMBERS} numbers")
        dtype = data.get("obs_dtype", "float32")
        if dtype not in ("float32", "float64", "float16", "uint8", "int8", "int16", "int32", "int64", "bool"):
            raise SpecError(f"env spec obs_dtype {str(dtype)[:20]!r} is not a numeric dtype")
        low, high = data.get("obs_low", float("-inf")), data.get("obs_high", float("inf"))
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (low, high)):
            raise SpecError("env spec bounds must be numbers")
        return EnvSpec(tuple(shape), ActionSpec.from_dict(data.get("action")), dtype, float(low), float(high))
