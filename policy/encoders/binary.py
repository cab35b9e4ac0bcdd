"""`binary`: a MultiBinary leaf as its bits, flattened, in float (0 or 1: nothing to normalize)."""

from __future__ import annotations

import numpy as np
from torch import Tensor, nn

from ...contracts.spaces import ObsLeaf
from ...policy.encoders.base import LeafEncoder


class Bits(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.reshape(x.shape[0], -1).float()


class BinaryEncoder(LeafEncoder):
    def problem(self, leaf: ObsLeaf) -> str | None:
        return None if leaf.kind in ("multi_binary", "box") else "binary reads MultiBinary leaves"

    def out_dim(self, leaf: ObsLeaf) -> int:
        return leaf.numbers

    def module(self, leaf: ObsLeaf) -> nn.Module:
        return Bits()

    def np_encode(self, leaf: ObsLeaf, x: np.ndarray) -> np.ndarray:
        return x.reshape(x.shape[0], -1).astype(np.float32)
