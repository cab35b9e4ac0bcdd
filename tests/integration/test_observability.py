"""The same learner metrics in metrics.jsonl, TensorBoard event files and Ray's Prometheus endpoint."""

import json
import socket
import time
import urllib.request

import pytest
import ray
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from relay_rl.services.cli import main

pytestmark = pytest.mark.ray


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_with_metrics():
    port = _free_port()
    ray.init(address="local", num_cpus=3, include_dashboard=False, _metrics_export_port=port)
    yield port
    ray.shutdown()


def test_prometheus_and_tensorboard_show_the_jsonl_numbers(ray_with_metrics, tmp_path):
    run = tmp_path / "obs-run"
    assert (
        main(
            [
                "train",
                "configs/cartpole_ppo.yaml",
                "--run-dir",
                str(run),
                "--set",
                "rollout.num_workers=1",
                "--set",
                "learner.buffer_size=512",
                "--set",
                "stop.env_steps=5000",
                "--set",
                "stop.episode_return_mean=null",
                "--set",
                "metrics.progress=none",
            ]
        )
        == 0
    )
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]

    events = EventAccumulator(str(run / "events"))
    events.Reload()
    tb = events.Scalars("episode_return_mean")
    assert [e.step for e in tb] == [x["env_steps"] for x in lines]
    assert [round(e.value, 3) for e in tb] == [round(x["episode_return_mean"], 3) for x in lines]
    assert {"approx_kl", "policy_loss", "learner_samples_per_s"} <= set(events.Tags()["scalars"])

    want = "ray_relay_episode_return_mean{"
    deadline = time.time() + 60
    while True:
        body = (
            urllib.request.urlopen(f"http://127.0.0.1:{ray_with_metrics}/metrics", timeout=10).read().decode()
        )
        found = [x for x in body.splitlines() if x.startswith(want) and 'run="obs-run"' in x]
        # Ray's agent exports every few seconds: under load the first scrape may hold an older line's value.
        final = (
            bool(found) and abs(float(found[0].rsplit(" ", 1)[1]) - lines[-1]["episode_return_mean"]) < 1e-3
        )
        if final or time.time() > deadline:
            break
        time.sleep(2)
    assert found, "relay's gauges did not reach Ray's Prometheus endpoint"
    assert abs(float(found[0].rsplit(" ", 1)[1]) - lines[-1]["episode_return_mean"]) < 1e-3
    assert any(x.startswith("ray_relay_env_steps_total") for x in body.splitlines())
    assert any(x.startswith("ray_relay_device_memory_peak_bytes") for x in body.splitlines())
