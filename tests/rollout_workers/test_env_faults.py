"""Envs that raise or return NaN/inf: the bad steps are masked, the env reset or rebuilt, sampling
goes on, and every fault is counted by kind. Both layouts (continuing for PPO, grouped for GRPO)
go through the same guard."""

import numpy as np
import pytest

from relay_rl.contracts.config import build_config
from relay_rl.learner.algorithms import algorithm_traits
from relay_rl.learner.buffer import SegmentRingBuffer
from relay_rl.learner.gae import compute_gae
from relay_rl.rollout_workers.sampler import make_sampler
from tests.helpers import gae_of

FAULTY = "tests.rollout_workers.faulty_envs:make"


def _sampler(kwargs: str, *sets: str):
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
            *sets,
        ],
    )
    return make_sampler(cfg, algorithm_traits(cfg))


def _gae(seg):
    import torch

    t = {
        k: torch.from_numpy(seg[k])
        for k in ("rewards", "values", "terminated", "truncated", "bootstrap_value", "mask", "last_value")
    }
    return gae_of(compute_gae, **t, gamma=0.99, lam=0.95)


def test_non_finite_observation_masks_that_step_and_resets_that_env():
    s = _sampler("{nan_obs_at: [5]}")  # every env returns NaN on its 5th step (step index 4)
    seg = s.sample()
    assert (seg["mask"][4] == 0).all() and seg["mask"].sum() == 57
    assert seg["truncated"][3].all() and np.array_equal(seg["bootstrap_value"][3], seg["values"][4])
    assert np.isfinite(seg["obs"]).all()
    assert seg.env_faults == {
        "raised": 0,
        "nonfinite_obs": 3,
        "nonfinite_reward": 0,
        "empty_mask": 0,
        "unacted_agent": 0,
    }
    SegmentRingBuffer(s.layout, 1).add(seg)  # accepted: nothing non-finite
    adv, _ = _gae(seg)
    assert (adv[4] == 0).all() and np.isfinite(adv.numpy()).all()
    assert s.sample().env_faults == {
        "raised": 0,
        "nonfinite_obs": 0,
        "nonfinite_reward": 0,
        "empty_mask": 0,
        "unacted_agent": 0,
    }  # a delta


def test_inf_reward_is_masked_too():
    seg = _sampler("{inf_reward_at: [2]}").sample()
    assert (seg["mask"][1] == 0).all() and np.isfinite(seg["rewards"]).all()
    assert seg.env_faults["nonfinite_reward"] == 3


def test_env_that_raises_is_rebuilt_and_sampling_continues():
    s = _sampler("{raise_at: [7]}")  # each new env instance raises on its 7th step
    seg = s.sample()
    lost = np.flatnonzero(seg["mask"].sum(axis=1) == 0)
    assert lost.tolist() == [6, 13]  # the rebuilt copies carried on in the same segment, then failed again
    assert seg["mask"].sum() == 3 * 18
    assert seg["truncated"][5].all() and seg["truncated"][12].all()
    assert seg.env_faults == {
        "raised": 6,
        "nonfinite_obs": 0,
        "nonfinite_reward": 0,
        "empty_mask": 0,
        "unacted_agent": 0,
    }  # 3 copies, twice
    assert s.sample().env_steps > 0


def test_a_copy_that_raises_costs_only_its_own_step():
    """One copy of three raises: it alone is rebuilt and loses that step; its neighbours' episodes
    go on untouched (the vector env used to be rebuilt whole, losing all three)."""
    from tests.rollout_workers.faulty_envs import FaultyCartPole

    FaultyCartPole.created = 0  # instance 0 (copy 0) faults; its rebuilt copy (instance 3) does not
    s = _sampler("{raise_at: [7], every: 1000}")
    bad = 0
    seg = s.sample()
    assert seg.env_faults["raised"] == 1
    others = [i for i in range(3) if i != bad]
    assert seg["mask"][:, others].all() and seg["mask"][6, bad] == 0 and seg["mask"][:, bad].sum() == 19
    assert seg["truncated"][5, bad] == 1 and not seg["truncated"][5, others].any()


GRPO = (
    "learner.algo=grpo",
    "env.num_envs=4",
    "learner.group_size=2",
    "learner.buffer_size=80",
    "learner.batch_size=80",
)


def test_grpo_env_that_raises_is_rebuilt_and_the_run_goes_on():
    """The grouped layout used to end the run on the first env that raised (exit 1)."""
    s = _sampler("{raise_at: [3]}", *GRPO)
    seg = s.sample()
    assert seg.env_faults["raised"] == 4  # every copy, each rebuilt alone
    assert seg["mask"].sum() == 0 and seg.episode_returns == []  # no member's episode survives
    SegmentRingBuffer(s.layout, 1).add(seg)
    again = s.sample()  # the rebuilt copies play the next segment
    assert again.env_faults["raised"] == 4 and again["mask"].sum() == 0  # fail at their 3rd step again


@pytest.mark.parametrize("fault", ["nan_obs_at", "raise_at"])
def test_grpo_a_faulted_member_loses_its_own_episode_not_its_groups(fault):
    """A member whose step was not finite, or whose copy raised, is masked alone: its group-mates
    and the other group keep their episodes (the whole group used to be dropped, and a raise
    dropped every group), and the learner's group statistics skip it."""
    import torch

    from relay_rl.learner.losses import group_relative_advantages
    from tests.rollout_workers.faulty_envs import FaultyCartPole

    FaultyCartPole.created = 0  # instance 0 (member 0) faults; its rebuilt copy does not
    s = _sampler(f"{{{fault}: [2], every: 1000}}", *GRPO)
    bad = 0
    seg = s.sample()
    assert sum(seg.env_faults.values()) == 1
    kept = [i for i in range(4) if i != bad]
    assert seg["mask"][:, bad].sum() == 0 and seg["outcome"][bad] == 0
    assert (seg["mask"][:, kept].sum(axis=0) > 0).all()
    np.testing.assert_array_equal(seg["outcome"][kept], seg["mask"][:, kept].sum(axis=0))
    assert len(seg.episode_returns) == 3
    SegmentRingBuffer(s.layout, 1).add(seg)
    valid = torch.from_numpy(seg["mask"].sum(axis=0) > 0).view(-1, 2)
    adv, _ = group_relative_advantages(torch.from_numpy(seg["outcome"]).view(-1, 2), valid=valid)
    assert adv.view(-1)[bad] == 0 and adv.view(-1)[bad ^ 1] == 0  # a group of one carries no signal


