"""A preallocated ring buffer of fixed-shape [T, N] segments on the learner's device.

Storage is allocated once, from the run's `SegmentLayout`; `add` copies a segment in place at the
ring pointer. Nothing is allocated afterwards, so device memory stays flat and shapes never change
(no NPU recompiles). Fields keep the layout's dtypes (uint8 observations stay uint8).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..contracts.segment import Segment, SegmentLayout


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype)).dtype


class SegmentRingBuffer:
    """S segments of [T, N] on `device`; fields are tensors shaped [S, T, N, ...]."""

    def __init__(self, layout: SegmentLayout, capacity: int, device: torch.device | str = "cpu") -> None:
        if capacity < 1:
            raise ValueError(f"capacity={capacity}: the ring buffer needs at least one segment")
        self.layout = layout
        self.capacity = capacity
        self.device = torch.device(device)
        self.storage: dict[str, Tensor] = {
            name: torch.zeros((capacity, *shape), dtype=torch_dtype(dtype), device=self.device)
            for name, (shape, dtype) in layout.fields().items()
        }
        self.pointer = 0
        self.size = 0
        self.added = 0

    def stage(self, segment: Segment) -> dict[str, Tensor]:
        """A segment's fields validated and ready for the device: host tensors, page-locked when
        the buffer is on an accelerator so the copy can run asynchronously. Raises SegmentRejected.

        Validation runs on the host copy (the segment arrives from a CPU worker anyway), so a
        rejection costs no device sync and leaves the buffer untouched. Safe to call from another
        thread while the buffer is in use (it touches no storage).
        """
        staged = {}
        for name, arr in self.layout.validate(segment).items():
            # Object-store arrays are read-only; np.require copies only those.
            src = torch.from_numpy(np.require(arr, requirements=["C", "W"]))
            staged[name] = src.pin_memory() if self.device.type != "cpu" else src
        return staged

    def add(self, segment: Segment) -> int:
        """Validate and copy one segment in at the ring pointer; returns its slot. Raises
        SegmentRejected, leaving the buffer untouched."""
        return self.put(self.stage(segment))

    def put(self, staged: dict[str, Tensor]) -> int:
        """Copy a segment's staged fields (from `stage`) in at the ring pointer; returns its slot."""
        slot = self.pointer
        for name, src in staged.items():
            dst = self.storage[name][slot]
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
