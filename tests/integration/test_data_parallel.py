"""Data-parallel learners: two learner actors in one process group (gloo here; HCCL on Ascend and
NCCL on CUDA use the same code), each training on half of every round as a replica of torch's DDP,
stay identical and learn."""

import threading

import pytest
import ray
import torch

from relay_rl.contracts.config import load_config
from relay_rl.learner.actor import from_host
from relay_rl.services.driver.backends import RayBackend
from relay_rl.services.driver.loop import TrainingLoop
from relay_rl.services.driver.preflight import check_env
from relay_rl.services.runs.run_dir import RunDir
from tests.helpers_proc import metrics_lines, wait_for

pytestmark = pytest.mark.ray


@pytest.mark.slow
def test_two_learners_average_gradients_and_stay_identical(local_ray, tmp_path):
    cfg = load_config(
        "configs/cartpole_ppo.yaml",
        [
            "learner.num_learners=2",
            "learner.batch_size=256",
            "learner.device=cpu",
            "stop.env_steps=20000",
            "stop.episode_return_mean=null",
            "metrics.progress=none",
            "learner.target_kl=0.02",
        ],
    )
    backend = RayBackend(cfg, check_env(cfg))
    try:
        assert len(backend.learners) == 2
        loop = TrainingLoop(cfg, RunDir.claim(tmp_path / "run", cfg), backend)
        assert loop.run_until_stop() == "env_steps"
        states = [from_host(s) for s in ray.get([lrn.state_dict.remote() for lrn in backend.learners.ranks])]
        for key, value in states[0]["model"].items():
            torch.testing.assert_close(value, states[1]["model"][key], atol=0, rtol=0, msg=key)
        assert states[0]["updates"] == states[1]["updates"] > 10
        lines = loop.run.metrics_path.read_text().splitlines()
        import json

        first, last = json.loads(lines[0]), json.loads(lines[-1])
        assert last["episode_return_mean"] > 2 * first["episode_return_mean"]
        assert last["env_steps"] >= 20000  # both learners' segments are counted
    finally:
        backend.close()


def test_learner_count_must_divide_the_workers():
    from relay_rl.contracts.config import ConfigError

    with pytest.raises(ConfigError, match=r"learner.num_learners=2 must divide rollout.num_workers=3"):
        load_config(
            "configs/cartpole_ppo.yaml",
            ["learner.num_learners=2", "rollout.num_workers=3", "learner.buffer_size=1536"],
        )


def test_a_data_parallel_group_that_loses_a_learner_is_restarted_from_the_checkpoint(
    local_ray, tmp_path, capsys
):
    """One replica dies mid-run; its peer would wait in its collective forever, so the whole group
    is recreated, joins a new process group and loads the newest checkpoint."""
    cfg = load_config(
        "configs/cartpole_ppo.yaml",
        [
            "learner.num_learners=2",
            "learner.batch_size=256",
            "learner.device=cpu",
            "stop.env_steps=12000",
            "stop.episode_return_mean=null",
            "metrics.progress=none",
            "checkpoint.interval=2",
        ],
    )
    backend = RayBackend(cfg, check_env(cfg))
    loop = TrainingLoop(cfg, RunDir.claim(tmp_path / "run", cfg), backend)
    victim = backend.learners.ranks[1]

    def kill_later() -> None:
        wait_for(lambda: len(metrics_lines(loop.run.root)) >= 5, 120, "five iterations")
        ray.kill(victim)

    threading.Thread(target=kill_later, daemon=True).start()
    try:
        assert loop.run_until_stop() == "env_steps"
        lines = metrics_lines(loop.run.root)
        assert lines[-1]["learner_restarts"] == 1 and victim not in backend.learners.ranks
        assert len(backend.learners) == 2 and "restarted from ckpt-" in capsys.readouterr().err
        states = [from_host(s) for s in ray.get([lrn.state_dict.remote() for lrn in backend.learners.ranks])]
        for key, value in states[0]["model"].items():
            torch.testing.assert_close(value, states[1]["model"][key], atol=0, rtol=0, msg=key)
    finally:
        backend.close()
