"""`model.recurrent: lstm`: an LSTM cell; the state row is [h | c] (2 x recurrent_size)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ...policy.cores.base import RecurrentCore, sigmoid


class LstmCore(RecurrentCore):
    state_per_unit = 2
    fused = "lstm"
    cell: nn.LSTMCell

    def __init__(self, in_dim: int, size: int, out_size: int = 0) -> None:
        super().__init__(in_dim, size, out_size)
        self.cell = nn.LSTMCell(in_dim, size)

    def cell_step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        h, c = state.split(self.size, dim=-1)
        h, c = self.cell(x, (h.contiguous(), c.contiguous()))
        return h, torch.cat([h, c], dim=-1)

    @staticmethod
    def np_cell_prepare(weights: Mapping[str, np.ndarray]) -> Any:
        # One matmul for both inputs: [x | h] @ [W_ih^T ; W_hh^T], the two biases summed.
        w = np.vstack([weights["cell.weight_ih"].T, weights["cell.weight_hh"].T])
        return np.ascontiguousarray(w), weights["cell.bias_ih"] + weights["cell.bias_hh"]

    @staticmethod
    def np_cell_step(prepared: Any, x: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w, b = prepared
        size = state.shape[1] // 2
        h, c = state[:, :size], state[:, size:]
        gates = np.concatenate([x, h], axis=1) @ w + b  # torch's gate order: i, f, g, o
        i, f, o = (sigmoid(gates[:, k * size : (k + 1) * size]) for k in (0, 1, 3))
        g = np.tanh(gates[:, 2 * size : 3 * size])
        c = f * c + i * g
        h = o * np.tanh(c)
        return h, np.concatenate([h, c], axis=1)
