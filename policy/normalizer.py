"""Running observation normalizer with ML-Agents' formula and float32 statistics.

normalize(obs) = clamp((obs - mean) / sqrt(var_sum / steps), -5, 5), no epsilon (as ML-Agents).
Statistics are merged with Chan's parallel update so workers can gather them and the learner
can combine them in any order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

CLIP = 5.0


@dataclass(frozen=True)
class Moments:
    """Sufficient statistics of a batch: count, mean [D] and sum of squared deviations [D]."""

    count: float
    mean: Tensor
    var_sum: Tensor

    @staticmethod
    def of(batch: Tensor) -> Moments:
        """Moments of a [B, D] batch, computed in float32 (float16 would overflow var_sum at ~6.5e4)."""
        x = batch.detach().reshape(batch.shape[0], -1).float()
        mean = x.mean(dim=0)
        return Moments(float(x.shape[0]), mean, ((x - mean) ** 2).sum(dim=0))

    def merge(self, other: Moments) -> Moments:
        """Chan et al. parallel combination; exact for any split of the data."""
        if other.count == 0:
            return self
        total = self.count + other.count
        delta = other.mean.to(self.mean) - self.mean
        mean = self.mean + delta * (other.count / total)
        var_sum = (
            self.var_sum + other.var_sum.to(self.var_sum) + delta**2 * (self.count * other.count / total)
        )
        return Moments(total, mean, var_sum)

    def to_numpy(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean.cpu().numpy(), "var_sum": self.var_sum.cpu().numpy()}

    @staticmethod
    def from_numpy(d: dict[str, Any]) -> Moments:
        return Moments(float(d["count"]), torch.tensor(d["mean"]).float(), torch.tensor(d["var_sum"]).float())


class ObsNormalizer(nn.Module):
    """Float32 running statistics as buffers (so they ride along in the policy's state_dict).

    Starts, as ML-Agents does, from one pseudo-observation with mean 0 and variance 1, so the
    formula never divides by zero. `.half()`/`.to(bfloat16)` leave the statistics float32.
    """

    _STAT_NAMES = ("mean", "var_sum", "steps")
    mean: Tensor  # [*shape]
    var_sum: Tensor  # [*shape]
    steps: Tensor  # []

    def __init__(self, shape: tuple[int, ...], enabled: bool = True) -> None:
        super().__init__()
        self.enabled = enabled
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float32))
        self.register_buffer("var_sum", torch.ones(shape, dtype=torch.float32))
        self.register_buffer("steps", torch.ones((), dtype=torch.float32))

    def _apply(self, fn: Any, recurse: bool = True) -> ObsNormalizer:
        # Keep the float32 originals: casting var_sum ~1e5 to float16 and back would give inf.
        saved = {name: getattr(self, name) for name in self._STAT_NAMES}
        super()._apply(fn, recurse)
        for name, original in saved.items():
            self._buffers[name] = original.to(device=getattr(self, name).device, dtype=torch.float32)
        return self

    @staticmethod
    def np_stats(state: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(mean, 1 / std) from this module's own state dict, as float32 arrays: the numpy
        mirror's normalizer (policy/numpy_mirror.py)."""
        mean, var_sum, steps = (state[name] for name in ObsNormalizer._STAT_NAMES)
        return mean, 1.0 / np.sqrt(var_sum / steps)

    @property
    def moments(self) -> Moments:
        return Moments(float(self.steps.item()), self.mean, self.var_sum)

    def std(self) -> Tensor:
        """sqrt(var_sum / steps), float32 (no epsilon: the statistics start from variance 1)."""
        return torch.sqrt(self.var_sum / self.steps)

    @torch.no_grad()
    def update(self, moments: Moments) -> None:
        """Fold a batch's (or a worker's) moments into the running statistics."""
        merged = self.moments.merge(
            Moments(moments.count, moments.mean.to(self.mean), moments.var_sum.to(self.mean))
        )
        self.mean.copy_(merged.mean)
        self.var_sum.copy_(merged.var_sum)
        self.steps.fill_(merged.count)

    def forward(self, obs: Tensor) -> Tensor:
        """[..., *shape] observations in any float dtype -> normalized, same dtype as the input."""
        if not self.enabled:
            return obs
        x = obs.float()
        out = torch.clamp((x - self.mean) / torch.sqrt(self.var_sum / self.steps), -CLIP, CLIP)
        return out.to(obs.dtype) if obs.is_floating_point() else out
