"""Token-level GAE of completions (PPO with a critic on a causal LM): a round's completions padded
to `generation.max_new_tokens` are a fixed `[C, B]` segment (C = max_new_tokens positions, B
completions), each completion one episode that ends at its last token, so relay's own log-depth
GAE scan (`learner/gae.py` compute_gae) computes their advantages with no loop over tokens.

The rewards are InstructGPT's: the reward of the completion at its last token, less
`kl_coef` x the per-token KL to the reference at every token (`token_rewards`). A completion ends
there whether it wrote its end token or ran out of positions: nothing follows a completion, so
no value is bootstrapped past it (verl's and OpenRLHF's rule). `token_gae_plain` is the plain
per-completion loop it is tested against.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...learner.gae import EpisodeEnds, compute_gae


def last_token(mask: Tensor) -> Tensor:
    """[B, C] 1.0 at each completion's last token (mask [B, C]: 1 through it, 0 after), else 0;
    an empty completion (no token) has none."""
    m = mask.float()
    after = torch.zeros_like(m)
    after[:, :-1] = m[:, 1:]
    return m * (1.0 - after)


def token_rewards(score: Tensor, mask: Tensor, kl: Tensor | None = None, kl_coef: float = 0.0) -> Tensor:
    """Per-token rewards [B, C]: `score` [B] at each completion's last token, less kl_coef x the
    per-token KL [B, C] to the reference at every token; 0 past the end."""
    out = last_token(mask) * score.float().unsqueeze(-1)
    if kl is not None and kl_coef:
        out = out - kl_coef * kl.float() * mask.float()
    return out


def token_gae(
    rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float = 1.0, lam: float = 0.95
) -> tuple[Tensor, Tensor]:
    """(advantages, returns), both [B, C] float32 and 0 past each completion's end, of per-token
    rewards and values [B, C] under mask [B, C], by the [C, B] segment scan."""
    m = mask.float().t()
    ends = EpisodeEnds(
        terminated=last_token(mask).t(),
        truncated=torch.zeros_like(m),
        bootstrap_value=torch.zeros_like(m),
        last_value=torch.zeros_like(m[0]),
        mask=m,
    )
    adv, ret = compute_gae(rewards.float().t(), values.float().t(), ends, gamma=gamma, lam=lam)
    return adv.t().contiguous(), ret.t().contiguous()


def token_gae_plain(
    rewards: list[list[float]], values: list[list[float]], lengths: list[int], gamma: float, lam: float
) -> list[list[float]]:
    """`token_gae`'s advantages written out, completion by completion, token by token backwards
    (each row's first `lengths[b]` positions are its tokens; the rest are 0)."""
    out = []
    for r, v, n in zip(rewards, values, lengths, strict=True):
        adv = [0.0] * len(r)
        running = 0.0
        for t in range(n - 1, -1, -1):
            nxt = v[t + 1] if t + 1 < n else 0.0
            running = r[t] + gamma * nxt - v[t] + gamma * lam * running
            adv[t] = running
        out.append(adv)
    return out
