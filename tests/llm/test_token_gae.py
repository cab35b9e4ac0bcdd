"""Token-level GAE of completions (#61's PPO with a critic): relay's log-depth scan over the
[max_new_tokens, B] segment tied to the plain per-completion loop (hypothesis) and to a case
computed by hand, masks included; InstructGPT's per-token rewards (the score at the last token,
the KL penalty at every token)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_rl.learner.lm.token_gae import last_token, token_gae, token_gae_plain, token_rewards


def _mask(lengths: list[int], width: int) -> torch.Tensor:
    return (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).float()


def test_token_gae_by_hand():
    """One completion of 3 tokens in 4 positions (one of padding), score 1, KL 0.1/0.2/0.3 at
    kl_coef 0.5, values 0.5/0.6/0.7, gamma 1, lambda 0.9; beside it one that filled every
    position (it ends at the last one: nothing is bootstrapped past it) and an empty one."""
    mask = _mask([3, 4, 0], 4)
    assert last_token(mask).tolist() == [[0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]]
    kl = torch.tensor([[0.1, 0.2, 0.3, 9.0], [0.0] * 4, [9.0] * 4])
    rewards = token_rewards(torch.tensor([1.0, 2.0, 5.0]), mask, kl, kl_coef=0.5)
    assert rewards[0].tolist() == pytest.approx([-0.05, -0.1, 0.85, 0.0])
    assert rewards[1].tolist() == pytest.approx([0.0, 0.0, 0.0, 2.0]) and rewards[2].abs().sum() == 0
    values = torch.tensor([[0.5, 0.6, 0.7, 9.0], [1.0, 1.0, 1.0, 1.0], [3.0] * 4])
    adv, ret = token_gae(rewards, values, mask, gamma=1.0, lam=0.9)
    # deltas 0.05, 0.0, 0.15 (the last: 0.85 - 0.7, no value after it); A_t = delta_t + 0.9 A_t+1
    assert adv[0].tolist() == pytest.approx([0.1715, 0.135, 0.15, 0.0])
    assert ret[0].tolist() == pytest.approx([0.6715, 0.735, 0.85, 0.0])
    # the full row: deltas 0, 0, 0, 1 (2 - 1); A = 0.729, 0.81, 0.9, 1
    assert adv[1].tolist() == pytest.approx([0.729, 0.81, 0.9, 1.0])
    assert adv[2].abs().sum() == 0 and ret[2].abs().sum() == 0


values_st = st.floats(min_value=-10, max_value=10, allow_nan=False, width=32)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 9).flatmap(
        lambda width: st.lists(
            st.tuples(
                st.integers(0, width),
                st.lists(st.tuples(values_st, values_st), min_size=width, max_size=width),
            ),
            min_size=1,
            max_size=6,
        ).map(lambda rows: (width, rows))
    ),
    st.sampled_from([1.0, 0.99]),
    st.sampled_from([1.0, 0.95, 0.0]),
)
def test_token_gae_is_its_plain_loop(case, gamma, lam):
    width, rows = case
    lengths = [n for n, _ in rows]
    r = [[x for x, _ in row] for _, row in rows]
    v = [[y for _, y in row] for _, row in rows]
    mask = _mask(lengths, width)
    adv, ret = token_gae(torch.tensor(r) * mask, torch.tensor(v), mask, gamma=gamma, lam=lam)
    kept = [[x * float(k < n) for k, x in enumerate(row)] for row, n in zip(r, lengths, strict=True)]
    plain = torch.tensor(token_gae_plain(kept, v, lengths, gamma, lam))
    assert torch.allclose(adv, plain, atol=1e-4, rtol=1e-4), (adv, plain)
    assert torch.allclose(ret, (adv + torch.tensor(v)) * mask, atol=1e-5)  # returns: A + V on tokens, 0 after
