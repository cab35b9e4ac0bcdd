"""What an observation encoder provides for one leaf of the observation tree: whether it can read
the leaf, its output width, its torch module and, where it has one, its numpy mirror.

Shapes: a leaf's inputs are [B, *leaf.shape] in the leaf's storage dtype (contracts/spaces.py);
the output is float [B, out_dim]. `normalized` encoders (`flat`) emit no module of their own:
their leaves are flattened, concatenated and passed through the policy's one observation
normalizer, first in the features.
"""

from __future__ import annotations

import numpy as np
from torch import nn

from ...contracts.spaces import ObsLeaf


class LeafEncoder:
    normalized = False  # the leaf goes through the observation normalizer (flat float leaves)
    numpy_mirror = True  # np_encode exists: rollout workers may act through numpy

    def problem(self, leaf: ObsLeaf) -> str | None:
        """Why this encoder cannot read the leaf, or None."""
        return None

    def out_dim(self, leaf: ObsLeaf) -> int:
        raise NotImplementedError

    def module(self, leaf: ObsLeaf) -> nn.Module | None:
        """The torch encoder ([B, *leaf.shape] -> [B, out_dim] float), or None when normalized."""
        raise NotImplementedError

    def np_encode(self, leaf: ObsLeaf, x: np.ndarray) -> np.ndarray:
        """The numpy mirror of `module` (float32 [B, out_dim])."""
        raise NotImplementedError
