"""Envs that raise or return NaN/inf: the bad steps are masked, the env reset, sampling goes on."""

import numpy as np

from learner.buffer import SegmentRingBuffer
from learner.gae import compute_gae
from learner.learner import segment_spec
from rollout_workers.sampler import SegmentSampler
from services.config import build_config

FAULTY = "tests.rollout_workers.faulty_envs:make"


def _sampler(kwargs: str) -> SegmentSampler:
    cfg = build_config(
        {},
        [
            f"env.id={FAULTY}",
            f"env.kwargs={kwargs}",
            "env.num_envs=3",
            "rollout.num_workers=0",
            "rollout.rollout_len=20",
            "learner.buffer_size=60",
            "learner.batch_size=60",
        ],
    )
    return SegmentSampler(cfg)


def _gae(seg):
    import torch

    t = {
        k: torch.from_numpy(seg[k])
        for k in ("rewards", "values", "terminated", "truncated", "bootstrap_value", "mask", "last_value")
    }
    return compute_gae(**t, gamma=0.99, lam=0.95)


def test_non_finite_observation_masks_that_step_and_resets_that_env():
    s = _sampler("{nan_obs_at: [5]}")  # every env returns NaN on its 5th step (step index 4)
    seg = s.sample()
    assert (seg["mask"][4] == 0).all() and seg["mask"].sum() == 57
    assert seg["truncated"][3].all() and np.array_equal(seg["bootstrap_value"][3], seg["values"][4])
    assert np.isfinite(seg["obs"]).all() and s.env_errors == 3
    SegmentRingBuffer(segment_spec(s.cfg, s.spec), 1).add(seg)  # accepted: nothing non-finite
    adv, _ = _gae(seg)
    assert (adv[4] == 0).all() and np.isfinite(adv.numpy()).all()


def test_inf_reward_is_masked_too():
    seg = _sampler("{inf_reward_at: [2]}").sample()
    assert (seg["mask"][1] == 0).all() and np.isfinite(seg["rewards"]).all()


def test_env_that_raises_is_rebuilt_and_sampling_continues():
    s = _sampler("{raise_at: [7]}")  # each new env instance raises on its 7th step
    seg = s.sample()
    lost = np.flatnonzero(seg["mask"].sum(axis=1) == 0)
    assert lost.tolist() == [6, 13]  # the rebuilt env carried on in the same segment, then failed again
    assert seg["mask"].sum() == 3 * 18
    assert seg["truncated"][5].all() and seg["truncated"][12].all()
    assert s.env_errors == 2
    assert s.sample()["env_steps"] > 0
