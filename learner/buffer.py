"""A preallocated ring buffer of fixed-shape [T, N] segments on the learner's device.

Storage is allocated once; `add` copies a segment in place at the ring pointer. Nothing is
allocated afterwards, so device memory stays flat and shapes never change (no NPU recompiles).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

# Per-step fields of a Segment (DESIGN.md) and their storage dtypes; obs/actions are added per spec.
STEP_FIELDS: dict[str, torch.dtype] = {
    "logp": torch.float32,
    "values": torch.float32,
    "rewards": torch.float32,
    "terminated": torch.float32,
    "truncated": torch.float32,
    "mask": torch.float32,
    "bootstrap_value": torch.float32,
}


class SegmentRejected(ValueError):
    """A segment that does not fit the buffer's spec or holds non-finite numbers."""


@dataclass(frozen=True)
class SegmentSpec:
    """Shapes and dtypes of one segment: T steps of N envs."""

    rollout_len: int
    num_envs: int
    obs_shape: tuple[int, ...]
    action_shape: tuple[int, ...]
    obs_dtype: torch.dtype = torch.float32
    action_dtype: torch.dtype = torch.float32
    grouped: bool = False  # GRPO segments add `outcome` [N], each env's episodic return

    def field_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Every stored field: name -> (shape, dtype)."""
        tn = (self.rollout_len, self.num_envs)
        shapes = {
            "obs": (tn + self.obs_shape, self.obs_dtype),
            "actions": (tn + self.action_shape, self.action_dtype),
            "last_value": ((self.num_envs,), torch.float32),
        }
        shapes.update({name: (tn, dtype) for name, dtype in STEP_FIELDS.items()})
        if self.grouped:
            shapes["outcome"] = ((self.num_envs,), torch.float32)
        return shapes


def _check_field(name: str, value: object, shape: tuple[int, ...], dtype: torch.dtype) -> np.ndarray:
    arr = value.cpu().numpy() if isinstance(value, Tensor) else np.asarray(value)
    if arr.shape != shape:
        raise SegmentRejected(f"segment field {name!r} has shape {arr.shape}, buffer expects {shape}")
    expected = torch.empty((), dtype=dtype).numpy().dtype
    if arr.dtype != expected and not (arr.dtype == np.bool_ and expected == np.float32):
        raise SegmentRejected(f"segment field {name!r} has dtype {arr.dtype}, buffer expects {expected}")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise SegmentRejected(f"segment field {name!r} holds non-finite values")
    return arr


class SegmentRingBuffer:
    """S segments of [T, N] on `device`; fields are tensors shaped [S, T, N, ...]."""

    def __init__(self, spec: SegmentSpec, capacity: int, device: torch.device | str = "cpu") -> None:
        if capacity < 1:
            raise ValueError(f"capacity={capacity}: the ring buffer needs at least one segment")
        self.spec = spec
        self.capacity = capacity
        self.device = torch.device(device)
        self.storage: dict[str, Tensor] = {
            name: torch.zeros((capacity, *shape), dtype=dtype, device=self.device)
            for name, (shape, dtype) in spec.field_shapes().items()
        }
        self.pointer = 0
        self.size = 0
        self.added = 0
        self.rejected = 0

    def add(self, segment: Mapping[str, object]) -> int:
        """Copy one segment in at the ring pointer; returns its slot. Raises SegmentRejected.

        Validation runs on the host copy (the segment arrives from a CPU worker anyway), so a
        rejection costs no device sync and leaves the buffer untouched.
        """
        try:
            checked = {
                name: _check_field(name, segment[name], shape, dtype)
                for name, (shape, dtype) in self.spec.field_shapes().items()
            }
        except KeyError as err:
            self.rejected += 1
            raise SegmentRejected(f"segment lacks field {err.args[0]!r}") from None
        except SegmentRejected:
            self.rejected += 1
            raise
        slot = self.pointer
        for name, arr in checked.items():
            dst = self.storage[name][slot]
            # Object-store arrays are read-only; np.require copies only those.
            src = torch.from_numpy(np.require(arr, requirements=["C", "W"]))
            dst.copy_(src.to(dst.dtype), non_blocking=True)
        self.pointer = (self.pointer + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)
        self.added += 1
        return slot

    def latest_slots(self, count: int) -> Tensor:
        """Slots of the `count` newest segments, oldest first, as a device index tensor."""
        if not 1 <= count <= self.size:
            raise ValueError(f"asked for {count} segments, buffer holds {self.size}")
        slots = [(self.pointer - count + i) % self.capacity for i in range(count)]
        return torch.tensor(slots, device=self.device)

    def gather(self, slots: Tensor) -> dict[str, Tensor]:
        """Fields of the given slots: {name: [k, T, N, ...]} (device-side index, no host trip)."""
        return {name: t.index_select(0, slots) for name, t in self.storage.items()}

    @property
    def fill(self) -> float:
        """Fraction of slots holding a segment."""
        return self.size / self.capacity

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.storage.values())
