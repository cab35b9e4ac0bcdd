"""What a recurrent core is: memory between the trunk and the heads.

A core maps trunk features [B, in_dim] and its state [B, state_size] to features [B, out_dim] and
the next state, one step at a time (`step`), or over a time-major sequence [T, B, in_dim] from a
stored initial state with the state zeroed where an episode starts (`sequence`: masks, never a
Python loop over episodes). The state is one flat float32 row per env so a segment stores it as
one per-env field (`initial_state`, contracts/segment.py) whatever the core keeps inside.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class RecurrentCore(nn.Module):
    """Subclasses take (in_dim, size), set `out_dim`, declare `state_per_unit` (floats of state
    per unit of `model.recurrent_size`) and implement `step`, and its numpy mirror for rollout
    workers: `np_prepare` (the cell's weights, from its state-dict entries, laid out for x @ W)
    and `np_step` (tied to `step` by tests/policy/test_recurrent.py)."""

    state_per_unit: ClassVar[int] = 1
    out_dim: int

    def __init__(self, in_dim: int, size: int) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.size = size
        self.state_size = self.state_per_unit * size

    def step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, in_dim], state [B, state_size] -> (features [B, out_dim], next state [B, state_size])."""
        raise NotImplementedError

    def sequence(
        self, x: Tensor, state: Tensor, starts: Tensor, detach_before: int = 0
    ) -> tuple[Tensor, Tensor]:
        """x [T, B, in_dim] from `state` [B, state_size]; starts [T, B] bool: an episode starts at
        step t, so the state entering it is zeroed. Gradients do not reach back past step
        `detach_before` (burn-in). Returns (features [T, B, out_dim], state after step T-1)."""
        keep = (~starts).unsqueeze(-1).to(state.dtype)  # [T, B, 1]
        outs = []
        for t in range(x.shape[0]):  # T is the segment's fixed length: one graph shape
            if t == detach_before and t > 0:
                state = state.detach()
            out, state = self.step(x[t], state * keep[t])
            outs.append(out)
        return torch.stack(outs), state

    @staticmethod
    def np_prepare(weights: Mapping[str, np.ndarray]) -> Any:
        """The cell's float32 arrays (`weights` keyed as in its state dict: "cell.weight_ih", ...)
        arranged for `np_step`."""
        raise NotImplementedError

    @staticmethod
    def np_step(prepared: Any, x: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`step` in float32 numpy: x [B, in_dim], state [B, state_size] -> (features, next state)."""
        raise NotImplementedError
