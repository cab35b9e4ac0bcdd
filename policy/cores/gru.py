"""`model.recurrent: gru`: a GRU cell; the state row is h (recurrent_size)."""

from __future__ import annotations

from torch import Tensor, nn

from policy.cores.base import RecurrentCore


class GruCore(RecurrentCore):
    def __init__(self, in_dim: int, size: int) -> None:
        super().__init__(in_dim, size)
        self.cell = nn.GRUCell(in_dim, size)
        self.out_dim = size

    def step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        h = self.cell(x, state)
        return h, h
