"""The Nature CNN over uint8 frames, and reward scaling by the running std of the discounted
return (env.normalize_reward): gathered on the workers, merged on the learner, shipped with the
weights and checkpointed, applied to the learner's rewards only."""

import numpy as np
import pytest
import torch

from relay_rl.contracts.config import ConfigError, build_config
from relay_rl.contracts.spaces import ActionSpec, EnvSpec
from relay_rl.learner.algorithms import algorithm_traits
from relay_rl.learner.learner import Learner
from relay_rl.policy.models import build_policy
from relay_rl.policy.models.cnn import NatureCNN
from relay_rl.rollout_workers.sampler import make_sampler
from relay_rl.services.driver.preflight import check_config

FRAMES = EnvSpec((4, 84, 84), ActionSpec("discrete", 4), obs_dtype="uint8", obs_low=0, obs_high=255)


def test_the_cnn_reads_uint8_frames_and_scales_them_itself():
    cfg = build_config({}, ["model.kind=cnn", "model.normalize_obs=false"])
    policy = build_policy(cfg, FRAMES, critic=True)
    assert isinstance(policy.pi_trunk, NatureCNN) and policy.pi_trunk.out_dim == 512
    frames = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    params, value = policy.distribution_params(frames)
    assert params.shape == (5, 4) and value.shape == (5,)
    # The same frames as float [0, 255] give the same output: the trunk scales by 1/255 itself.
    trunk = policy.pi_trunk
    torch.testing.assert_close(trunk(frames), trunk._forward(frames.float() / 255.0))
    out = policy.evaluate(frames, torch.zeros(5, dtype=torch.int64))
    out.logp.sum().backward()
    assert policy.pi_trunk.convs[0].weight.grad is not None
    with pytest.raises(ConfigError, match=r"model\.kind=cnn reads uint8 frames"):
        check_config(build_config({}, ["model.kind=cnn"]))


def _reward_cfg(*sets):
    return build_config(
        {},
        [
            "env.id=Pendulum-v1",
            "env.normalize_reward=true",
            "rollout.num_workers=0",
            "env.num_envs=4",
            "rollout.rollout_len=50",
            "learner.buffer_size=200",
            "learner.batch_size=100",
            *sets,
        ],
    )


def test_workers_gather_discounted_return_moments_and_the_learner_merges_them():
    cfg = _reward_cfg()
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    seg = sampler.sample()
    moments = seg.return_moments
    assert moments["count"] == 200 and moments["mean"].shape == (1,)
    # Pendulum's rewards are in [-16.3, 0]: the discounted returns are negative and grow in size.
    assert moments["mean"][0] < 0 and moments["var_sum"][0] > 0
    learner = Learner(cfg, sampler.spec)
    assert "return_stats.var_sum" in learner.weights()  # shipped with the weights
    learner.train_round([seg])
    stats = learner.model.return_stats
    assert stats is not None and float(stats.steps) == 201  # the pseudo-observation + 200 steps
    assert float(stats.std()) > 1.0


def test_the_learner_trains_on_scaled_rewards_and_reports_raw_returns():
    cfg = _reward_cfg()
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    learner = Learner(cfg, sampler.spec)
    with torch.no_grad():
        learner.model.return_stats.var_sum.fill_(400.0)  # std 20
    rewards = torch.tensor([[-16.0, 0.0], [-300.0, 4.0]])
    scaled = learner.algo._learning_rewards(rewards)
    torch.testing.assert_close(scaled, torch.tensor([[-0.8, 0.0], [-10.0, 0.2]]))  # /20, clipped at 10
    seg = sampler.sample()
    raw_returns = seg.episode_returns
    assert all(r < -100 for r in raw_returns)  # Pendulum's unscaled returns, reported as they are


def test_return_statistics_survive_a_checkpoint_and_grpo_refuses_them():
    cfg = _reward_cfg()
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    learner = Learner(cfg, sampler.spec)
    learner.train_round([sampler.sample()])
    fresh = Learner(cfg, sampler.spec)
    fresh.load_state_dict(learner.state_dict())
    assert torch.equal(fresh.model.return_stats.var_sum, learner.model.return_stats.var_sum)
    plain = build_config({}, ["env.id=Pendulum-v1"])
    assert "return_stats.var_sum" not in build_policy(plain, sampler.spec, critic=True).state_dict()
    with pytest.raises(ConfigError, match=r"set env\.normalize_reward=false"):
        check_config(
            build_config({}, ["learner.algo=grpo", "learner.group_size=2", "env.normalize_reward=true"])
        )
    assert np.isfinite(float(learner.model.return_stats.std()))
