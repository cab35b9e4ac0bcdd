"""`model.recurrent: lstm`: an LSTM cell; the state row is [h | c] (2 x recurrent_size)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from policy.cores.base import RecurrentCore


class LstmCore(RecurrentCore):
    state_per_unit = 2

    def __init__(self, in_dim: int, size: int) -> None:
        super().__init__(in_dim, size)
        self.cell = nn.LSTMCell(in_dim, size)
        self.out_dim = size

    def step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        h, c = state.split(self.size, dim=-1)
        h, c = self.cell(x, (h.contiguous(), c.contiguous()))
        return h, torch.cat([h, c], dim=-1)
