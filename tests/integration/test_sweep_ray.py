"""`relay sweep` on real Ray: each search and scheduler runs trials that are plain relay runs; a
failing trial errors alone; Ctrl-C stops every trial with its checkpoint and --resume finishes the
sweep; PBT restores one trial's checkpoint into another; trials spread over the nodes of a
`ray.cluster_utils.Cluster`; a sweep's trials are child runs of its MLflow run.
"""

import itertools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relay_rl.contracts.config import load_config
from tests.helpers import ROOT
from tests.helpers_proc import metrics_lines, processes_mentioning, ray_env, wait_for

pytestmark = pytest.mark.ray
CARTPOLE = "configs/cartpole_ppo.yaml"
SMALL = ["metrics.tensorboard=false", "rollout.num_workers=1", "stop.episode_return_mean=null"]


def sweep_args(folder: Path, *args: str, sets: list[str] = SMALL) -> list[str]:
    cmd = [sys.executable, "-m", "relay_rl.services.cli", "sweep", *args, "--dir", str(folder)]
    for kv in sets:
        cmd += ["--set", kv]
    return cmd


def run_sweep(cmd: list[str], ray_tmp: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, cwd=ROOT, env=ray_env(ray_tmp), capture_output=True, text=True, timeout=timeout
    )


def trial_states(folder: Path) -> dict[str, dict]:
    states: dict[str, dict] = {}
    for line in (folder / "trials.jsonl").read_text().splitlines():
        rec = json.loads(line)
        states.setdefault(rec["trial"], {}).update(rec)
    return states


def test_optuna_trials_run_and_a_broken_one_fails_alone(tmp_path, ray_tmp, mlflow_server):
    """Optuna draws env.kwargs.broken; trials whose env cannot be built error, the others finish,
    and each trial is an MLflow child run of the sweep's run."""
    from mlflow import MlflowClient

    folder = tmp_path / "sw"
    sets = [
        *SMALL,
        "env.id=tests.rollout_workers.faulty_envs:make_cartpole",
        "stop.env_steps=2048",
        f"metrics.mlflow.tracking_uri={mlflow_server}",
        "metrics.mlflow.experiment=sweeps",
    ]
    cmd = sweep_args(folder, CARTPOLE, "--search", "optuna", "--samples", "4", sets=sets)
    cmd += ["--param", "env.kwargs.broken=choice(false, true)", "--param", "learner.lr=loguniform(1e-4,3e-3)"]
    proc = run_sweep(cmd, ray_tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    states = trial_states(folder)
    assert sorted(states) == ["t000", "t001", "t002", "t003"]
    by_status = {t: s["status"] for t, s in states.items()}
    assert set(by_status.values()) == {"done", "error"}, by_status
    for trial, status in by_status.items():
        broken = states[trial]["params"]["env.kwargs.broken"]
        assert (status == "error") == broken, (trial, states[trial])
        if status == "done":
            assert metrics_lines(folder / trial)[-1]["env_steps"] >= 2048
    assert "broken on purpose" in proc.stdout  # the table says why
    best = load_config(folder / "best.yaml")
    assert best.env.kwargs == {"broken": False} and best.sweep.params == {}
    client = MlflowClient(mlflow_server)
    runs = client.search_runs([client.get_experiment_by_name("sweeps").experiment_id])
    parent = [r for r in runs if r.info.run_name == folder.name]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id]
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    assert sorted(r.info.run_name for r in children) == sorted(t for t, s in by_status.items() if s == "done")


