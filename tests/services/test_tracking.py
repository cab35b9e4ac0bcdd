"""Tracking: a real MLflow tracking server (tests/conftest.py's `mlflow_server`: 127.0.0.1, SQLite
store, local artifact folder) read back through MLflow's client; W&B in offline mode, its run file
read back; servers that refuse or never answer cost training nothing but a counted error and one
line.
"""

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks.common import free_port
from tests.helpers import ROOT, train_local
from tests.helpers_proc import metrics_lines, wait_for
from tests.wandb_records import read_wandb_run


def test_a_run_is_tracked_in_mlflow(mlflow_server, tmp_path):
    from mlflow import MlflowClient

    """Every line arrives at the default interval (batched, not thinned), and a password in the
    tracking URI reaches no file and no MLflow param."""
    run = tmp_path / "run"
    with_password = mlflow_server.replace("http://", "http://alice:hunter2@")
    sets = [f"metrics.mlflow.tracking_uri={with_password}", "metrics.mlflow.experiment=relay-test"]
    assert (
        train_local("cartpole_ppo.yaml", run, "stop.env_steps=2048", "checkpoint.keep_best=false", *sets) == 0
    )
    written = [p for p in run.rglob("*") if p.is_file()]
    assert written and not [p for p in written if b"hunter2" in p.read_bytes()]
    assert "alice:***@" in (run / "config.yaml").read_text()
    client = MlflowClient(mlflow_server)
    found = client.search_runs([client.get_experiment_by_name("relay-test").experiment_id])
    assert len(found) == 1
    tracked = found[0]
    assert tracked.info.status == "FINISHED" and tracked.info.run_name == "run"
    assert tracked.data.params["learner.lr"] == "0.002" and tracked.data.params["env.id"] == "CartPole-v1"
    assert not [v for v in tracked.data.params.values() if "hunter2" in v]
    lines = metrics_lines(run)
    history = client.get_metric_history(tracked.info.run_id, "episode_return_mean")
    assert [m.step for m in history] == [
        x["env_steps"] for x in lines if x["episode_return_mean"] is not None
    ]
    assert history[-1].value == pytest.approx(lines[-1]["episode_return_mean"])
    assert all(x["tracking_errors"] == 0 for x in lines)
    files = {a.path for a in client.list_artifacts(tracked.info.run_id)}
    files |= {a.path for a in client.list_artifacts(tracked.info.run_id, "checkpoints")}
    assert {"config.yaml", "checkpoints/ckpt-00000008.pt"} <= files


