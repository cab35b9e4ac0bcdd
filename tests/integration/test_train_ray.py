"""End to end through real Ray actors on a local cluster (few, short, marked `ray`)."""

import json

import pytest

from relay_rl.services.cli import main
from tests.helpers_proc import wait_for

pytestmark = pytest.mark.ray


def _lines(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.slow
def test_cartpole_through_ray_actors_learns(local_ray, tmp_path, mode):
    run = tmp_path / mode
    code = main(
        [
            "train",
            "configs/cartpole_ppo.yaml",
            "--run-dir",
            str(run),
            "--set",
            f"rollout.mode={mode}",
            "--set",
            "stop.env_steps=25000",
            "--set",
            "metrics.progress=none",
        ]
    )
    assert code == 0
    lines = _lines(run)
    assert len(lines) >= 20
    first = [x["episode_return_mean"] for x in lines[:3]]
    last = lines[-1]["episode_return_mean"]
    assert last > 2 * max(first), (first, last)  # returns rise (random CartPole is ~20)
    assert lines[-1]["weights_version"] >= 20  # workers received new weight versions
    lags = [x["policy_lag_mean"] for x in lines]
    if mode == "sync":
        assert all(lag == 0 for lag in lags)
    else:
        assert max(lags) > 0  # async workers sample while the learner updates
    assert lines[-1]["worker_restarts"] == 0 and lines[-1]["rejected_segments"] == 0


@pytest.mark.slow
def test_grpo_token_task_through_ray_rises_above_random(local_ray, tmp_path):
    run = tmp_path / "grpo"
    code = main(
        [
            "train",
            "configs/reverse_digits_grpo.yaml",
            "--run-dir",
            str(run),
            "--set",
            "stop.env_steps=12000",
            "--set",
            "stop.episode_return_mean=null",
            "--set",
            "metrics.progress=none",
        ]
    )
    assert code == 0
    lines = _lines(run)
    assert lines[0]["group_reward_mean"] < 0.35  # random policy: 1/vocab = 0.2
    late = [x["group_reward_mean"] for x in lines[-5:]]
    assert sum(late) / len(late) > 0.3, late
    assert lines[0]["kl_ref"] < 0.05  # starts at the reference (exactly 0 before the first step)
    assert "value_loss" not in lines[-1]


def test_learner_actor_reserves_and_uses_its_cpus(local_ray):
    """learner.num_cpus is both what Ray reserves for the learner actor and its torch threads
    (a CPU learner left at one thread used half of a 2-core machine while its CPUs sat idle)."""
    import ray

    from relay_rl.contracts.config import load_config
    from relay_rl.learner.actor import create_learner_actor
    from relay_rl.rollout_workers.envs import probe_env_spec

    cfg = load_config("configs/cartpole_ppo.yaml", ["learner.num_cpus=3", "learner.device=cpu"])
    total = ray.cluster_resources()["CPU"]  # the earlier tests' actors are gone once this one is placed
    actor = create_learner_actor(cfg, probe_env_spec(cfg.env))
    try:
        assert ray.get(actor.describe.remote())["torch_threads"] == 3
        # the resource view catches up with placement shortly
        wait_for(lambda: ray.available_resources().get("CPU", 0.0) == total - 3, 10, "3 CPUs reserved")
    finally:
        ray.kill(actor)
