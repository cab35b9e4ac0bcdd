"""Ray's own autoscaler on fake nodes with deploy/cluster.yaml's node types (scaled down).

A run asking for more rollout workers than the head holds makes the autoscaler add CPU rollout
nodes; the learner lands on the node type advertising the NPU resource; idle nodes go away after.
The NPU here is Ray's custom resource on a fake node (no Ascend device exists on CI machines), so
the learner asks for it through `learner.ray_resources` and computes on the CPU.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import ray
import yaml
from ray.cluster_utils import AutoscalingCluster

from relay_rl.contracts.config import load_config
from relay_rl.services.driver.backends import RayBackend
from relay_rl.services.driver.loop import TrainingLoop
from relay_rl.services.driver.preflight import check_env
from relay_rl.services.runs.run_dir import RunDir
from tests.helpers_proc import end_processes_of, free_port, processes_of

pytestmark = pytest.mark.ray
ROOT = Path(__file__).parents[2]


def _scaled_down_node_types() -> dict:
    """deploy/cluster.yaml's worker node types with the same names and resource kinds, small sizes."""
    deploy = yaml.safe_load((ROOT / "deploy/cluster.yaml").read_text())["available_node_types"]
    assert set(deploy["rollout.cpu"]["resources"]) == {"CPU"}
    assert set(deploy["learner.npu"]["resources"]) == {"CPU", "NPU"}
    return {
        "rollout.cpu": {"resources": {"CPU": 2}, "node_config": {}, "min_workers": 0, "max_workers": 2},
        "learner.npu": {
            "resources": {"CPU": 1, "NPU": 1},
            "node_config": {},
            "min_workers": 0,
            "max_workers": 1,
        },
    }


CURRENT = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"


class FakeNodesCluster(AutoscalingCluster):
    """Ray's AutoscalingCluster on the fake_multinode provider, started and stopped as a head node
    of its own (`own_head_node`: a temp dir and a port of its own, ended by its pid).

    Ray's wheel does not ship the example config AutoscalingCluster reads its defaults from, so
    the cluster-wide fields are given here. Ray's own start and shutdown run `ray stop --force`,
    which ends every Ray process on the machine: it killed a user's training beside the suite.
    """

    def start(self, _system_config=None, override_env=None):
        """Ray's start without its `ray stop --force`, on a port of its own; the processes of the
        session it starts (named by the session folder) are the ones `shutdown` ends."""
        assert not self._head_resources or set(self._head_resources) == {"CPU"}, self._head_resources
        port = free_port()
        # The fake nodes join the head at the provider's gcs_address (6379 where none is given).
        node_ip = ray._private.services.get_node_ip_address()
        self._config["provider"]["gcs_address"] = f"{node_ip}:{port}"
        config = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)  # noqa: SIM115
        with config:
            json.dump(self._config, config)
        cmd = ["ray", "start", "--head", f"--port={port}", f"--autoscaling-config={config.name}"]
        if "CPU" in self._head_resources:
            cmd.append(f"--num-cpus={self._head_resources.pop('CPU')}")
        fake = {"AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_FAKE_CLUSTER": "1"}
        # `ray start` names its cluster in Ray's current-cluster file, where `ray.init("auto")` finds
        # it and its token (an explicit address takes no token); a user's entry is put back after.
        self._current = CURRENT.read_bytes() if CURRENT.exists() else None
        subprocess.check_call(cmd, env={**os.environ, **fake, **(override_env or {})})
        self.address = f"127.0.0.1:{port}"
        gcs = [p.cmdline() for p in processes_of(f"--gcs_server_port={port}")]
        assert gcs, f"no GCS on port {port}"
        log_dir = next(arg for arg in gcs[0] if arg.startswith("--log_dir="))
        self.session = str(Path(log_dir.split("=", 1)[1]).parent)
        ray._private.services.find_gcs_addresses.cache_clear()

    def shutdown(self):
        # A test cluster holds nothing to stop gently: what has not ended 5 s after SIGTERM is
        # killed (waiting out the default 30 s cost the suite over a minute per module).
        end_processes_of(self.session, grace_s=5.0)
        if self._current is not None:
            CURRENT.write_bytes(self._current)
        else:
            CURRENT.unlink(missing_ok=True)
        ray._private.services.find_gcs_addresses.cache_clear()

    def _generate_config(self, head_resources, worker_node_types, autoscaler_v2=False, **config_kwargs):
        config = {
            "cluster_name": "relay-fake",
            "max_workers": 8,
            "provider": {
                "type": "fake_multinode",
                "use_node_id_as_ip": True,
                "disable_node_updaters": True,
                "disable_launch_config_check": True,
            },
            "available_node_types": {
                **worker_node_types,
                "ray.head.default": {"resources": head_resources, "node_config": {}, "max_workers": 0},
            },
            "head_node_type": "ray.head.default",
            "auth": {},
            "upscaling_speed": 1.0,
            "idle_timeout_minutes": 0.1,
            "docker": {},
            "initialization_commands": [],
            "setup_commands": [],
            "head_setup_commands": [],
            "worker_setup_commands": [],
            "head_start_ray_commands": [],
            "worker_start_ray_commands": [],
            "file_mounts": {},
            "cluster_synced_files": [],
            "file_mounts_sync_continuously": False,
            "rsync_exclude": [],
            "rsync_filter": [],
        }
        config.update(config_kwargs)
        return config


def _alive_nodes() -> list[dict]:
    return [n for n in ray.nodes() if n["Alive"]]


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}: {_alive_nodes()}"
        time.sleep(1)


