"""Policies: shapes, caller-supplied noise, log-probs, critic-free variant, checkpointing."""

import math

import torch

from relay_rl.contracts.spaces import ActionSpec
from relay_rl.policy.actor_critic import draw_noise
from relay_rl.policy.models import ActorCritic
from relay_rl.policy.models.mlp import mlp_policy


def _policy(kind: str, critic: bool = True, **kw) -> ActorCritic:
    return mlp_policy(obs_dim=5, action=ActionSpec(kind, 3), hidden=[16, 16], critic=critic, **kw)


def test_discrete_act_is_a_function_of_the_noise():
    pol = _policy("discrete")
    obs = torch.randn(7, 5)
    noise = draw_noise(ActionSpec("discrete", 3), 7, torch.Generator().manual_seed(0))
    a1, logp1, v1 = pol.act(obs, noise)
    a2, logp2, _ = pol.act(obs, noise.clone())
    assert a1.shape == (7,) and logp1.shape == (7,) and v1.shape == (7,)
    assert torch.equal(a1, a2) and torch.equal(logp1, logp2)
    assert ((a1 >= 0) & (a1 < 3)).all()
    # inverse CDF: u below the first class's probability picks class 0
    probs = torch.softmax(pol.distribution_params(obs)[0], -1)
    a0, _, _ = pol.act(obs, probs[:, 0] * 0.5)
    assert (a0 == 0).all()


def test_gaussian_logp_matches_torch_distribution():
    pol = _policy("continuous", init_log_std=-0.5)
    obs = torch.randn(4, 5)
    noise = torch.randn(4, 3)
    actions, logp, _ = pol.act(obs, noise)
    mean, _ = pol.distribution_params(obs)
    dist = torch.distributions.Normal(mean, torch.full_like(mean, math.exp(-0.5)))
    torch.testing.assert_close(logp, dist.log_prob(actions).sum(-1))
    out = pol.evaluate(obs, actions)
    torch.testing.assert_close(out.entropy, dist.entropy().sum(-1))
    torch.testing.assert_close(actions, mean + math.exp(-0.5) * noise)


def test_critic_free_policy_has_no_value_parameters():
    with_critic = _policy("discrete")
    without = _policy("discrete", critic=False)
    n_with = sum(p.numel() for p in with_critic.parameters())
    n_without = sum(p.numel() for p in without.parameters())
    assert not without.has_critic and without.evaluate(torch.randn(2, 5), torch.zeros(2)).value is None
    assert n_without < n_with
    assert torch.equal(without.value(torch.randn(3, 5)), torch.zeros(3))


def test_shared_trunk_and_activation():
    pol = _policy("discrete", shared_trunk=True, activation="silu")
    assert pol.v_trunk is None and isinstance(pol.pi_trunk.net[1], torch.nn.SiLU)
    assert pol.evaluate(torch.randn(2, 5), torch.zeros(2)).value.shape == (2,)


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    pol = _policy("continuous")
    obs, actions = torch.randn(8, 5), torch.randn(8, 3)

    def grads(enabled: bool):
        pol.zero_grad()
        pol.set_checkpointing(enabled)
        out = pol.evaluate(obs, actions)
        (out.logp.sum() + out.value.sum()).backward()
        return [p.grad.clone() for p in pol.parameters() if p.grad is not None]

    for g1, g2 in zip(grads(False), grads(True), strict=True):
        torch.testing.assert_close(g1, g2)
