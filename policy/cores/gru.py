"""`model.recurrent: gru`: a GRU cell; the state row is h (recurrent_size)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from torch import Tensor, nn

from ...policy.cores.base import RecurrentCore, sigmoid


class GruCore(RecurrentCore):
    fused = "gru"
    cell: nn.GRUCell

    def __init__(self, in_dim: int, size: int, out_size: int = 0) -> None:
        super().__init__(in_dim, size, out_size)
        self.cell = nn.GRUCell(in_dim, size)

    def cell_step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        h = self.cell(x, state)
        return h, h

    @staticmethod
    def np_cell_prepare(weights: Mapping[str, np.ndarray]) -> Any:
        return (
            np.ascontiguousarray(weights["cell.weight_ih"].T),
            weights["cell.bias_ih"],
            np.ascontiguousarray(weights["cell.weight_hh"].T),
            weights["cell.bias_hh"],
        )

    @staticmethod
    def np_cell_step(prepared: Any, x: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w_ih, b_ih, w_hh, b_hh = prepared
        size = state.shape[1]
        gi, gh = x @ w_ih + b_ih, state @ w_hh + b_hh  # torch's gate order: r, z, n
        r = sigmoid(gi[:, :size] + gh[:, :size])
        z = sigmoid(gi[:, size : 2 * size] + gh[:, size : 2 * size])
        n = np.tanh(gi[:, 2 * size :] + r * gh[:, 2 * size :])
        h = (1.0 - z) * n + z * state
        return h, h
