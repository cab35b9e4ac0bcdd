"""V-trace: the log-depth scan against the plain loop (random shapes, ratios, terminations,
truncations and padding), on-policy agreement with GAE, truncated importance weights by hand."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_rl.learner.gae import compute_gae
from relay_rl.learner.vtrace import compute_vtrace, compute_vtrace_reference
from tests.helpers import gae_of, vtrace_of


def _segment(seed: int, T: int, N: int, p_term: float, p_trunc: float, p_pad: float, spread: float):
    g = torch.Generator().manual_seed(seed)
    term = torch.rand(T, N, generator=g) < p_term
    trunc = (torch.rand(T, N, generator=g) < p_trunc) & ~term
    pad = torch.rand(T, N, generator=g) < p_pad
    behaviour = torch.randn(T, N, generator=g)
    return dict(
        target_logp=behaviour + spread * torch.randn(T, N, generator=g),
        behaviour_logp=behaviour,
        rewards=torch.randn(T, N, generator=g),
        values=torch.randn(T, N, generator=g),
        terminated=term.float(),
        truncated=trunc.float(),
        bootstrap_value=torch.randn(T, N, generator=g) * trunc,
        last_value=torch.randn(N, generator=g),
        mask=(~pad).float(),
    )


@settings(max_examples=120, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    T=st.integers(1, 40),
    N=st.integers(1, 6),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
    rho_bar=st.floats(0.1, 5.0),
    c_bar=st.floats(0.1, 5.0),
    p_term=st.floats(0.0, 0.3),
    p_trunc=st.floats(0.0, 0.3),
    p_pad=st.floats(0.0, 0.5),
    spread=st.floats(0.0, 2.0),
)
def test_scan_matches_the_loop(seed, T, N, gamma, lam, rho_bar, c_bar, p_term, p_trunc, p_pad, spread):
    seg = _segment(seed, T, N, p_term, p_trunc, p_pad, spread)
    kw = dict(gamma=gamma, lam=lam, rho_bar=rho_bar, c_bar=c_bar)
    vs, pg = vtrace_of(compute_vtrace, **seg, **kw)
    vs_ref, pg_ref = vtrace_of(compute_vtrace_reference, **seg, **kw)
    torch.testing.assert_close(vs, vs_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pg, pg_ref, atol=1e-4, rtol=1e-4)
    assert (vs[seg["mask"] == 0] == 0).all() and (pg[seg["mask"] == 0] == 0).all()


def test_on_policy_v_trace_is_gae():
    """pi = mu: v_s - V_s is GAE(lambda)'s advantage; with lambda = 1 the policy-gradient
    advantage is GAE's too."""
    seg = _segment(3, 30, 4, 0.05, 0.05, 0.1, spread=0.0)
    gae_args = {k: v for k, v in seg.items() if not k.endswith("logp")}
    for lam in (0.95, 1.0):
        vs, pg = vtrace_of(compute_vtrace, **seg, gamma=0.99, lam=lam)
        adv, ret = gae_of(compute_gae, **gae_args, gamma=0.99, lam=lam)
        torch.testing.assert_close(vs, ret, atol=1e-5, rtol=1e-5)
        if lam == 1.0:
            torch.testing.assert_close(pg, adv, atol=1e-5, rtol=1e-5)


def test_truncated_importance_weights_by_hand():
    """One step, then the segment ends: v = V + rho (r + gamma V_T - V), rho = min(rho_bar, pi/mu)."""
    one = torch.ones(1, 1)
    zero = torch.zeros(1, 1)
    for log_ratio, rho_bar, rho in (
        (math.log(3.0), 1.0, 1.0),
        (math.log(0.5), 1.0, 0.5),
        (math.log(3.0), 2.0, 2.0),
    ):
        vs, pg = vtrace_of(
            compute_vtrace,
            target_logp=torch.full((1, 1), log_ratio),
            behaviour_logp=zero,
            rewards=one,
            values=torch.full((1, 1), 0.5),
            terminated=zero,
            truncated=zero,
            bootstrap_value=zero,
            last_value=torch.full((1,), 2.0),
            mask=one,
            gamma=0.9,
            rho_bar=rho_bar,
        )
        expected = 0.5 + rho * (1.0 + 0.9 * 2.0 - 0.5)
        assert math.isclose(float(vs), expected, rel_tol=1e-6)
        assert math.isclose(float(pg), rho * (1.0 + 0.9 * 2.0 - 0.5), rel_tol=1e-6)


def test_termination_cuts_the_trace_and_truncation_bootstraps():
    T, N = 3, 1
    base = dict(
        target_logp=torch.zeros(T, N),
        behaviour_logp=torch.zeros(T, N),
        rewards=torch.ones(T, N),
        values=torch.zeros(T, N),
        bootstrap_value=torch.tensor([[0.0], [5.0], [0.0]]),
        last_value=torch.tensor([100.0]),
        mask=torch.ones(T, N),
    )
    term = torch.tensor([[1.0], [0.0], [0.0]])
    trunc = torch.tensor([[0.0], [1.0], [0.0]])
    vs, _ = vtrace_of(compute_vtrace, **base, terminated=term, truncated=trunc, gamma=0.5)
    # step 0 terminates: 1; step 1 truncates onto V(final) = 5: 1 + 2.5; step 2: 1 + 0.5 * 100
    torch.testing.assert_close(vs[:, 0], torch.tensor([1.0, 3.5, 51.0]))
