"""What keeps a long run's memory flat, with real Ray: the calls made every round leave no task
record in Ray's GCS, a local Ray caps the records the rest leave, published weights are objects
the driver owns, and every metrics line carries the resident memory of the learner, the driver
and the largest rollout worker."""

import time

import numpy as np
import pytest
import ray

from relay_rl.contracts.config import build_config
from relay_rl.learner.actor import create_learner_actor
from relay_rl.learner.algorithms import algorithm_traits
from relay_rl.rollout_workers.worker import create_rollout_workers
from relay_rl.services.driver import cluster
from relay_rl.services.driver.preflight import check_env
from tests.helpers import train_in_process
from tests.helpers_proc import metrics_lines, wait_for

pytestmark = pytest.mark.ray
HOT = {"sample", "train_round", "publish"}


@pytest.fixture(scope="module")
def ray_with_state_api():
    """Ray's state API (list_tasks) is served by its dashboard: this cluster starts one."""
    ray.init(address="local", num_cpus=3, include_dashboard=True)
    yield
    ray.shutdown()


def test_hot_calls_leave_no_task_record_and_others_still_do(ray_with_state_api):
    from ray.util.state import list_tasks

    sets = ["rollout.num_workers=1", "learner.buffer_size=1024", "rollout.rollout_len=32"]
    cfg = build_config({}, [*sets, "learner.batch_size=64"])
    env = check_env(cfg)
    learner = create_learner_actor(cfg, env)
    (worker,) = create_rollout_workers(cfg, algorithm_traits(cfg))
    info, weights = learner.publish.remote()
    for _ in range(8):
        sample = worker.sample.remote(ray.get(info).version, [weights])
        ray.get(learner.train_round.remote([sample], 0.0)[0])
        info, weights = learner.publish.remote()
    ray.get([learner.describe.remote() for _ in range(3)])

    def recorded() -> set[str]:
        tasks = list_tasks(filters=[("type", "=", "ACTOR_TASK")], limit=10_000, raise_on_missing_output=False)
        return {t.func_or_class_name.split(".")[-1] for t in tasks}

    # Workers report task events to the GCS about once a second: Ray records what relay leaves
    # alone (describe) ...
    wait_for(lambda: "describe" in recorded(), 60, "describe's task records")
    time.sleep(2)  # one more report interval for anything else
    assert not recorded() & HOT  # ... and none of the 8 rounds' calls
    ray.kill(worker)
    ray.kill(learner)


def test_published_weights_are_objects_the_driver_owns(ray_with_state_api):
    """The weights a round publishes come back as the call's second return value, which Ray makes
    the caller's object. (An object the learner put and the driver borrowed left ~0.5 KB in the
    learner's core worker per publication: ~20 MB an hour on CartPole, docs/benchmarks.md.) The
    owner is read from Ray's core worker (a private API: no public one names an object's owner)."""
    from relay_rl.services.driver.backends import RayBackend

    sets = ["rollout.num_workers=1", "learner.buffer_size=1024", "rollout.rollout_len=32"]
    cfg = build_config({}, [*sets, "learner.batch_size=64", "rollout.mode=sync"])
    backend = RayBackend(cfg, check_env(cfg))
    core = ray._private.worker.global_worker.core_worker
    me = bytes.fromhex(ray.get_runtime_context().get_worker_id())
    try:
        assert me in core.get_owner_address(backend.weights_ref[0])  # the first publication's
        before = backend.version
        out = backend.step(0.0)
        assert out.metrics is not None and out.published is not None
        assert backend.version == out.published.version > before
        (ref,) = backend.weights_ref
        assert me in core.get_owner_address(ref)
        weights = ray.get(ref)
        assert weights and all(isinstance(v, np.ndarray) for v in weights.values())
    finally:
        backend.close()


def test_a_local_ray_caps_task_records_unless_the_user_says_otherwise(monkeypatch):
    assert cluster.local_system_config() == {"task_events_max_num_task_in_gcs": cluster.LOCAL_TASK_EVENTS}
    monkeypatch.setenv("RAY_task_events_max_num_task_in_gcs", "500")
    assert cluster.local_system_config() == {}


def test_metrics_lines_carry_host_memory_by_process(tmp_path):
    run = tmp_path / "run"
    assert train_in_process("cartpole_ppo.yaml", run, "rollout.num_workers=2", "stop.env_steps=3000") == 0
    last = metrics_lines(run)[-1]
    for key in ("learner_rss_bytes", "driver_rss_bytes", "rollout_rss_bytes"):
        assert 50 * 2**20 < last[key] < 8 * 2**30, (key, last[key])
    # the learner's live heap (torch, numpy, Ray's core worker) is megabytes, and below its resident memory
    assert 2**20 < last["learner_heap_in_use_bytes"] < last["learner_rss_bytes"], last
    assert 0 <= last["learner_heap_free_bytes"] < last["learner_rss_bytes"], last
    assert 2**20 < last["driver_heap_in_use_bytes"] < last["driver_rss_bytes"], last
