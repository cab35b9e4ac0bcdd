"""Every action distribution tied twice: its torch log-probs and entropies to torch.distributions
(the reference), and its numpy acting mirror to its torch sampling on the same noise. Masks:
a masked choice is never sampled nor chosen greedily, holds no probability, adds no entropy."""

import itertools

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import distributions as D

from relay_rl.contracts.spaces import ActionSpec
from relay_rl.policy.distributions import DISTRIBUTIONS, distribution

SPECS = {
    "discrete": ActionSpec("discrete", 5),
    "multi_discrete": ActionSpec("multi_discrete", 7, nvec=(3, 4)),
    "multi_binary": ActionSpec("multi_binary", 4),
    "continuous": ActionSpec("continuous", 3),
}


def _case(kind, seed, batch=64, masked=False):
    spec = SPECS[kind]
    gen = torch.Generator().manual_seed(seed)
    params = torch.randn(batch, spec.param_size, generator=gen) * 3
    log_std = torch.randn(spec.size, generator=gen) * 0.5 if kind == "continuous" else None
    mask = None
    if masked:
        mask = torch.rand(batch, spec.param_size, generator=gen) < 0.5
    noise = distribution(kind).draw_noise(spec, batch, gen)
    return spec, params, log_std, mask, noise


def _reference(kind, spec, params, log_std, mask):
    """torch.distributions' version: a distribution whose log_prob and entropy sum over components."""

    def masked(logits, m):  # a row allowing nothing acts unmasked
        return logits if m is None else logits.masked_fill(~(m | ~m.any(-1, keepdim=True)), float("-inf"))

    if kind == "discrete":
        return D.Categorical(logits=masked(params, mask))
    if kind == "multi_discrete":
        parts = torch.split(params, list(spec.nvec), dim=-1)
        masks = torch.split(mask, list(spec.nvec), dim=-1) if mask is not None else [None] * len(parts)
        return [D.Categorical(logits=masked(p, m)) for p, m in zip(parts, masks, strict=True)]
    if kind == "multi_binary":
        return D.Independent(D.Bernoulli(logits=params), 1)
    return D.Independent(D.Normal(params, log_std.exp().expand_as(params)), 1)


def _ref_logp_entropy(kind, ref, actions):
    if kind == "multi_discrete":
        logp = sum(d.log_prob(actions[:, i]) for i, d in enumerate(ref))
        entropy = sum(d.entropy() for d in ref)
        return logp, entropy
    target = actions.float() if kind != "discrete" else actions
    return ref.log_prob(target), ref.entropy()


def test_the_registry_covers_every_action_kind():
    assert set(DISTRIBUTIONS) == {"discrete", "multi_discrete", "multi_binary", "continuous"}


@given(kind=st.sampled_from(sorted(SPECS)), seed=st.integers(0, 10_000))
@settings(max_examples=40, deadline=None)
def test_log_probs_and_entropies_match_torch_distributions(kind, seed):
    spec, params, log_std, _, noise = _case(kind, seed)
    dist = distribution(kind)
    actions = dist.sample(spec, params, noise, None, log_std)
    logp, entropy = dist.log_prob_entropy(spec, params, actions, None, log_std)
    ref_logp, ref_entropy = _ref_logp_entropy(kind, _reference(kind, spec, params, log_std, None), actions)
    torch.testing.assert_close(logp, ref_logp.float(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(entropy, ref_entropy.float(), atol=1e-4, rtol=1e-4)


@given(kind=st.sampled_from(["discrete", "multi_discrete"]), seed=st.integers(0, 10_000))
@settings(max_examples=40, deadline=None)
def test_masked_choices_hold_no_probability_and_are_never_taken(kind, seed):
    spec, params, _, mask, noise = _case(kind, seed, masked=True)
    dist = distribution(kind)
    actions = dist.sample(spec, params, noise, mask, None)
    greedy = dist.deterministic(spec, params, mask)
    open_mask = mask.clone()
    bounds = np.cumsum((0, *(spec.nvec or (spec.size,))))
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        part = open_mask[:, lo:hi]
        part |= ~part.any(-1, keepdim=True)  # a row allowing nothing acts unmasked
        for chosen in (actions, greedy):
            col = chosen if kind == "discrete" else chosen[:, i]
            assert part.gather(-1, col.long().unsqueeze(-1)).all()
    logp, entropy = dist.log_prob_entropy(spec, params, actions, mask, None)
    ref_logp, ref_entropy = _ref_logp_entropy(kind, _reference(kind, spec, params, None, mask), actions)
    torch.testing.assert_close(logp, ref_logp.float(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(entropy, ref_entropy.float(), atol=1e-4, rtol=1e-4)
    # numpy takes the same actions
    np_actions, np_logp = dist.np_act(spec, params.numpy(), noise.numpy(), mask.numpy(), None)
    np.testing.assert_array_equal(np_actions, actions.numpy())
    np.testing.assert_allclose(np_logp, logp.numpy(), atol=1e-4)


@given(kind=st.sampled_from(sorted(SPECS)), seed=st.integers(0, 10_000))
@settings(max_examples=40, deadline=None)
def test_the_numpy_mirror_acts_as_torch_on_the_same_noise(kind, seed):
    spec, params, log_std, _, noise = _case(kind, seed)
    dist = distribution(kind)
    actions = dist.sample(spec, params, noise, None, log_std)
    logp, _ = dist.log_prob_entropy(spec, params, actions, None, log_std)
    ls = None if log_std is None else log_std.numpy()
    np_actions, np_logp = dist.np_act(spec, params.numpy(), noise.numpy(), None, ls)
    if kind == "continuous":
        np.testing.assert_allclose(np_actions, actions.numpy(), atol=1e-5)
    else:
        np.testing.assert_array_equal(np_actions, actions.numpy())
    assert np_actions.shape == (64, *spec.shape) and np_logp.dtype == np.float32
    np.testing.assert_allclose(np_logp, logp.numpy(), atol=1e-4, rtol=1e-5)


def test_sampling_follows_the_distribution():
    """Frequencies from the caller's uniforms match the probabilities (inverse-CDF, per bit)."""
    spec = SPECS["multi_binary"]
    params = torch.tensor([[-2.0, 0.0, 1.0, 3.0]]).expand(20_000, 4)
    noise = distribution("multi_binary").draw_noise(spec, 20_000, torch.Generator().manual_seed(0))
    bits = distribution("multi_binary").sample(spec, params, noise, None, None).float().mean(0)
    torch.testing.assert_close(bits, torch.sigmoid(params[0]), atol=0.02, rtol=0)
    spec = SPECS["discrete"]
    logits = torch.tensor([[0.0, 1.0, -1.0, 2.0, 0.5]]).expand(20_000, 5)
    mask = torch.tensor([[True, True, False, True, True]]).expand(20_000, 5)
    noise = distribution("discrete").draw_noise(spec, 20_000, torch.Generator().manual_seed(1))
    chosen = distribution("discrete").sample(spec, logits, noise, mask, None)
    freq = torch.bincount(chosen, minlength=5).float() / 20_000
    want = torch.softmax(logits[0].masked_fill(~mask[0], float("-inf")), -1)
    torch.testing.assert_close(freq, want, atol=0.015, rtol=0)
