"""The elastic fleet with real Ray actors: a slow env (a step that sleeps, using no CPU) starves
the learner, so the fleet grows and throughput rises; a learner saturated by a heavy update with
segments queueing retires workers; every line says how many workers were live."""

import json

import pytest

from relay_rl.contracts.config import load_config
from tests.helpers import ELASTIC_CARTPOLE, ELASTIC_SATURATED, ELASTIC_STARVING, ray_loop

pytestmark = pytest.mark.ray


def _lines(loop) -> list[dict]:
    return [json.loads(x) for x in loop.run.metrics_path.read_text().splitlines()]


def _rate(lines: list[dict]) -> float:
    """Env steps/s over a stretch of lines."""
    return (lines[-1]["env_steps"] - lines[0]["env_steps"]) / (lines[-1]["wall_s"] - lines[0]["wall_s"])


def _cfg(*sets: str):
    base = ["metrics.progress=none", "metrics.tensorboard=false", *ELASTIC_CARTPOLE]
    return load_config("configs/cartpole_ppo.yaml", [*base, *sets])


def test_a_starving_learner_grows_the_fleet_and_throughput_rises(local_ray, tmp_path):
    cfg = _cfg(*ELASTIC_STARVING, "stop.env_steps=9000")
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
    cfg = _cfg(*ELASTIC_SATURATED, "stop.env_steps=4000")
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