@pytest.fixture
def fake_cluster(monkeypatch):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    cluster = FakeNodesCluster(
        head_resources={"CPU": 0}, worker_node_types=_scaled_down_node_types(), idle_timeout_minutes=0.1
    )
    cluster.start()
    try:
        ray.init("auto")
        yield
        ray.shutdown()
    finally:
        cluster.shutdown()


def test_device_auto_on_an_autoscaling_cluster_without_accelerators_is_refused(
    fake_cluster, tmp_path, capsys
):
    """The learner node type is not up yet: auto would pick the CPU; one line says what to set.
    (First in the module: no earlier test has started a learner node on this machine.)"""
    from relay_rl.services.cli import main
    from relay_rl.services.driver.cluster import autoscaling

    assert ray.cluster_resources().get("NPU", 0) == 0, ray.cluster_resources()
    assert autoscaling(), "the fake cluster's autoscaler should be recognised"

    code = main(
        [
            "train",
            "configs/cartpole_ppo.yaml",
            "--run-dir",
            str(tmp_path / "run"),
            "--set",
            "learner.device=auto",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "autoscaling cluster has no GPU or NPU now" in err[0] and "learner.device=npu" in err[0]
    assert not (tmp_path / "run").exists()


def test_autoscaler_adds_rollout_nodes_places_the_learner_and_scales_down(fake_cluster, tmp_path):
    assert len(_alive_nodes()) == 1  # the head alone, with no CPU for workers
    cfg = load_config(
        "configs/cartpole_ppo.yaml",
        [
            "rollout.num_workers=3",
            "learner.buffer_size=768",
            "learner.device=cpu",
            "learner.ray_resources={NPU: 1}",
            "stop.env_steps=6000",
            "stop.episode_return_mean=null",
            "metrics.progress=none",
        ],
    )
    backend = RayBackend(cfg, check_env(cfg))  # returns once the learner is placed (the NPU node came up)
    try:
        ray.get([w.env_spec.remote() for w in backend.workers], timeout=180)  # rollout nodes came up
        nodes = _alive_nodes()
        rollout_nodes = [n for n in nodes if n["Resources"].get("CPU") == 2]
        npu_nodes = [n for n in nodes if n["Resources"].get("NPU")]
        assert len(rollout_nodes) == 2  # 3 one-CPU workers need two 2-CPU nodes
        assert len(npu_nodes) == 1
        assert ray.get(backend.learners.lead.describe.remote())["node_id"] == npu_nodes[0]["NodeID"]
        loop = TrainingLoop(cfg, RunDir.claim(tmp_path / "run", cfg), backend)
        assert loop.run_until_stop() == "env_steps"
    finally:
        backend.close()
    _wait_for(lambda: len(_alive_nodes()) == 1, 120, "idle nodes to be removed")


def test_the_elastic_fleet_grows_onto_new_nodes_and_they_leave_after(fake_cluster, tmp_path):
    """rollout.autoscale on Ray's autoscaler: a starving learner (a slow env) grows the fleet from
    1 to 4 one-CPU workers, relay asks the autoscaler for their CPUs, and a second 2-CPU rollout
    node comes up; when the run ends its demand goes, and the idle nodes are removed."""
    cfg = load_config(
        "configs/cartpole_ppo.yaml",
        [
            "env.id=tests.rollout_workers.slow_envs:make",
            "env.kwargs={delay: 0.004}",
            "env.num_envs=4",
            "rollout.rollout_len=16",
            "rollout.mode=async",
            "rollout.autoscale=true",
            "rollout.num_workers=1",
            "rollout.max_workers=4",
            "learner.buffer_size=256",
            "learner.batch_size=64",
            "learner.epochs=1",
            "learner.device=cpu",
            "learner.ray_resources={NPU: 1}",
            "stop.env_steps=100000000",
            "stop.wall_s=120",
            "stop.episode_return_mean=null",
            "metrics.progress=none",
            "metrics.tensorboard=false",
        ],
    )
    backend = RayBackend(cfg, check_env(cfg))
    try:
        assert len([n for n in _alive_nodes() if n["Resources"].get("CPU") == 2]) == 1
        loop = TrainingLoop(cfg, RunDir.claim(tmp_path / "run", cfg), backend)
        watcher = _NodeWatcher(loop)
        loop.run_until_stop()
        watcher.stop()
        workers = [json.loads(x)["num_workers"] for x in loop.run.metrics_path.read_text().splitlines()]
        assert workers[0] == 1 and max(workers) == 4
        assert watcher.most_rollout_nodes == 2  # four one-CPU workers need two 2-CPU nodes
    finally:
        backend.close()
    _wait_for(lambda: len(_alive_nodes()) == 1, 180, "idle nodes to be removed")


class _NodeWatcher:
    """Counts the rollout nodes alive, every second, on a thread; once the fleet has reached 4
    workers on 2 rollout nodes, ends the run within 10 s (stop.wall_s brought forward): what the
    test waits for has happened, and its 120 s budget stays for a slow machine."""

    def __init__(self, loop: TrainingLoop) -> None:
        import threading

        self.loop = loop
        self.most_rollout_nodes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            count = len([n for n in _alive_nodes() if n["Resources"].get("CPU") == 2])
            self.most_rollout_nodes = max(self.most_rollout_nodes, count)
            path = self.loop.run.metrics_path
            # The last line may be half written: complete lines only.
            lines = path.read_text().splitlines()[:-1] if path.exists() else []
            grown = any(json.loads(x)["num_workers"] == 4 for x in lines)
            if grown and self.most_rollout_nodes == 2 and self.loop.cfg.stop.wall_s == 120:
                stop = self.loop.cfg.stop.model_copy(update={"wall_s": self.loop.c.wall_s + 10})
                self.loop.cfg = self.loop.cfg.model_copy(update={"stop": stop})

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
