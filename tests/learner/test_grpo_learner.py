"""The learner's GRPO path: no critic, KL to the reference, group statistics, reference refresh."""

import numpy as np
import torch

from relay_rl.contracts.config import build_config
from relay_rl.learner.algorithms import algorithm_traits
from relay_rl.learner.learner import Learner
from relay_rl.rollout_workers.sampler import make_sampler


def _learner(*overrides: str):
    cfg = build_config(
        {},
        [
            "env.id=relay/ReverseDigits-v0",
            "learner.algo=grpo",
            "rollout.num_workers=0",
            "env.num_envs=16",
            "learner.group_size=4",
            "rollout.rollout_len=5",
            "learner.buffer_size=80",
            "learner.batch_size=40",
            *overrides,
        ],
    )
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    return cfg, sampler, Learner(cfg, sampler.spec)


def test_grpo_learner_has_no_value_network_and_fewer_parameters():
    _, _, grpo = _learner()
    cfg = build_config(
        {},
        [
            "env.id=relay/ReverseDigits-v0",
            "rollout.num_workers=0",
            "env.num_envs=16",
            "rollout.rollout_len=5",
            "learner.buffer_size=80",
            "learner.batch_size=40",
        ],
    )
    ppo = Learner(cfg, make_sampler(cfg, algorithm_traits(cfg)).spec)
    assert not grpo.model.has_critic and ppo.model.has_critic
    assert grpo.parameter_count < ppo.parameter_count


def test_kl_to_reference_is_zero_at_the_start():
    _, sampler, learner = _learner("learner.epochs=1", "learner.lr=1e-12")
    learner.ingest(learner.stage(sampler.sample()))
    metrics = learner.update().metrics
    assert abs(metrics["kl_ref"]) < 1e-6
    assert "value_loss" not in metrics and "explained_variance" not in metrics
    assert {"group_reward_std", "zero_std_group_fraction", "policy_loss", "approx_kl"} <= set(metrics)


def test_zero_std_groups_get_no_gradient():
    """If every member of every group scores the same, GRPO has nothing to learn from."""
    _, sampler, learner = _learner("learner.kl_coef=0")
    seg = sampler.sample()
    seg["outcome"] = np.full_like(seg["outcome"], 0.4)
    before = [p.detach().clone() for p in learner.model.parameters()]
    learner.ingest(learner.stage(seg))
    metrics = learner.update().metrics
    assert metrics["zero_std_group_fraction"] == 1.0 and metrics["group_reward_std"] == 0.0
    for p, q in zip(learner.model.parameters(), before, strict=True):
        torch.testing.assert_close(p, q)


def test_reference_refreshes_on_interval():
    _, sampler, learner = _learner("learner.ref_update_interval=2", "learner.lr=0.01")
    ref0 = [p.clone() for p in learner.algo.reference.parameters()]
    for i in range(2):
        learner.ingest(learner.stage(sampler.sample()))
        learner.update()
        same = all(torch.equal(a, b) for a, b in zip(learner.algo.reference.parameters(), ref0, strict=True))
        assert same == (i == 0)
    for a, b in zip(learner.algo.reference.parameters(), learner.model.parameters(), strict=True):
        assert torch.equal(a, b)
