"""Generalized advantage estimation over fixed [T, N] segments, vectorized over time.

GAE is the reverse linear recurrence  A_t = delta_t + g_t * A_{t+1}  with g_t = gamma * lam * c_t,
where c_t = 0 where the episode stops after step t (terminated, truncated, or the next step is
padding). `compute_gae` evaluates it with a log-depth odd/even scan (O(log T) torch ops, O(T N)
work); `compute_gae_reference` is the plain loop it is tested against.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class EpisodeEnds:
    """How each step's episode chain ends in a fixed [T, N] segment (GAE's and V-trace's input).

    terminated, truncated, bootstrap_value (V of the final observation where truncated), mask
    (0 marks padding): [T, N]; last_value: [N] (V of the observation after the last step).
    """

    terminated: Tensor
    truncated: Tensor
    bootstrap_value: Tensor
    last_value: Tensor
    mask: Tensor

    @classmethod
    def of(cls, fields: Mapping[str, Tensor]) -> EpisodeEnds:
        """The ends named in a segment's (or a batch's) fields."""
        return cls(
            *(fields[name] for name in ("terminated", "truncated", "bootstrap_value", "last_value", "mask"))
        )

    def tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(terminated, truncated, bootstrap_value, last_value, mask), for the plain loops."""
        return self.terminated, self.truncated, self.bootstrap_value, self.last_value, self.mask


def next_values(values: Tensor, ends: EpisodeEnds) -> tuple[Tensor, Tensor]:
    """(the value after each step, 1 where the chain continues into the next step), both [T, N]
    float32: the one chain rule GAE and V-trace share.

    The value after step t is 0 after a termination, the bootstrap value after a truncation, else
    V_{t+1} (last_value after the last step). A valid step followed by padding ends its chain
    there: the producer flags it truncated, and even where it did not, no value from a padded step
    may leak backwards. Flags are combined by float arithmetic, in place: on CPU, torch.where and
    masked_fill run several times slower than a multiply, and at large T x N a new allocation
    (page faults) costs more than the op that fills it.
    """
    m = ends.mask.float()
    not_term = 1.0 - ends.terminated.float()
    cut = ends.truncated.float().clone()
    cut[:-1].sub_(m[1:]).add_(1.0).clamp_(max=1.0)  # max(truncated, next step is padding)
    keep = 1.0 - cut
    after = torch.empty_like(cut)
    after[:-1].copy_(values[1:])
    after[-1].copy_(ends.last_value)
    # cut is exactly 0 or 1, so this picks one of the two values exactly (no lerp rounding).
    after.mul_(keep).addcmul_(ends.bootstrap_value.float(), cut).mul_(not_term)
    return after, keep.mul_(not_term)


def reverse_linear_scan(coef: Tensor, x: Tensor) -> Tensor:
    """y_t = x_t + coef_t * y_{t+1} (y_T = 0) along dim 0, in O(log T) vectorized steps.

    coef, x: [T, ...]. Odd/even reduction: fold neighbouring pairs into one affine step, solve the
    half-length problem recursively, then fill in the other half with one multiply-add.
    """
    length = x.shape[0]
    if length == 1:
        return x.clone()
    if length % 2:
        # Pad with an identity step at the end (coef 0, x 0) so pairs line up.
        coef = torch.cat([coef, torch.zeros_like(coef[:1])], dim=0)
        x = torch.cat([x, torch.zeros_like(x[:1])], dim=0)
    c_even, c_odd = coef[0::2], coef[1::2]
    x_even, x_odd = x[0::2], x[1::2]
    # Pair (2i, 2i+1) maps y_{2i+2} to y_{2i} = x_2i + c_2i x_2i+1 + c_2i c_2i+1 y_{2i+2}.
    y_even = reverse_linear_scan(c_even * c_odd, torch.addcmul(x_even, c_even, x_odd))
    out = torch.empty_like(x)
    out[0::2] = y_even
    torch.addcmul(x_odd[:-1], c_odd[:-1], y_even[1:], out=out[1::2][:-1])
    out[-1] = x_odd[-1]  # y_{T} = 0 past the end
    return out[:length]


def compute_gae(
    rewards: Tensor, values: Tensor, ends: EpisodeEnds, *, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimates over a fixed [T, N] segment, with no Python loop over T.

    rewards, values: [T, N]; `ends` says where each step's chain stops (`terminated` stops
    bootstrapping, `truncated` bootstraps from `bootstrap_value`, `mask` 0 marks padding).
    Returns (advantages, returns), both [T, N] float32; zero where mask is 0.
    """
    after, coef = next_values(values, ends)
    m = ends.mask.float()
    deltas = after.mul_(gamma).add_(rewards).sub_(values).mul_(m)
    advantages = reverse_linear_scan(coef.mul_(gamma * lam), deltas).mul_(m)
    returns = (advantages + values) * m
    return advantages, returns


def compute_gae_reference(
    rewards: Tensor, values: Tensor, ends: EpisodeEnds, *, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """The obvious loop over T (vectorized over N); same contract as `compute_gae`."""
    terminated, truncated, bootstrap_value, last_value, mask = ends.tensors()
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards, dtype=torch.float32)
    running = torch.zeros_like(last_value, dtype=torch.float32)
    for t in range(num_steps - 1, -1, -1):
        next_valid = mask[t + 1] > 0 if t + 1 < num_steps else torch.ones_like(mask[t], dtype=torch.bool)
        next_value = values[t + 1] if t + 1 < num_steps else last_value
        stop = truncated[t].bool() | ~next_valid
        next_value = torch.where(stop, bootstrap_value[t], next_value) * (1.0 - terminated[t].float())
        delta = rewards[t] + gamma * next_value - values[t]
        carry = (1.0 - terminated[t].float()) * (1.0 - stop.float())
        running = torch.where(mask[t] > 0, delta + gamma * lam * carry * running, 0.0)
        advantages[t] = running
    return advantages, torch.where(mask > 0, advantages + values, 0.0)
