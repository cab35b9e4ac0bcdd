"""How a policy's weights travel from the learner to the actors that act with them, once per
version: the registry of wires (`learner.weight_wire`).

A wire packs a state dict on the learner's host (`pack`: what Ray's object store keeps, one copy
that every actor reads) and hands an actor the state dict back (`unpack`: views where it can, no
copy; the actor copies them into its own tensors or arrays). `exact`: the actor's weights equal
the learner's bit for bit, which an env policy needs (its numpy acting mirror, its float32
normalizer statistics, and importance ratios of exactly 1 at a version's first update).

- `arrays`: float32 numpy arrays by key. Ray stores and reads numpy arrays without pickling them
  (about 5x faster to fetch than torch tensors); the env policies' default.
- `packed_bf16`: one contiguous buffer, floating tensors as bf16 (half the bytes), tied tensors
  sent once; the language models' default (the generator computes in float32 again, and the
  learner's importance correction covers the rounding).
- `packed_f32`: the same buffer in float32, exact: a language run whose generators must sample
  with the learner's very weights (2x the bytes of bf16).

A new wire (a device broadcast over HCCL/NCCL, LoRA-only deltas) is one class here and one line in
WIRES; preflight refuses an inexact wire for an env policy.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from ..contracts.config import RelayConfig
from ..policy.models import model_kind

Weights = dict[str, Tensor | np.ndarray]


class WeightWire(Protocol):
    """One way weights travel (module docstring)."""

    exact: bool

    def pack(self, state: dict[str, Tensor], reuse: Any = None) -> Any:
        """What goes on the wire for `state` (CPU tensors); `reuse`: the previous version's
        payload, whose memory a wire may fill again."""
        ...

    def unpack(self, payload: Any) -> Weights:
        """Every key of the state dict again (views into `payload` where possible; read-only)."""
        ...

    def nbytes(self, payload: Any) -> int: ...


class HostArrays:
    """float32 numpy arrays by key (`arrays`)."""

    exact = True

    def pack(self, state: dict[str, Tensor], reuse: Any = None) -> dict[str, np.ndarray]:
        return {k: v.detach().numpy() for k, v in state.items()}

    def unpack(self, payload: dict[str, np.ndarray]) -> Weights:
        return dict(payload)

    def nbytes(self, payload: dict[str, np.ndarray]) -> int:
        return sum(int(v.nbytes) for v in payload.values())


@dataclass(frozen=True)
class PackedWeights:
    """A state dict as one contiguous buffer: `data` holds every distinct tensor's bytes (floating
    ones in the wire's dtype) back to back, `index` each key's (dtype, shape, byte offset) and
    `alias` keys that share another key's tensor (tied weights, sent once). One numpy array is what
    Ray's object store hands a reader without a copy; a dict of tensors is pickled tensor by tensor."""

    data: np.ndarray
    index: dict[str, tuple[str, tuple[int, ...], int]]
    alias: dict[str, str]

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


def _item_size(kind: torch.dtype) -> int:
    return torch.empty(0, dtype=kind).element_size()


def wire_weights(
    state: dict[str, Tensor], reuse: np.ndarray | None = None, floats: torch.dtype = torch.bfloat16
) -> PackedWeights:
    """`state` packed into one buffer (`PackedWeights`), floating tensors as `floats`. Each tensor
    is converted straight into its place in the buffer; `reuse`, the buffer of the previous
    version when it has the size, saves allocating (and faulting in) a new one."""
    index: dict[str, tuple[str, tuple[int, ...], int]] = {}
    alias: dict[str, str] = {}
    seen: dict[tuple[int, int, tuple[int, ...]], str] = {}
    offset = 0
    for k, v in state.items():
        key = (v.untyped_storage().data_ptr(), int(v.storage_offset()), tuple(v.shape))
        if key in seen:
            alias[k] = seen[key]
            continue
        seen[key] = k
        kind = floats if v.is_floating_point() else v.dtype
        index[k] = (str(kind).removeprefix("torch."), tuple(v.shape), offset)
        offset += v.numel() * _item_size(kind)
    data = reuse if reuse is not None and reuse.nbytes == offset else np.empty(offset, np.uint8)
    buf = torch.from_numpy(data)
    for k, (name, shape, start) in index.items():
        kind = getattr(torch, name)
        size = math.prod(shape) * _item_size(kind)
        buf[start : start + size].view(kind).reshape(shape).copy_(state[k].detach())
    return PackedWeights(data, index, alias)


