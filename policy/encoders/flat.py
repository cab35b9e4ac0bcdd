"""`flat`: a Box leaf flattened to floats and normalized (with the other flat leaves, by the
policy's one running normalizer)."""

from __future__ import annotations

import numpy as np
from torch import nn

from ...contracts.spaces import ObsLeaf
from ...policy.encoders.base import LeafEncoder


class FlatEncoder(LeafEncoder):
    normalized = True

    def problem(self, leaf: ObsLeaf) -> str | None:
        return None if leaf.kind == "box" else "flat reads Box leaves"

    def out_dim(self, leaf: ObsLeaf) -> int:
        return leaf.numbers

    def module(self, leaf: ObsLeaf) -> nn.Module | None:
        return None

    def np_encode(self, leaf: ObsLeaf, x: np.ndarray) -> np.ndarray:
        return x.reshape(x.shape[0], -1).astype(np.float32, copy=False)
