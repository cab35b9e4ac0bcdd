"""The metrics sinks: metrics.jsonl is strict JSON (non-finite numbers as null), TensorBoard gets
the numeric keys of contracts/metrics.py and nothing else, a failing optional sink never stops
training, and truncation for a resume keeps only lines up to the checkpoint."""

import json
import math

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from relay_rl.contracts.config import build_config
from relay_rl.services.runs.metric_keys import catalog
from relay_rl.services.runs.run_dir import RunDir
from relay_rl.services.runs.sinks import MetricsSinks, truncate_metrics


def _run(tmp_path) -> RunDir:
    return RunDir.claim(tmp_path / "run", build_config({}))


RECORD = {
    "iteration": 1,
    "env_steps": 256,
    "policy_loss": float("nan"),
    "entropy": 0.5,
    "grad_norm": float("inf"),
    "device": "cpu",
    "not_a_metric": 3.0,
    "worker_restarts": 0,
}


def test_jsonl_is_strict_json_and_tensorboard_gets_the_declared_numeric_keys(tmp_path):
    run = _run(tmp_path)
    sinks = MetricsSinks(run, tensorboard=True, prometheus=False)
    sinks.write(RECORD)
    sinks.write({**RECORD, "iteration": 2, "env_steps": 512})
    sinks.close()
    raw = run.metrics_path.read_text()
    assert "NaN" not in raw and "Infinity" not in raw
    first = json.loads(raw.splitlines()[0])
    assert first["policy_loss"] is None and first["grad_norm"] is None and first["device"] == "cpu"
    events = EventAccumulator(str(run.events))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert tags == {"iteration", "env_steps", "entropy", "worker_restarts"}
    assert [e.step for e in events.Scalars("entropy")] == [256, 512]


def test_the_catalog_filters_to_finite_declared_numbers():
    got = dict(catalog().numeric(RECORD))
    assert set(got) == {"iteration", "env_steps", "entropy", "worker_restarts"}
    assert all(k in catalog().keys and math.isfinite(v) for k, v in got.items())


def test_a_failing_optional_sink_is_logged_and_training_goes_on(tmp_path, caplog):
    class Broken:
        def write(self, record):
            raise OSError("disk full")

        def close(self):
            pass

    run = _run(tmp_path)
    sinks = MetricsSinks(run, tensorboard=False, prometheus=False)
    sinks.extra.append(Broken())
    sinks.write(RECORD)
    sinks.close()
    assert "metrics sink Broken failed: disk full" in caplog.text
    assert len(run.metrics_path.read_text().splitlines()) == 1


def test_truncation_keeps_lines_up_to_the_checkpoint_and_drops_torn_ones(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"iteration": 1}\n{"iteration": 2}\nnot json\n{"iteration": 3}\n{"iteration": 4, "x"')
    truncate_metrics(path, 2)
    assert path.read_text() == '{"iteration": 1}\n{"iteration": 2}\n'
    assert not list(tmp_path.glob("*.tmp"))


def test_metrics_lines_are_on_disk_before_each_checkpoint_and_fsynced_in_batches(tmp_path, monkeypatch):
    """A local CartPole run of 60 short rounds, a checkpoint every 5: when a checkpoint file is
    fsynced, every metrics line written so far was fsynced before it (a power loss leaves no
    checkpoint counting lines the disk lacks), and metrics.jsonl is fsynced far less often than
    once a line (an fsync per line cost a language run 0.9 ms of each 23 ms round)."""
    import os

    from tests.helpers import train_local

    real_fsync, synced, problems, metric_syncs = os.fsync, {"size": 0}, [], []

    def fsync(fd: int) -> None:
        real_fsync(fd)
        name = os.readlink(f"/proc/self/fd/{fd}")
        if name.endswith("metrics.jsonl"):
            synced["size"] = os.fstat(fd).st_size
            metric_syncs.append(name)
        elif "ckpt-" in name and os.path.exists(metrics) and os.path.getsize(metrics) != synced["size"]:
            problems.append((name, os.path.getsize(metrics), synced["size"]))

    run = tmp_path / "r"
    metrics = str(run / "metrics.jsonl")
    monkeypatch.setattr(os, "fsync", fsync)
    sets = [
        "env.num_envs=4",
        "rollout.rollout_len=16",
        "learner.buffer_size=64",
        "learner.batch_size=64",
        "learner.epochs=1",
        "stop.env_steps=3840",
        "stop.episode_return_mean=null",
        "checkpoint.interval=5",
    ]
    assert train_local("cartpole_ppo.yaml", run, *sets) == 0
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 60 and not problems, problems
    assert 12 <= len(metric_syncs) < 30, len(metric_syncs)  # one per checkpoint (12), a few more
