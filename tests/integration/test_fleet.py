"""The elastic fleet with real Ray actors: a slow env (a step that sleeps, using no CPU) starves
the learner, so the fleet grows and throughput rises; a learner saturated by a heavy update with
segments queueing retires workers; every line says how many workers were live."""

import json

import pytest

from contracts.config import load_config
from tests.helpers import ray_loop

pytestmark = pytest.mark.ray
SLOW = "tests.rollout_workers.slow_envs:make"


def _lines(loop) -> list[dict]:
    return [json.loads(x) for x in loop.run.metrics_path.read_text().splitlines()]


def _rate(lines: list[dict]) -> float:
    """Env steps/s over a stretch of lines."""
    return (lines[-1]["env_steps"] - lines[0]["env_steps"]) / (lines[-1]["wall_s"] - lines[0]["wall_s"])


def _cfg(*sets: str):
    base = [
        "metrics.progress=none",
        "metrics.tensorboard=false",
        "stop.episode_return_mean=null",
        "rollout.mode=async",
        "rollout.autoscale=true",
        "rollout.num_cpus_per_worker=0.25",
        "env.num_envs=4",
        "rollout.rollout_len=16",
        "learner.buffer_size=256",
        "learner.batch_size=64",
    ]
    return load_config("configs/cartpole_ppo.yaml", [*base, *sets])


def test_a_starving_learner_grows_the_fleet_and_throughput_rises(local_ray, tmp_path):
    cfg = _cfg(
        f"env.id={SLOW}",
        "env.kwargs={delay: 0.004}",
        "rollout.num_workers=1",
        "rollout.min_workers=1",
        "rollout.max_workers=4",
        "learner.epochs=1",
        "stop.env_steps=9000",
    )
    loop, backend = ray_loop(cfg, tmp_path / "grow")
    try:
        assert loop.run_until_stop() == "env_steps"
        lines = _lines(loop)
        workers = [x["num_workers"] for x in lines]
        assert workers[0] == 1 and max(workers) == 4 and workers == sorted(workers)
        assert all(x["learner_busy"] < 0.5 for x in lines[:3])
        one, four = [x for x in lines if x["num_workers"] == 1], [x for x in lines if x["num_workers"] == 4]
        assert len(four) >= 5 and _rate(four) > 2.0 * _rate(one), (_rate(one), _rate(four))
    finally:
        backend.close()


def test_a_saturated_learner_with_a_queue_retires_workers(local_ray, tmp_path):
    cfg = _cfg(
        "rollout.num_workers=3",
        "rollout.min_workers=1",
        "rollout.max_workers=3",
        "rollout.max_segments_in_flight=2",
        "learner.buffer_size=192",
        "learner.epochs=60",
        "stop.env_steps=4000",
    )
    loop, backend = ray_loop(cfg, tmp_path / "shrink")
    try:
        loop.run_until_stop()
        lines = _lines(loop)
        workers = [x["num_workers"] for x in lines]
        assert workers[0] == 3 and workers[-1] == 1 and workers == sorted(workers, reverse=True)
        assert all(x["learner_busy"] > 0.9 for x in lines[2:6])
        assert lines[-1]["lost_segments"] == 0  # retired workers drained, nothing thrown away
    finally:
        backend.close()
