"""Sampling real gymnasium envs into fixed [T, N] segments: shapes, autoreset, bootstrap, seeding."""

import numpy as np
import pytest
import torch

from relay_rl.contracts.config import EnvConfig, build_config
from relay_rl.learner.algorithms import algorithm_traits
from relay_rl.learner.buffer import SegmentRingBuffer
from relay_rl.policy.models import build_policy
from relay_rl.rollout_workers.envs import EnvSpecError, action_spec, env_seeds
from relay_rl.rollout_workers.sampler import make_sampler
from relay_rl.rollout_workers.vector_backends import make_vector_env


def _cfg(*overrides):
    return build_config(
        {},
        [
            "rollout.num_workers=0",
            "env.num_envs=4",
            "rollout.rollout_len=50",
            "learner.buffer_size=200",
            "learner.batch_size=200",
            *overrides,
        ],
    )


def test_segment_has_fixed_shapes_and_fits_the_buffer():
    cfg = _cfg()
    s = make_sampler(cfg, algorithm_traits(cfg))
    seg = s.sample()
    assert seg["obs"].shape == (50, 4, 4) and seg["actions"].shape == (50, 4)
    for k in ("logp", "values", "rewards", "terminated", "truncated", "mask", "bootstrap_value"):
        assert seg[k].shape == (50, 4), k
    assert seg["last_value"].shape == (4,)
    assert seg.env_steps == 200 and seg["mask"].all()
    buf = SegmentRingBuffer(s.layout, 1)
    buf.add(seg)


def test_truncation_bootstraps_from_the_final_observation_and_no_step_crosses_episodes():
    cfg = _cfg("env.max_episode_steps=7")
    s = make_sampler(cfg, algorithm_traits(cfg))
    seg = s.sample()
    trunc = seg["truncated"].astype(bool)
    assert trunc.any()
    # every truncated step has V(final obs) as its bootstrap (a critic at init is not exactly 0)
    assert np.all(seg["bootstrap_value"][trunc] != 0.0)
    assert np.all(seg["bootstrap_value"][~trunc] == 0.0)
    # SAME_STEP autoreset: the step after a truncation starts a new episode at the reset obs,
    # whose cart position is small, never the final obs of the previous one
    assert all(length <= 7 for length in seg.episode_lengths)
    assert not (seg["terminated"].astype(bool) & trunc).any()


def test_same_seed_reproduces_bit_for_bit_and_workers_differ():
    a = make_sampler(_cfg(), algorithm_traits(_cfg()), worker_index=0).sample()
    b = make_sampler(_cfg(), algorithm_traits(_cfg()), worker_index=0).sample()
    c = make_sampler(_cfg(), algorithm_traits(_cfg()), worker_index=1).sample()
    for k in ("obs", "actions", "logp", "rewards"):
        assert np.array_equal(a[k], b[k]), k
    assert not np.array_equal(a["obs"], c["obs"])


def test_continuous_actions_are_clipped_for_the_env_but_kept_raw_in_the_segment():
    cfg = _cfg("env.id=Pendulum-v1", "model.init_log_std=1.5")
    seg = make_sampler(cfg, algorithm_traits(cfg)).sample()
    assert seg["actions"].shape == (50, 4, 1)
    assert np.abs(seg["actions"]).max() > 2.0  # Pendulum's bound; the raw sample exceeds it


def test_weights_and_normalizer_stats_load_into_the_worker():
    cfg = _cfg()
    s = make_sampler(cfg, algorithm_traits(cfg))
    weights = build_policy(cfg, s.spec, critic=True).state_dict()
    weights["normalizer.mean"] = torch.full_like(weights["normalizer.mean"], 3.0)
    s.set_weights(5, weights)
    seg = s.sample()
    assert seg.weights_version == 5
    assert np.array_equal(s.fast.mean, np.full(4, 3.0, dtype=np.float32))
    assert seg.obs_moments["count"] == 200


def test_env_helpers():
    assert env_seeds(0, 0, 3) == env_seeds(0, 0, 3) and env_seeds(0, 0, 3) != env_seeds(0, 1, 3)
    env = make_vector_env(EnvConfig(id="CartPole-v1", num_envs=2))
    assert action_spec(env.single_action_space).kind == "discrete"
    import gymnasium as gym

    with pytest.raises(EnvSpecError, match="unsupported action space"):
        action_spec(gym.spaces.Text(5))
    with pytest.raises(EnvSpecError, match="infinite"):
        action_spec(gym.spaces.Box(-np.inf, np.inf, (2,)))


def test_user_factory_env_ids():
    cfg = _cfg("env.id=gymnasium.envs.classic_control.cartpole:CartPoleEnv", "env.max_episode_steps=20")
    seg = make_sampler(cfg, algorithm_traits(cfg)).sample()
    assert max(seg.episode_lengths, default=0) <= 20


def test_reseed_gives_a_reproducible_fresh_stream():
    """A resumed run continues on another seed stream: new data, still fixed by the seed."""
    cfg = _cfg()
    fresh, a, b = (
        make_sampler(cfg, algorithm_traits(cfg)),
        make_sampler(cfg, algorithm_traits(cfg)),
        make_sampler(cfg, algorithm_traits(cfg)),
    )
    a.reseed(7)
    b.reseed(7)
    first, sa, sb = fresh.sample(), a.sample(), b.sample()
    for k in ("obs", "actions", "logp"):
        assert np.array_equal(sa[k], sb[k]), k
    assert not np.array_equal(first["obs"][0], sa["obs"][0])
    assert a.seed_stream == 7 and fresh.seed_stream == 0


# ---- the registry of rollout layouts (rollout_workers/sampler.py) ---------------------------------


def test_each_run_gets_the_first_layout_that_serves_it():
    from relay_rl.rollout_workers.sampler import layout_of
    from tests.helpers import local_config

    ppo = local_config("CartPole-v1")
    grpo = local_config("CartPole-v1", "learner.algo=grpo", "learner.group_size=2")
    groups = local_config(
        "pettingzoo:mpe2.simple_tag_v3",
        "multi_agent.policies={predator: [adversary_*], prey: [agent_*]}",
    )
    assert [layout_of(c, algorithm_traits(c)) for c in (ppo, grpo, groups)] == [
        "continuing",
        "grouped",
        "policy_groups",
    ]


def test_a_new_layout_is_one_class_and_one_registry_line(monkeypatch):
    """A layout that serves CartPole runs only, on top of the continuing one: registered, it is
    the layout those runs sample with, and the others keep theirs."""
    from relay_rl.rollout_workers import sampler as registry
    from relay_rl.rollout_workers.continuing import ContinuingSampler
    from tests.helpers import local_config

    class Counting(ContinuingSampler):
        calls = 0

        @staticmethod
        def serves(cfg, traits):
            return cfg.env.id == "CartPole-v1"

        def sample(self):
            Counting.calls += 1
            return super().sample()

    monkeypatch.setattr(registry, "SAMPLERS", {"counting": Counting, **registry.SAMPLERS})
    cfg = local_config("CartPole-v1", T=8, N=2)
    sampler = registry.make_sampler(cfg, algorithm_traits(cfg))
    seg = sampler.sample()
    assert isinstance(sampler, Counting) and Counting.calls == 1 and seg["obs"].shape == (8, 2, 4)
    sampler.close()
    other = local_config("Acrobot-v1")
    assert registry.layout_of(other, algorithm_traits(other)) == "continuing"
