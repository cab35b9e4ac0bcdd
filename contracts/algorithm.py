"""What the rollout side must know of an algorithm (`learner.algo`), as plain data.

The algorithm classes live in `learner/algorithms/`; rollout workers never import them. The driver
reads these traits from the registry and hands them to each worker with its config.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AlgorithmTraits:
    """critic: the policy has a value network (the sampler records V(obs)); grouped: segments use
    the grouped layout (one episode per env per segment, GRPO) instead of continuing episodes."""

    critic: bool = True
    grouped: bool = False
