"""The Learner's PPO path in-process: a round fills before an update, rejected segments and env
faults are reported as this round's deltas, restarts are read from incarnations, lockstep updates
on the newest segments, and its state round-trips."""

import numpy as np
import torch

from relay_rl.contracts.config import build_config
from relay_rl.learner.algorithms import algorithm_traits
from relay_rl.learner.learner import Learner, time_major
from relay_rl.rollout_workers.sampler import make_sampler


def _setup(*sets: str):
    sections = {
        "rollout": {"num_workers": 2, "rollout_len": 16},  # a round is two segments
        "env": {"num_envs": 4},
        "learner": {"buffer_size": 192, "batch_size": 64, "epochs": 2},
    }
    cfg = build_config(sections, list(sets))
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    return cfg, sampler, Learner(cfg, sampler.spec)


def test_an_update_waits_for_a_full_round_and_reports_ppo_metrics():
    _, sampler, learner = _setup()
    first = learner.train_round([sampler.sample()])
    assert first.metrics is None and first.env_steps == 64 and learner.version == 0
    second = learner.train_round([sampler.sample()])
    m = second.metrics
    assert m is not None and learner.version == 1 and m["weights_version"] == 1
    assert {"value_loss", "explained_variance", "policy_loss", "approx_kl", "grad_norm"} <= set(m)
    assert "kl_ref" not in m and "rejected_segments" not in m  # the driver owns run counters
    assert second.amp_skipped_steps == 0 and m["epochs_run"] == 2


def test_rejected_segments_faults_and_restarts_are_this_rounds_deltas():
    _, sampler, learner = _setup()
    good, bad = sampler.sample(), sampler.sample()
    bad["rewards"][0, 0] = np.nan
    good.env_faults = {
        "raised": 1,
        "nonfinite_obs": 2,
        "nonfinite_reward": 0,
        "empty_mask": 0,
        "unacted_agent": 0,
    }
    good.worker_index, good.incarnation = 0, "a"
    out = learner.train_round([good, bad])
    assert out.rejected_segments == 1 and "non-finite" in out.reject_reason
    assert out.env_faults == {
        "raised": 1,
        "nonfinite_obs": 2,
        "nonfinite_reward": 0,
        "empty_mask": 0,
        "unacted_agent": 0,
    }
    assert out.metrics is None  # one good segment of the two a round needs
    again = sampler.sample()
    again.worker_index, again.incarnation = 0, "b"  # worker 0 came back as a new process
    out = learner.train_round([again])
    assert out.worker_restarts == 1 and out.rejected_segments == 0 and out.metrics is not None


def test_lockstep_updates_on_the_newest_segments_when_one_was_lost():
    """A data-parallel replica that lost a segment still takes part in the update."""
    _, sampler, learner = _setup()
    learner.train_round([sampler.sample(), sampler.sample()])
    assert learner.train_round([sampler.sample()]).metrics is None
    assert learner.train_round([sampler.sample()], lockstep=True).metrics is not None


def test_time_major_puts_segments_side_by_side():
    stacked = {
        "rewards": torch.arange(2 * 3 * 4).reshape(2, 3, 4),
        "last_value": torch.arange(8).reshape(2, 4),
    }
    out = time_major(stacked)
    assert out["rewards"].shape == (3, 8) and out["last_value"].shape == (8,)
    assert torch.equal(out["rewards"][:, 4:], stacked["rewards"][1])


def test_state_round_trips_into_a_fresh_learner():
    cfg, sampler, learner = _setup()
    for _ in range(2):
        learner.train_round([sampler.sample(), sampler.sample()])
    fresh = Learner(cfg, sampler.spec)
    fresh.load_state_dict(learner.state_dict())
    assert fresh.version == learner.version == 2 and fresh.updates == 2
    for key, value in learner.weights().items():
        assert torch.equal(value, fresh.weights()[key]), key
    seg = sampler.sample()
    a, b = learner.train_round([seg, seg]).metrics, fresh.train_round([seg, seg]).metrics
    assert a["policy_loss"] == b["policy_loss"]  # the same generator state, the same permutation


def _corrected(correction: str):
    """(sampler, a plain learner, a learner with `correction` and the same weights, a segment both
    acted, that segment time-major [T, 1, ...]): the segment is on-policy for both until one trains."""
    cfg, sampler, plain = _setup()
    ccfg = cfg.model_copy(
        update={"learner": cfg.learner.model_copy(update={"off_policy_correction": correction})}
    )
    corrected = Learner(ccfg, sampler.spec)
    corrected.load_state_dict(plain.state_dict())
    sampler.set_weights(0, plain.weights())
    seg = sampler.sample()
    data = time_major({k: torch.from_numpy(np.ascontiguousarray(v))[None] for k, v in seg.arrays.items()})
    return sampler, plain, corrected, seg, data


def test_vtrace_on_fresh_segments_gives_gae_returns_and_corrects_stale_ones():
    """On-policy (the segment acted by the learner's own weights) V-trace's targets are GAE's
    lambda-returns; on a segment acted by older weights they differ (the correction at work)."""
    sampler, plain, vtrace, _, data = _corrected("vtrace")
    gae_batch, _ = plain.algo.batch(data)
    v_batch, _ = vtrace.algo.batch(data)
    torch.testing.assert_close(v_batch["returns"], gae_batch["returns"], atol=2e-4, rtol=1e-4)
    for _ in range(3):  # the learner moves on; the segment is now three versions old
        vtrace.train_round([sampler.sample(), sampler.sample()])
    stale, _ = vtrace.algo.batch(data)
    assert (stale["returns"] - gae_batch["returns"]).abs().max() > 1e-3


def test_decoupled_ppo_clips_around_the_proximal_policy_and_weights_stale_samples():
    """Decoupled PPO: the clip's centre is the policy the update starts from, and each sample is
    weighted by pi_prox / pi_behaviour: 1 on fresh segments, spread out on stale ones."""
    sampler, _, decoupled, seg, data = _corrected("decoupled")
    fresh, _ = decoupled.algo.batch(data)
    torch.testing.assert_close(fresh["is_weight"], torch.ones_like(fresh["is_weight"]), atol=1e-5, rtol=0)
    torch.testing.assert_close(fresh["logp"], data["logp"].flatten(), atol=1e-5, rtol=0)
    for _ in range(3):
        decoupled.train_round([sampler.sample(), sampler.sample()])
    stale, _ = decoupled.algo.batch(data)
    assert (stale["is_weight"] - 1).abs().max() > 1e-3 and stale["is_weight"].max() <= 2.0
    # The clip's centre moved to the current policy: its log-probs, not the behaviour's.
    assert (stale["logp"] - data["logp"].flatten()).abs().max() > 1e-3
    torch.testing.assert_close(stale["advantages"], fresh["advantages"])  # GAE on the behaviour's values
    decoupled.train_round([seg, seg])  # and it trains