def test_grid_with_asha_stops_a_trial_early_and_ctrl_c_then_resume_finishes(tmp_path, ray_tmp):
    folder = tmp_path / "sw"
    sets = [*SMALL, "stop.env_steps=40000", "sweep.grace_iterations=3", "checkpoint.interval=5"]
    # epochs=1 at lr 1e-5 barely learns; epochs=4 at 2e-3 does: ASHA stops the first at its rung.
    cmd = sweep_args(
        folder, CARTPOLE, "--search", "grid", "--scheduler", "asha", "--max-concurrent", "1", sets=sets
    )
    cmd += ["--param", "learner.epochs=grid(4, 1)", "--param", "learner.lr=choice(2e-3)"]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=ray_env(ray_tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        wait_for(lambda: len(metrics_lines(folder / "t000")) >= 20, 240, "the first trial's 20th line")
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 130, err.decode()[-3000:]
    assert b"relay sweep --resume" in err
    interrupted = metrics_lines(folder / "t000")
    ckpts = sorted((folder / "t000" / "checkpoints").glob("ckpt-*.pt"))
    assert ckpts[-1].name == f"ckpt-{interrupted[-1]['iteration']:08d}.pt"  # the final checkpoint
    assert trial_states(folder)["t000"]["event"] == "started"  # not ended: resumable

    resumed = run_sweep(
        [sys.executable, "-m", "relay_rl.services.cli", "sweep", "--resume", str(folder)], ray_tmp
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    states = trial_states(folder)
    assert states["t000"]["status"] == "done"
    lines = metrics_lines(folder / "t000")
    assert [x["iteration"] for x in lines] == list(range(1, len(lines) + 1))  # continued, none lost
    assert lines[-1]["env_steps"] >= 40000
    assert states["t001"]["status"] == "stopped early"
    assert len(metrics_lines(folder / "t001")) < len(lines)
    assert (folder / "t001" / "checkpoints").is_dir() and any((folder / "t001" / "checkpoints").iterdir())
    summary = json.loads((folder / "summary.json").read_text())
    assert [t["status"] for t in summary["trials"]] == ["done", "stopped early"]


def test_pbt_restores_better_trials_checkpoints_into_worse_ones(tmp_path, ray_tmp):
    folder = tmp_path / "sw"
    sets = ["metrics.tensorboard=false", "rollout.num_workers=0", "stop.episode_return_mean=null"]
    sets += ["stop.env_steps=4096", "sweep.perturbation_interval=2"]
    cmd = sweep_args(
        folder, CARTPOLE, "--scheduler", "pbt", "--samples", "2", "--max-concurrent", "2", sets=sets
    )
    cmd += ["--param", "learner.lr=loguniform(1e-5,3e-3)", "--param", "learner.clip_ratio=uniform(0.1,0.3)"]
    proc = run_sweep(cmd, ray_tmp, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    exploits = [
        (trial.name, json.loads(line))
        for trial in sorted(folder.glob("t00?"))
        if (trial / "exploits.jsonl").exists()
        for line in (trial / "exploits.jsonl").read_text().splitlines()
    ]
    assert exploits, "no trial exploited another"
    # two trials (one per core): at each perturbation the worse one takes the better one's checkpoint
    for trial in {t for t, _ in exploits}:  # each exploit taken once (a resumed pause is no new one)
        seen = [(e["from_trial"], e["from_iteration"]) for t, e in exploits if t == trial]
        assert all(a != b for a, b in itertools.pairwise(seen)), seen
    for trial, exploit in exploits:
        assert exploit["from_trial"] != trial and exploit["from_trial"].startswith("t00")
        lr = exploit["params"]["learner.lr"]
        assert 1e-5 <= lr <= 3e-3  # perturbed within its range
        assert load_config(folder / trial / "config.yaml").learner.lr > 0
    trial = exploits[0][0]
    counts = [x["pbt_exploits"] for x in metrics_lines(folder / trial)]
    assert counts[0] == 0 and counts[-1] == sum(1 for t, _ in exploits if t == trial)
    assert all(s["status"] == "done" for s in trial_states(folder).values())


def test_trials_spread_over_the_nodes_of_a_cluster(tmp_path):
    """Two nodes of 2 CPUs: each trial (learner + one worker) fits one node, so both run at once."""
    import ray
    from ray.cluster_utils import Cluster

    from relay_rl.services.cli import main

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    folder = tmp_path / "sw"
    try:
        argv = ["sweep", str(ROOT / CARTPOLE), "--dir", str(folder), "--address", cluster.address]
        argv += ["--param", "learner.lr=uniform(1e-3, 2e-3)", "--samples", "2"]  # random search
        for kv in [*SMALL, "stop.env_steps=12000", "metrics.progress=none"]:
            argv += ["--set", kv]
        assert main(argv) == 0
        # Where each trial's learner ran, from the cluster's own record of its (now dead) actors:
        # a placement fact, where comparing the trials' start and end times flaked on a loaded
        # machine (two-second trials whose starts Tune staggers by as much).
        from ray.util.state import list_actors

        if not ray.is_initialized():  # the sweep stays connected to a cluster it did not start
            ray.init(address=cluster.address)
        learners = list_actors(filters=[("class_name", "=", "LearnerActor")], detail=True)
        wanted = {n.node_id for n in cluster.worker_nodes}
    finally:
        ray.shutdown()
        cluster.shutdown()
    lines = [json.loads(x) for x in (folder / "trials.jsonl").read_text().splitlines()]
    starts = {x["trial"]: x["t"] for x in lines if x["event"] == "started"}
    assert sorted(starts) == ["t000", "t001"] and all(
        x["status"] == "done" for x in lines if x["event"] == "ended"
    )
    # One learner on each 2-CPU node: neither trial waited for the other's node to free up.
    assert sorted(a.node_id for a in learners) == sorted(wanted), learners


def test_ctrl_c_twice_stops_at_once_and_leaves_nothing_running(tmp_path, ray_tmp):
    """The second Ctrl-C cuts Tune's graceful stop short: exit 130 in bounded time, and none of the
    Ray processes the sweep started (its agents ignore SIGTERM) outlives it."""
    folder = tmp_path / "sw"
    sets = [*SMALL, "stop.env_steps=400000"]
    cmd = sweep_args(folder, CARTPOLE, "--search", "grid", sets=sets)
    cmd += ["--param", "learner.lr=grid(1e-3, 2e-3)"]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=ray_env(ray_tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        wait_for(lambda: len(metrics_lines(folder / "t000")) >= 3, 240, "the first trial's third line")
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 130, err.decode()[-3000:]
    wait_for(lambda: not processes_mentioning(ray_tmp), 30, "every Ray process of the sweep to end")