def test_a_grpo_run_on_an_env_that_faults_now_and_then_finishes_its_budget(tmp_path):
    """The regression: a fraction of a percent of steps raise, return NaN or an inf reward; once
    episodes reach ~90 steps nearly every segment held a fault, each dropped its group (a raise
    every group), and the run stopped with NoProgressError. Now it trains to its budget."""
    from tests.helpers import train_local

    run = tmp_path / "grpo"
    kwargs = "{raise_at: [90, 250], nan_obs_at: [60, 170], inf_reward_at: [120, 300], every: 3}"
    sets = (f"env.id={FAULTY}", f"env.kwargs={kwargs}", "stop.env_steps=12000")
    assert train_local("cartpole_grpo.yaml", run, *sets) == 0
    last = _last_line(run)
    assert last["env_steps"] >= 12000 and last["env_faults"] > 0


def _last_line(run):
    import json

    return json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])


def test_faults_reach_the_metrics_by_kind_in_a_real_run(tmp_path):
    """PPO, local mode: a run over a faulty env finishes, and every fault is counted."""
    from tests.helpers import train_local

    run = tmp_path / "ppo"
    sets = (f"env.id={FAULTY}", "env.kwargs={nan_obs_at: [5], raise_at: [40]}", "learner.buffer_size=512")
    assert train_local("cartpole_ppo.yaml", run, *sets, "stop.env_steps=2000") == 0
    last = _last_line(run)
    assert last["env_faults_nonfinite_obs"] >= 8 and last["env_faults_raised"] >= 1
    assert last["env_faults"] == sum(
        last[f"env_faults_{k}"] for k in ("raised", "nonfinite_obs", "nonfinite_reward")
    )


def test_a_grpo_run_survives_an_env_that_raises(tmp_path):
    """GRPO used to end the run (exit 1) on the first env that raised; now it goes on like PPO."""
    from tests.helpers import train_local
    from tests.rollout_workers.faulty_envs import FaultyCartPole

    # With every: 1000 only instance 0 faults: the preflight's probe env takes -1, the sampler's
    # first env is 0; the env rebuilt after it raised is healthy.
    FaultyCartPole.created = -1
    run = tmp_path / "grpo"
    sets = (f"env.id={FAULTY}", "env.kwargs={raise_at: [30], every: 1000}", "stop.env_steps=6000")
    assert train_local("cartpole_grpo.yaml", run, *sets) == 0
    last = _last_line(run)
    assert last["env_faults_raised"] >= 1 and last["env_steps"] >= 6000


def test_rounds_whose_every_step_was_lost_do_not_update_and_end_the_run(tmp_path, capsys):
    """An env that faults in every segment leaves no valid step: the learner must not take Adam
    steps on all-padding batches, and the driver gives up after 20 such rounds."""
    from tests.helpers import train_local

    run = tmp_path / "lost"
    sets = (f"env.id={FAULTY}", "env.kwargs={raise_at: [2]}", "stop.env_steps=6000", "env.num_envs=4")
    sets += (
        "learner.group_size=2",
        "rollout.rollout_len=50",
        "learner.buffer_size=200",
        "learner.batch_size=100",
    )
    assert train_local("cartpole_grpo.yaml", run, *sets) == 1
    assert "no update in 20 rounds in a row: every step of the round was lost" in capsys.readouterr().err


TAXI_FAULT = "tests.rollout_workers.faulty_envs:make_mask_fault_taxi"


def test_a_mask_that_allows_nothing_is_counted_and_named():
    """Taxi whose mask allows no action at its 3rd step: acted on uniformly (the documented rule),
    and counted as env_faults empty_mask, not silent."""
    s = _sampler("{fault: empty, at: 3}", f"env.id={TAXI_FAULT}")
    seg = s.sample()
    assert seg.env_faults["empty_mask"] == 3 and seg.env_steps == 60


def test_a_mask_of_the_wrong_length_is_refused_naming_both_sizes():
    from relay_rl.rollout_workers.observations import MaskError

    s = _sampler("{fault: short, at: 3}", f"env.id={TAXI_FAULT}")
    with pytest.raises(
        MaskError, match=r"gave 5 mask values per env .* the action space has 6 choices"
    ) as err:
        s.sample()
    assert "\n" not in str(err.value) and "env.action_mask=info:action_mask" in str(err.value)


def test_a_pettingzoo_agent_back_mid_episode_is_counted_not_silent():
    """simple_spread's agent_0 leaves and comes back two steps later: its column waits for the next
    episode, the env steps without its action, and each such step is counted as unacted_agent."""
    from tests.helpers import local_config

    cfg = local_config(
        "tests.rollout_workers.pettingzoo_factories:returning_spread",
        "env.kwargs={at: 3, max_cycles: 25}",
        T=16,
        N=6,
    )
    s = make_sampler(cfg, algorithm_traits(cfg))
    faults = s.sample().env_faults
    assert faults["unacted_agent"] > 0 and faults["raised"] == faults["nonfinite_obs"] == 0
