"""GAE: the vectorized scan against the plain loop, hand-computed cases, padding and truncation."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_rl.learner.gae import compute_gae, compute_gae_reference
from tests.helpers import gae_of


def _random_segment(seed: int, T: int, N: int, p_term: float, p_trunc: float, p_pad: float):
    g = torch.Generator().manual_seed(seed)
    term = torch.rand(T, N, generator=g) < p_term
    trunc = (torch.rand(T, N, generator=g) < p_trunc) & ~term
    return dict(
        rewards=torch.randn(T, N, generator=g),
        values=torch.randn(T, N, generator=g),
        terminated=term.float(),
        truncated=trunc.float(),
        bootstrap_value=torch.randn(T, N, generator=g),
        last_value=torch.randn(N, generator=g),
        mask=(torch.rand(T, N, generator=g) >= p_pad).float(),
    )


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    T=st.integers(1, 300),
    N=st.integers(1, 9),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
    p_term=st.sampled_from([0.0, 0.05, 0.5]),
    p_trunc=st.sampled_from([0.0, 0.05, 0.3]),
    p_pad=st.sampled_from([0.0, 0.1, 0.5]),
)
def test_vectorized_matches_reference(seed, T, N, gamma, lam, p_term, p_trunc, p_pad):
    seg = _random_segment(seed, T, N, p_term, p_trunc, p_pad)
    adv, ret = gae_of(compute_gae, **seg, gamma=gamma, lam=lam)
    ref_adv, ref_ret = gae_of(compute_gae_reference, **seg, gamma=gamma, lam=lam)
    assert adv.shape == ret.shape == (T, N)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, ref_adv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret, ref_ret, atol=1e-5, rtol=1e-5)


def _single_env(rewards, values, terminated=None, truncated=None, bootstrap=None, last_value=0.0, mask=None):
    T = len(rewards)

    def col(xs, default):
        return torch.tensor(xs if xs is not None else [default] * T, dtype=torch.float32)[:, None]

    return dict(
        rewards=col(rewards, 0.0),
        values=col(values, 0.0),
        terminated=col(terminated, 0.0),
        truncated=col(truncated, 0.0),
        bootstrap_value=col(bootstrap, 0.0),
        last_value=torch.tensor([last_value]),
        mask=col(mask, 1.0),
    )


def test_constant_critic_terminal_reward_by_hand():
    """V = 1 everywhere, reward 1 only at the terminal 3rd step (SB3's pen-and-paper case)."""
    gamma, lam = 0.5, 0.5
    seg = _single_env([0.0, 0.0, 1.0], [1.0, 1.0, 1.0], terminated=[0, 0, 1], last_value=7.0)
    adv, ret = gae_of(compute_gae, **seg, gamma=gamma, lam=lam)
    # deltas: t0 = 0 + .5*1 - 1 = -.5, t1 = -.5, t2 = 1 + 0 - 1 = 0 (terminal: no bootstrap of 7)
    d = [-0.5, -0.5, 0.0]
    expected = [d[0] + 0.25 * (d[1] + 0.25 * d[2]), d[1] + 0.25 * d[2], d[2]]
    torch.testing.assert_close(adv[:, 0], torch.tensor(expected))
    torch.testing.assert_close(ret[:, 0], torch.tensor(expected) + 1.0)


def test_truncation_bootstraps_from_final_value_not_next_episode():
    """At a time limit the target uses V(final obs), never the next episode's first value."""
    seg = _single_env([1.0, 1.0], [0.0, 100.0], truncated=[1, 0], bootstrap=[3.0, 0.0], last_value=0.0)
    adv, _ = gae_of(compute_gae, **seg, gamma=0.9, lam=1.0)
    assert adv[0, 0].item() == pytest.approx(1.0 + 0.9 * 3.0)
    assert adv[1, 0].item() == pytest.approx(1.0 + 0.9 * 0.0 - 100.0)


def test_termination_stops_bootstrap():
    seg = _single_env([1.0, 5.0], [0.0, 0.0], terminated=[1, 0], bootstrap=[99.0, 0.0], last_value=10.0)
    adv, _ = gae_of(compute_gae, **seg, gamma=1.0, lam=1.0)
    assert adv[0, 0].item() == pytest.approx(1.0)  # neither the next episode nor the bootstrap value leaks in
    assert adv[1, 0].item() == pytest.approx(5.0 + 10.0)


def test_padding_is_zero_and_does_not_leak():
    seg = _single_env(
        [1.0, 1000.0, 1.0],
        [0.0, 500.0, 0.0],
        truncated=[1, 0, 0],
        bootstrap=[2.0, 0, 0],
        mask=[1, 0, 1],
        last_value=0.0,
    )
    adv, ret = gae_of(compute_gae, **seg, gamma=0.99, lam=0.95)
    assert adv[1, 0].item() == 0.0 and ret[1, 0].item() == 0.0
    assert adv[0, 0].item() == pytest.approx(1.0 + 0.99 * 2.0)


def test_unflagged_step_before_padding_bootstraps_instead_of_leaking():
    """A producer that forgot the truncated flag still gets no value from the padded step."""
    seg = _single_env([1.0, 0.0], [0.0, 1e6], bootstrap=[4.0, 0.0], mask=[1, 0], last_value=1e6)
    adv, _ = gae_of(compute_gae, **seg, gamma=0.5, lam=0.5)
    assert adv[0, 0].item() == pytest.approx(1.0 + 0.5 * 4.0)


def test_gamma_zero_gives_one_step_td_errors():
    seg = _random_segment(1, 64, 4, 0.1, 0.1, 0.1)
    adv, _ = gae_of(compute_gae, **seg, gamma=0.0, lam=0.95)
    expected = (seg["rewards"] - seg["values"]) * seg["mask"]
    torch.testing.assert_close(adv, expected)
