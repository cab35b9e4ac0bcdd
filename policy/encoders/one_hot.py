"""`one_hot`: a Discrete or MultiDiscrete leaf (choices from 0, `contracts/spaces.py`) as one
one-hot block per component, concatenated: [B, sum(nvec)]. Ids outside a component's range (an
env breaking its own space) are clamped into it rather than indexing out of bounds."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from ...contracts.spaces import ObsLeaf
from ...policy.encoders.base import LeafEncoder


class OneHot(nn.Module):
    offsets: Tensor
    top: Tensor

    def __init__(self, nvec: tuple[int, ...]) -> None:
        super().__init__()
        self.total = int(sum(nvec))
        self.register_buffer(
            "offsets", torch.tensor(np.cumsum((0, *nvec[:-1])), dtype=torch.long), persistent=False
        )
        self.register_buffer("top", torch.tensor(nvec, dtype=torch.long) - 1, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        ids = x.reshape(x.shape[0], -1).long()
        ids = torch.minimum(ids.clamp(min=0), self.top) + self.offsets
        out = torch.zeros(x.shape[0], self.total, device=x.device)
        return out.scatter_(1, ids, 1.0)


class OneHotEncoder(LeafEncoder):
    def problem(self, leaf: ObsLeaf) -> str | None:
        return (
            None
            if leaf.kind in ("discrete", "multi_discrete")
            else "one_hot reads Discrete and MultiDiscrete leaves"
        )

    def nvec(self, leaf: ObsLeaf) -> tuple[int, ...]:
        """The number of choices of each of the leaf's numbers, in C order."""
        return leaf.nvec

    def out_dim(self, leaf: ObsLeaf) -> int:
        return int(sum(self.nvec(leaf)))

    def module(self, leaf: ObsLeaf) -> nn.Module:
        return OneHot(self.nvec(leaf))

    def np_encode(self, leaf: ObsLeaf, x: np.ndarray) -> np.ndarray:
        nvec = np.asarray(self.nvec(leaf))
        ids = np.minimum(np.maximum(x.reshape(x.shape[0], -1), 0), nvec - 1) + np.cumsum((0, *nvec[:-1]))
        out = np.zeros((x.shape[0], int(nvec.sum())), dtype=np.float32)
        np.put_along_axis(out, ids, 1.0, axis=1)
        return out
