"""V-trace targets (Espeholt et al. 2018, IMPALA) over fixed [T, N] segments, vectorized over time.

With behaviour log-probs (the worker's) and target log-probs (the learner's current policy), the
importance ratio r_t = pi/mu gives rho_t = min(rho_bar, r_t) and c_t = lam * min(c_bar, r_t), and

    v_t - V_t = delta_t + gamma * c_t * cont_t * (v_{t+1} - V_{t+1}),
    delta_t  = rho_t * (r_t + gamma * V_next_t - V_t),

the same linear recurrence as GAE's, so it runs on GAE's log-depth scan. `cont_t` is 0 where the
episode stops after step t (terminated, truncated, or the next step is padding); V_next_t is
0 after a termination, the bootstrap value after a truncation (V of the final observation, from
the worker's critic), and V_T = last_value after the segment's last step. The policy-gradient
advantage is rho_t * (r_t + gamma * v_next_t - V_t), v_next_t built like V_next_t from v.
`compute_vtrace_reference` is the plain loop it is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..learner.gae import EpisodeEnds, next_values, reverse_linear_scan


@dataclass(frozen=True)
class Clipping:
    """V-trace's truncation: lam scales c_t; rho_bar and c_bar cap the importance ratio."""

    lam: float = 1.0
    rho_bar: float = 1.0
    c_bar: float = 1.0


def compute_vtrace(
    target_logp: Tensor,
    behaviour_logp: Tensor,
    rewards: Tensor,
    values: Tensor,
    ends: EpisodeEnds,
    *,
    gamma: float,
    clip: Clipping = Clipping(),
) -> tuple[Tensor, Tensor]:
    """V-trace value targets and policy-gradient advantages, with no Python loop over T.

    target_logp, behaviour_logp, rewards, values (the learner's current critic): [T, N]; `ends`
    where each step's chain stops (GAE's rule). Returns (vs, pg_advantages), both [T, N] float32,
    zero where mask is 0.
    """
    m = ends.mask.float()
    ratio = torch.exp((target_logp - behaviour_logp) * m)  # padding: ratio 1, never exp of garbage
    rho = ratio.clamp(max=clip.rho_bar)
    c = clip.lam * ratio.clamp(max=clip.c_bar)
    values = values.float()
    nxt, cont = next_values(values, ends)
    deltas = rho * (rewards.float() + gamma * nxt - values) * m
    vs = (values + reverse_linear_scan(gamma * c * cont, deltas)) * m
    vs_next, _ = next_values(vs, ends)
    pg = rho * (rewards.float() + gamma * vs_next - values) * m
    return vs, pg


def compute_vtrace_reference(
    target_logp: Tensor,
    behaviour_logp: Tensor,
    rewards: Tensor,
    values: Tensor,
    ends: EpisodeEnds,
    *,
    gamma: float,
    clip: Clipping = Clipping(),
) -> tuple[Tensor, Tensor]:
    """The obvious backward loop over T (vectorized over N); same contract as `compute_vtrace`."""
    terminated, truncated, bootstrap_value, last_value, mask = ends.tensors()
    lam, rho_bar, c_bar = clip.lam, clip.rho_bar, clip.c_bar
    steps = rewards.shape[0]
    vs = torch.zeros_like(rewards, dtype=torch.float32)
    pg = torch.zeros_like(rewards, dtype=torch.float32)
    acc = torch.zeros_like(last_value, dtype=torch.float32)  # v_{t+1} - V_{t+1}
    for t in range(steps - 1, -1, -1):
        valid = mask[t] > 0
        next_valid = mask[t + 1] > 0 if t + 1 < steps else torch.ones_like(valid)
        stop = truncated[t].bool() | ~next_valid
        alive = 1.0 - terminated[t].float()
        v_after = values[t + 1] if t + 1 < steps else last_value
        vs_after = vs[t + 1] if t + 1 < steps else last_value
        v_next = torch.where(stop, bootstrap_value[t], v_after) * alive
        vs_next = torch.where(stop, bootstrap_value[t], vs_after) * alive
        ratio = torch.exp(target_logp[t] - behaviour_logp[t])
        rho, c = ratio.clamp(max=rho_bar), lam * ratio.clamp(max=c_bar)
        delta = rho * (rewards[t] + gamma * v_next - values[t])
        cont = alive * (~stop).float()
        acc = torch.where(valid, delta + gamma * c * cont * acc, torch.zeros_like(acc))
        vs[t] = torch.where(valid, values[t] + acc, torch.zeros_like(acc))
        pg[t] = torch.where(valid, rho * (rewards[t] + gamma * vs_next - values[t]), torch.zeros_like(acc))
    return vs, pg
