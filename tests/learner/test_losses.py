"""Loss terms against hand-computed values."""

import math

import torch

from relay_rl.learner import losses

ONES = torch.ones(4)


def test_clipped_surrogate_by_hand():
    old = torch.zeros(4)
    logp = torch.log(torch.tensor([1.5, 0.5, 1.1, 0.9]))  # ratios
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    # min(r*A, clip(r)*A): [1.2, 0.5, -1.1, -0.9] -> mean -0.075 -> loss 0.075
    loss = losses.clipped_surrogate(logp, old, adv, clip=0.2, mask=ONES)
    assert math.isclose(loss.item(), -(1.2 + 0.5 - 1.1 - 0.9) / 4, rel_tol=1e-6)


def test_clipped_surrogate_with_importance_weights_by_hand():
    old = torch.zeros(4)
    logp = torch.log(torch.tensor([1.5, 0.5, 1.1, 0.9]))
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    weights = torch.tensor([0.5, 2.0, 1.0, 0.0])
    # [1.2, 0.5, -1.1, -0.9] * [0.5, 2, 1, 0] = [0.6, 1.0, -1.1, 0]
    loss = losses.clipped_surrogate(logp, old, adv, clip=0.2, mask=ONES, weights=weights)
    assert math.isclose(loss.item(), -(0.6 + 1.0 - 1.1) / 4, rel_tol=1e-6)


def test_mask_excludes_padding():
    old = torch.zeros(4)
    logp = torch.log(torch.tensor([1.5, 0.5, 1.1, 0.9]))
    adv = torch.tensor([1.0, 1.0, -1.0, 1000.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    loss = losses.clipped_surrogate(logp, old, adv, 0.2, mask)
    assert math.isclose(loss.item(), -(1.2 + 0.5 - 1.1) / 3, rel_tol=1e-6)


def test_approx_kl_k3_and_clip_fraction():
    old = torch.zeros(4)
    r = torch.tensor([1.5, 0.5, 1.1, 1.0])
    kl = losses.approx_kl(torch.log(r), old, ONES)
    expected = sum((x - 1) - math.log(x) for x in r.tolist()) / 4
    assert math.isclose(kl.item(), expected, rel_tol=1e-6)
    assert losses.clip_fraction(torch.log(r), old, 0.2, ONES).item() == 0.5
    assert losses.approx_kl(old, old, ONES).item() == 0.0


def test_value_loss_plain_and_clipped():
    v = torch.tensor([2.0, 0.0])
    old = torch.tensor([0.0, 0.0])
    ret = torch.tensor([1.0, 1.0])
    m = torch.ones(2)
    assert math.isclose(losses.value_loss(v, old, ret, m).item(), 0.5 * (1 + 1) / 2)
    # clipped: v0 -> 0 + clamp(2, -.5, .5) = .5, err max(1, .25) = 1; v1 unchanged 1
    assert math.isclose(losses.value_loss(v, old, ret, m, clip=0.5).item(), 0.5)


def test_normalize_advantages_ignores_padding():
    adv = torch.tensor([1.0, 3.0, 100.0])
    mask = torch.tensor([1.0, 1.0, 0.0])
    out = losses.normalize_advantages(adv, mask)
    torch.testing.assert_close(out, torch.tensor([-1.0, 1.0, 0.0]), atol=1e-6, rtol=0)


def test_group_relative_advantages_and_zero_std_groups():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    adv, std = losses.group_relative_advantages(rewards, eps=1e-6)
    torch.testing.assert_close(adv[0], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5, rtol=0)
    assert torch.equal(adv[1], torch.zeros(4))
    torch.testing.assert_close(std, torch.tensor([0.5, 0.0]))


def test_kl_to_reference_zero_when_equal_and_positive_otherwise():
    logp = torch.tensor([-1.0, -2.0])
    assert losses.kl_to_reference(logp, logp, torch.ones(2)).item() == 0.0
    d = 0.3
    expected = math.exp(d) - d - 1
    assert math.isclose(losses.kl_to_reference(logp, logp + d, torch.ones(2)).item(), expected, rel_tol=1e-5)


def test_explained_variance():
    target = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert losses.explained_variance(target, target, ONES).item() == 1.0
    assert math.isclose(
        losses.explained_variance(torch.full((4,), 2.5), target, ONES).item(), 0.0, abs_tol=1e-6
    )


def test_group_relative_advantages_over_the_valid_members_only():
    """By hand: group [1, 3, 100(faulted)] is [1, 3] alone: mean 2, std 1, advantages -1, +1, 0; a
    group left with one valid member carries no signal; all valid equals the unmasked form."""
    rewards = torch.tensor([[1.0, 3.0, 100.0], [5.0, 7.0, 9.0], [4.0, 0.0, 0.0]])
    valid = torch.tensor([[True, True, False], [True, True, True], [True, False, False]])
    adv, std = losses.group_relative_advantages(rewards, eps=0.0, valid=valid)
    torch.testing.assert_close(adv[0], torch.tensor([-1.0, 1.0, 0.0]))
    torch.testing.assert_close(std, torch.tensor([1.0, (8 / 3) ** 0.5, 0.0]))
    assert (adv[2] == 0).all()
    plain, plain_std = losses.group_relative_advantages(rewards[:2], eps=1e-6)
    masked, masked_std = losses.group_relative_advantages(
        rewards[:2], 1e-6, torch.ones(2, 3, dtype=torch.bool)
    )
    torch.testing.assert_close(masked, plain)
    torch.testing.assert_close(masked_std, plain_std)