def packed_views(packed: PackedWeights) -> dict[str, Tensor]:
    """Each key's tensor as a view into the packed buffer (no copy; read, never written), tied
    keys sharing their source's view."""
    with warnings.catch_warnings():  # the object store's buffer is read-only: these views only read
        warnings.simplefilter("ignore", UserWarning)
        buf = torch.from_numpy(np.asarray(packed.data).view(np.uint8))
    out: dict[str, Tensor] = {}
    for k, (name, shape, offset) in packed.index.items():
        kind = getattr(torch, name)
        size = math.prod(shape) * _item_size(kind)
        out[k] = buf[offset : offset + size].view(kind).reshape(shape)
    for k, src in packed.alias.items():
        out[k] = out[src]
    return out


def unwire_weights(packed: PackedWeights, dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
    """The state dict of `packed`, floating tensors in `dtype` (copies: the buffer may be the
    object store's read-only memory); tied keys share one tensor again."""
    views = packed_views(packed)
    out = {
        k: (t.to(dtype) if t.is_floating_point() else t.clone())
        for k, t in views.items()
        if k not in packed.alias
    }
    for k, src in packed.alias.items():
        out[k] = out[src]
    return out


class Packed:
    """One buffer, floating tensors as `floats` (`packed_bf16`, `packed_f32`)."""

    def __init__(self, floats: torch.dtype) -> None:
        self.floats = floats
        self.exact = floats == torch.float32

    def pack(self, state: dict[str, Tensor], reuse: Any = None) -> PackedWeights:
        return wire_weights(state, None if reuse is None else reuse.data, self.floats)

    def unpack(self, payload: PackedWeights) -> Weights:
        return dict(packed_views(payload))

    def nbytes(self, payload: PackedWeights) -> int:
        return payload.nbytes


WIRES: dict[str, WeightWire] = {
    "arrays": HostArrays(),
    "packed_bf16": Packed(torch.bfloat16),
    "packed_f32": Packed(torch.float32),
}
AUTO = "auto"


def wire_name(cfg: RelayConfig) -> str:
    """The run's wire: learner.weight_wire, or for `auto` its policy family's default."""
    name = cfg.learner.weight_wire
    return model_kind(cfg.model.kind).default_wire if name == AUTO else name


def wire_for(cfg: RelayConfig) -> WeightWire:
    """The run's wire (ValueError naming the registered ones where learner.weight_wire is none)."""
    name = wire_name(cfg)
    if name not in WIRES:
        raise ValueError(f"learner.weight_wire={name!r} is not a wire: choose {', '.join([AUTO, *WIRES])}")
    return WIRES[name]


@torch.no_grad()
def load_weights(module: nn.Module, weights: Weights, strict: bool = True) -> None:
    """Copy `weights` (a wire's unpacked views) into `module`'s own tensors in place, each
    converted as it is copied: no float32 copy of the whole state is ever made. `strict`: every
    key of the module must come (False for LoRA, where only the adapters travel)."""
    own = module.state_dict(keep_vars=True)
    unknown = [k for k in weights if k not in own]
    missing = [k for k in own if k not in weights]
    if unknown or (strict and missing):
        raise ValueError(f"weights do not fit the model: {(unknown or missing)[0]}")
    done: set[int] = set()
    for k, v in weights.items():
        target = own[k].data
        if target.data_ptr() in done:  # a tied tensor, already copied under its other key
            continue
        done.add(target.data_ptr())
        target.copy_(torch.as_tensor(v))
