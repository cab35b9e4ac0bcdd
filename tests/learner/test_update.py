"""The update step: a bandit trained to its optimum with only the learner's pieces; skip logic."""

import pytest
import torch

from contracts.config import LearnerConfig
from contracts.spaces import ActionSpec
from learner.algorithms.ppo import PPO
from learner.device import resolve_device
from learner.gae import compute_gae
from learner.update import run_update
from policy.actor_critic import draw_noise
from policy.models.mlp import mlp_policy

ARM_REWARDS = torch.tensor([0.0, 1.0, 0.2])


def ppo_loss(cfg: LearnerConfig, policy):
    return PPO(cfg, policy, resolve_device("cpu")).loss


def _bandit_batch(policy, gen: torch.Generator, n: int) -> dict[str, torch.Tensor]:
    """n one-step episodes of a 3-armed bandit, as a [T=1, N=n] segment through GAE."""
    obs = torch.zeros(n, 2)
    actions, logp, values = policy.act(obs, draw_noise(policy.action, n, gen))
    rewards = ARM_REWARDS[actions] + 0.1 * torch.randn(n, generator=gen)
    ones, zeros = torch.ones(1, n), torch.zeros(1, n)
    adv, ret = compute_gae(rewards[None], values[None], ones, zeros, zeros, torch.zeros(n), ones, 0.99, 0.95)
    return {
        "obs": obs,
        "actions": actions,
        "logp": logp,
        "values": values,
        "advantages": adv[0],
        "returns": ret[0],
        "mask": torch.ones(n),
    }


def _train_bandit(cfg: LearnerConfig, iterations: int = 40) -> object:
    torch.manual_seed(0)
    policy = mlp_policy(2, ActionSpec("discrete", 3), [16], normalize_obs=False)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(0)
    dev = resolve_device("cpu")
    for _ in range(iterations):
        batch = _bandit_batch(policy, gen, 256)
        run_update(
            policy, opt, batch, ppo_loss(cfg, policy), cfg, dev, generator=torch.Generator().manual_seed(1)
        )
    return policy


@pytest.mark.slow
def test_ppo_update_solves_a_bandit():
    cfg = LearnerConfig(lr=0.01, batch_size=64, epochs=4, entropy_coef=0.0)
    policy = _train_bandit(cfg)
    probs = torch.softmax(policy.distribution_params(torch.zeros(1, 2))[0], -1)[0]
    assert probs[1] > 0.95, probs


@pytest.mark.slow
def test_grad_accumulation_and_bf16_autocast_also_solve_it():
    cfg = LearnerConfig(
        lr=0.01, batch_size=64, epochs=4, grad_accum_steps=4, use_amp=True, amp_dtype="bfloat16"
    )
    policy = _train_bandit(cfg)
    probs = torch.softmax(policy.distribution_params(torch.zeros(1, 2))[0], -1)[0]
    assert probs[1] > 0.95, probs


def test_nonfinite_gradient_skips_the_step_and_counts_it():
    torch.manual_seed(0)
    policy = mlp_policy(2, ActionSpec("discrete", 3), [8], normalize_obs=False)
    before = [p.detach().clone() for p in policy.parameters()]
    cfg = LearnerConfig(batch_size=32, epochs=2)
    base = ppo_loss(cfg, policy)

    def exploding(model, b):
        loss, stats = base(model, b)
        return loss * float("inf"), stats

    batch = _bandit_batch(policy, torch.Generator().manual_seed(0), 64)
    opt = torch.optim.Adam(policy.parameters())
    result = run_update(policy, opt, batch, exploding, cfg, resolve_device("cpu"))
    assert result.optimizer_steps == 4 and result.skipped_steps == 4
    for p, q in zip(policy.parameters(), before, strict=True):
        assert torch.equal(p, q) and torch.isfinite(p).all()


def test_target_kl_stops_epochs_early():
    torch.manual_seed(0)
    policy = mlp_policy(2, ActionSpec("discrete", 3), [8], normalize_obs=False)
    batch = _bandit_batch(policy, torch.Generator().manual_seed(0), 128)
    cfg = LearnerConfig(batch_size=32, epochs=50, lr=0.05, target_kl=1e-4)
    result = run_update(
        policy,
        torch.optim.Adam(policy.parameters(), lr=0.05),
        batch,
        ppo_loss(cfg, policy),
        cfg,
        resolve_device("cpu"),
    )
    assert result.epochs_run < 50
    assert set(result.stats) >= {
        "policy_loss",
        "value_loss",
        "entropy",
        "approx_kl",
        "clip_fraction",
        "grad_norm",
    }
