"""What an action distribution provides: its noise, its torch math (sampling from caller noise,
log-probs, entropy, the greedy action) and the numpy mirror of acting.

Shapes: params [B, param_size] (logits or means, float32), mask [B, param_size] bool or None,
noise as `ActionSpec.noise_shape`, actions [B, *ActionSpec.shape]. `log_std` [A] is the
Gaussian's state-independent parameter (None for the others). Log-probs and entropies are
float32 [B] whatever the autocast dtype: ratios of exp(logp) are what PPO clips.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from ...contracts.spaces import ActionSpec

# A masked logit: exp() of it is exactly 0 in float32, and it stays finite, so entropies and
# gradients never meet inf - inf.
MASKED_LOGIT = -1e9


def usable_mask(mask: Tensor | None) -> Tensor | None:
    """The mask with rows that allow nothing opened up (an env that masks every choice would
    leave no action to take; such a row acts unmasked)."""
    if mask is None:
        return None
    mask = mask.bool()
    return mask | ~mask.any(-1, keepdim=True)


def usable_mask_np(mask: np.ndarray | None) -> np.ndarray | None:
    if mask is None:
        return None
    mask = mask.astype(bool, copy=False)
    return mask | ~mask.any(axis=-1, keepdims=True)


def env_shape(space: Any) -> tuple[int, ...]:
    """The env's own shape of a vector action, kept where it is not flat (() where it is)."""
    return tuple(space.shape) if len(space.shape) > 1 else ()


def starts(start: Any) -> tuple[int, ...]:
    """A space's first choices, or () where every one is 0 (the common case reads as before)."""
    flat = tuple(int(v) for v in np.asarray(start).reshape(-1))
    return flat if any(flat) else ()


class ActionDistribution:
    """One family of action distributions over an ActionSpec. `space_name`: the gymnasium action
    space it acts in, as an error line names it."""

    space_name: ClassVar[str] = ""
    # The family has a learned state-independent log std beside its head (the policy's `log_std`
    # parameter [A], in its state dict and the numpy mirror).
    learned_log_std: ClassVar[bool] = False

    def from_space(self, space: Any) -> ActionSpec | None:
        """The ActionSpec of an env's (single) gymnasium action space where this family acts in
        it, None where the space is not its kind; ValueError (one line) where it is its kind but
        not one it can act in."""
        raise NotImplementedError

    def draw_noise(self, spec: ActionSpec, batch: int, generator: torch.Generator) -> Tensor:
        """Exploration noise on the CPU from a seeded generator (the same bits on any device):
        uniforms unless the family samples from normals."""
        return torch.rand(spec.noise_shape(batch), generator=generator)

    def sample(
        self, spec: ActionSpec, params: Tensor, noise: Tensor, mask: Tensor | None, log_std: Tensor | None
    ) -> Tensor:
        raise NotImplementedError

    def log_prob_entropy(
        self, spec: ActionSpec, params: Tensor, actions: Tensor, mask: Tensor | None, log_std: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def deterministic(self, spec: ActionSpec, params: Tensor, mask: Tensor | None) -> Tensor:
        """The greedy action [B, *act]."""
        raise NotImplementedError

    def summary(self, spec: ActionSpec, params: Tensor, mask: Tensor | None) -> Tensor:
        """What precision checks compare, float32 [B, param_size]: the probabilities of every
        choice (0 where masked) or bit, or the Gaussian's mean."""
        raise NotImplementedError

    def np_act(
        self,
        spec: ActionSpec,
        params: np.ndarray,
        noise: np.ndarray,
        mask: np.ndarray | None,
        log_std: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(actions [B, *act], logp [B] float32) in numpy, as `sample` then `log_prob_entropy`."""
        raise NotImplementedError
