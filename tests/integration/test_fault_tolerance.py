"""Faults through real Ray actors: a killed rollout worker, a killed learner (no mocks)."""

import json
import threading
import time

import pytest
import ray

from relay_rl.contracts.config import load_config
from tests.helpers import ray_loop

pytestmark = pytest.mark.ray


def _loop(tmp_path, *overrides):
    cfg = load_config(
        "configs/cartpole_ppo.yaml", ["metrics.progress=none", "stop.episode_return_mean=null", *overrides]
    )
    return ray_loop(cfg, tmp_path / "run")


def _lines(loop):
    return [json.loads(x) for x in loop.run.metrics_path.read_text().splitlines()]


def _after_iterations(loop, count: int, action) -> threading.Thread:
    """Run `action` once the run has written `count` metrics lines (so it is mid-training)."""

    def wait_then_act():
        deadline = time.time() + 120
        while time.time() < deadline:
            if (
                loop.run.metrics_path.exists()
                and len(loop.run.metrics_path.read_text().splitlines()) >= count
            ):
                action()
                return
            time.sleep(0.05)

    thread = threading.Thread(target=wait_then_act, daemon=True)
    thread.start()
    return thread


def test_killed_rollout_worker_is_restarted_by_ray_and_training_goes_on(local_ray, tmp_path):
    loop, backend = _loop(tmp_path, "stop.env_steps=30000")
    victim = backend.workers[1]
    _after_iterations(loop, 3, lambda: ray.kill(victim, no_restart=False))
    try:
        assert loop.run_until_stop() == "env_steps"
        lines = _lines(loop)
        assert lines[-1]["worker_restarts"] >= 1
        assert lines[-1]["env_steps"] >= 30000
        assert ray.get(victim.env_spec.remote()).obs_shape == (4,)  # the same handle answers again
        # the restarted worker draws fresh seeds instead of replaying the run's first segments
        assert ray.get(victim.seed_stream.remote()) != 0
        assert ray.get(backend.workers[0].seed_stream.remote()) == 0
    finally:
        backend.close()


def test_killed_learner_is_restarted_from_the_newest_checkpoint(local_ray, tmp_path, capsys):
    loop, backend = _loop(tmp_path, "stop.env_steps=30000", "checkpoint.interval=2")
    old = backend.learners.lead
    _after_iterations(loop, 5, lambda: ray.kill(old))
    try:
        assert loop.run_until_stop() == "env_steps"
        lines = _lines(loop)
        assert lines[-1]["learner_restarts"] == 1
        assert backend.learners.lead is not old
        assert "restarted from ckpt-" in capsys.readouterr().err
        versions = [x["weights_version"] for x in lines]
        # after the restart the version resumes from the checkpoint, never from 0
        assert min(versions[len(versions) // 2 :]) > 2
    finally:
        backend.close()
