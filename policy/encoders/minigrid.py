"""`minigrid`: MiniGrid's symbolic view, a uint8 Box [H, W, 3] holding an (object, colour, state)
id per cell (`minigrid.core.constants`), as one one-hot block per id: [B, H * W * (11 + 6 + 3)].

The ids are names, not quantities: a key (5) is no nearer a ball (6) than a wall (2). Read by the
rule (`flat`, one normalized scalar per id), "is the object in view the one I saw before?" is a
comparison of two scalars the network must first learn to decode; one-hot it is a dot product.
MiniGrid-MemoryS7 is where that shows (docs/benchmarks.md). Ids outside MiniGrid's ranges are
clamped, as `one_hot` clamps them. The sizes are MiniGrid's constants, written out so that the
policy layer never imports an env package; a test ties them to minigrid's own.
"""

from __future__ import annotations

from ...contracts.spaces import ObsLeaf
from ...policy.encoders.one_hot import OneHotEncoder

# len(OBJECT_TO_IDX), len(COLOR_TO_IDX), len(STATE_TO_IDX) of minigrid.core.constants
CELL_IDS = (11, 6, 3)


class MiniGridEncoder(OneHotEncoder):
    def problem(self, leaf: ObsLeaf) -> str | None:
        if leaf.kind == "box" and len(leaf.shape) == 3 and leaf.shape[-1] == len(CELL_IDS):
            return None
        return "minigrid reads MiniGrid's symbolic view, a Box [H, W, 3] of (object, colour, state) ids"

    def nvec(self, leaf: ObsLeaf) -> tuple[int, ...]:
        return CELL_IDS * (leaf.numbers // len(CELL_IDS))
