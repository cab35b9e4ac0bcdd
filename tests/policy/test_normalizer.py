"""Observation normalizer: ML-Agents' formula, float32 statistics, parallel merge."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_rl.policy.normalizer import CLIP, Moments, ObsNormalizer


def test_formula_matches_mlagents():
    norm = ObsNormalizer((3,))
    norm.mean.copy_(torch.tensor([1.0, -2.0, 0.5]))
    norm.var_sum.copy_(torch.tensor([40.0, 10.0, 1e-4]))
    norm.steps.fill_(10.0)
    obs = torch.tensor([[3.0, -2.0, 100.0]])
    expected = torch.clamp((obs - norm.mean) / torch.sqrt(norm.var_sum / norm.steps), -5, 5)
    torch.testing.assert_close(norm(obs), expected)
    assert norm(obs)[0, 2].item() == CLIP  # clamped at 5


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 200), st.integers(1, 200), st.integers(0, 10_000))
def test_merge_equals_moments_of_concatenation(n_a, n_b, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n_a, 4, generator=g) * 3 + 1
    b = torch.randn(n_b, 4, generator=g) * 0.5 - 2
    merged = Moments.of(a).merge(Moments.of(b))
    whole = Moments.of(torch.cat([a, b]))
    assert merged.count == whole.count
    torch.testing.assert_close(merged.mean, whole.mean, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(merged.var_sum, whole.var_sum, atol=1e-2, rtol=1e-4)


def test_update_includes_the_prior_pseudo_observation():
    norm = ObsNormalizer((2,))
    batch = torch.tensor([[2.0, 4.0], [4.0, 8.0]])
    norm.update(Moments.of(batch))
    prior = Moments(1.0, torch.zeros(2), torch.ones(2))
    expected = prior.merge(Moments.of(batch))
    assert norm.steps.item() == 3.0
    torch.testing.assert_close(norm.mean, expected.mean)
    torch.testing.assert_close(norm.var_sum, expected.var_sum)


def test_half_model_keeps_float32_stats_and_no_nan_at_large_counts():
    """var_sum ~ 1e5 overflows float16 (max 65504); the stats must stay float32 under .half()."""
    norm = ObsNormalizer((59,)).half()
    assert norm.mean.dtype == norm.var_sum.dtype == norm.steps.dtype == torch.float32
    norm.var_sum.fill_(1e5)
    norm.steps.fill_(2e6)
    norm.mean.fill_(0.1)
    obs = (torch.randn(64, 59) * 0.3).half()
    out = norm(obs)
    assert out.dtype == torch.float16
    assert torch.isfinite(out).all()
    ref = torch.clamp((obs.float() - 0.1) / (1e5 / 2e6) ** 0.5, -5, 5)
    torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=1e-2)
    norm = norm.to(torch.bfloat16)
    assert norm.var_sum.dtype == torch.float32


def test_large_statistics_survive_a_cast_of_the_model_to_half():
    """Regression: .half() used to round-trip the stats through float16 (var_sum 1.5e5 -> inf)."""
    norm = ObsNormalizer((2,))
    norm.var_sum.copy_(torch.tensor([1.5e5, 7.0e4]))
    norm.steps.fill_(2e6)
    half = norm.half().to(torch.bfloat16)
    assert half.var_sum.tolist() == [1.5e5, 7.0e4] and half.steps.item() == 2e6
    assert torch.isfinite(half(torch.ones(3, 2, dtype=torch.bfloat16))).all()


def test_disabled_normalizer_is_identity():
    norm = ObsNormalizer((2,), enabled=False)
    x = torch.randn(3, 2)
    assert torch.equal(norm(x), x)