def test_a_refusing_server_costs_one_line_and_a_count(tmp_path):
    port = free_port()  # nothing listens there
    proc = subprocess.run(
        [
            sys.executable, "-m", "relay_rl.services.train", "configs/cartpole_ppo.yaml",
            "--run-dir", str(tmp_path / "run"), "--set", "rollout.num_workers=0",
            "--set", "stop.env_steps=2048", "--set", "metrics.progress=none",
            "--set", f"metrics.mlflow.tracking_uri=http://127.0.0.1:{port}",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    failed = [ln for ln in proc.stderr.splitlines() if "tracking failed" in ln]
    assert len(failed) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "metrics lines were not delivered (metrics.jsonl has them all)" in proc.stderr
    lines = metrics_lines(tmp_path / "run")
    assert len(lines) == 8 and lines[-1]["tracking_errors"] >= 1


def test_a_server_that_never_answers_does_not_hold_training(tmp_path):
    """A listener that accepts connections and never replies: the training loop's writes return at
    once while the tracker's thread waits on it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        from relay_rl.contracts.config import load_config
        from relay_rl.services.tracking import RunInfo, Tracking

        cfg = load_config(None, [f"metrics.mlflow.tracking_uri=http://127.0.0.1:{listener.getsockname()[1]}"])
        tracking = Tracking.from_config(
            cfg, RunInfo(tmp_path, cfg.model_dump(mode="json")), warn=lambda _: None
        )
        wait_for(lambda: held, 30, "the tracker to connect")
        for i in range(2000):
            tracking.write({"iteration": i, "env_steps": i, "episode_return_mean": 1.0})
        assert held and tracking.trackers[0]._thread.is_alive()  # still waiting on the silent server
        t0 = time.monotonic()
        tracking.close("FINISHED", [])
        assert time.monotonic() - t0 < 5  # never answered once: not waited for
    finally:
        stop.set()
        listener.close()
        for conn in held:
            conn.close()


def test_a_run_is_tracked_in_wandb_offline(tmp_path):
    run = tmp_path / "run"
    sets = ["stop.env_steps=2048", "metrics.wandb.mode=offline", "metrics.wandb.min_interval_s=0"]
    assert train_local("cartpole_ppo.yaml", run, *sets) == 0
    lines = metrics_lines(run)
    # W&B's own process (wandb-core) writes the run file; finish() can return before its last
    # records are on disk on a loaded machine.
    wait_for(lambda: read_wandb_run(run / "wandb").exit_code is not None, 60, "W&B's run file")
    wait_for(lambda: len(read_wandb_run(run / "wandb").history) == len(lines), 60, "W&B's history")
    record = read_wandb_run(run / "wandb")
    assert [h["env_steps"] for h in record.history] == [x["env_steps"] for x in lines]
    assert record.history[-1]["episode_return_mean"] == pytest.approx(lines[-1]["episode_return_mean"])
    assert record.config["learner.lr"] == "0.002"  # flattened as MLflow params are
    assert record.exit_code == 0
    kept = {p.relative_to(record.folder / "files").as_posix() for p in (record.folder / "files").rglob("*.*")}
    assert {"config.yaml", "checkpoints/ckpt-00000008.pt"} <= kept


def test_a_missing_tracker_package_is_refused_up_front(capsys, tmp_path, monkeypatch):
    """The package is hidden from the import system (it is installed here): `relay train` then
    refuses the config in one line, creating nothing, as on a machine without the extra."""
    from relay_rl.services.cli import main

    monkeypatch.setitem(sys.modules, "wandb", None)
    run = tmp_path / "run"
    argv = [
        "train",
        str(ROOT / "configs/cartpole_ppo.yaml"),
        "--run-dir",
        str(run),
        "--set",
        "metrics.wandb.mode=offline",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "relay-rl[wandb]" in err, err
    assert not Path(run).exists()


class Recording:
    """A tracker client that keeps what it is sent (the tracking queue's logic, without a server)."""

    def __init__(self, local: bool = True, start_s: float = 0.0) -> None:
        self.lines: list[dict] = []
        self.calls = 0
        self.status = None
        self.local, self.start_s = local, start_s

    def start(self) -> None:
        time.sleep(self.start_s)

    def log(self, lines: list[dict]) -> None:
        self.lines += lines
        self.calls += 1

    def log_files(self, files) -> None: ...
    def finish(self, status: str) -> None:
        self.status = status


def test_lines_are_batched_to_the_interval_and_every_one_arrives():
    """min_interval_s sets how often a call goes, not which lines: 100 lines inside one interval
    arrive in two calls (the first line, then the held 99 at close), every one at its env steps."""
    from relay_rl.services.tracking import Tracker

    client = Recording()
    tracker = Tracker("recording", client, warn=print, min_interval_s=3600)
    for i in range(1, 101):
        tracker.offer({"iteration": i, "env_steps": 10 * i, "episode_return_mean": float(i)})
    assert tracker.close("FINISHED", [], time.monotonic() + 30) == 0
    assert [x["iteration"] for x in client.lines] == list(range(1, 101)) and client.status == "FINISHED"
    assert [x["env_steps"] for x in client.lines] == [10 * i for i in range(1, 101)]
    assert client.calls <= 3
    every = Recording()
    tracker = Tracker("recording", every, warn=print, min_interval_s=0)
    for i in range(1, 101):
        tracker.offer({"iteration": i, "env_steps": 10 * i})
    tracker.close("KILLED", [], time.monotonic() + 30)
    assert [x["iteration"] for x in every.lines] == list(range(1, 101)) and every.status == "KILLED"


def test_a_run_that_ends_before_a_local_tracker_started_still_sends_its_lines():
    """W&B offline's init took ~2.7 s on a loaded machine, longer than a 2,048-step run: closing
    waits for a local tracker's start (it has no server that could never answer), so every line
    and the status go; a tracker with a server is not waited for until it answered once."""
    from relay_rl.services.tracking import Tracker

    slow = Recording(local=True, start_s=1.5)
    tracker = Tracker("slow", slow, warn=lambda _: None, min_interval_s=0)
    for i in range(1, 9):
        tracker.offer({"iteration": i, "env_steps": 10 * i})
    assert tracker.close("FINISHED", [], time.monotonic() + 30) == 0
    assert [x["iteration"] for x in slow.lines] == list(range(1, 9)) and slow.status == "FINISHED"
    remote = Recording(local=False, start_s=3.0)
    tracker = Tracker("remote", remote, warn=lambda _: None, min_interval_s=0)
    tracker.offer({"iteration": 1, "env_steps": 10})
    t0 = time.monotonic()
    assert tracker.close("FINISHED", [], time.monotonic() + 30) == 1
    assert time.monotonic() - t0 < 2.5 and remote.status is None
