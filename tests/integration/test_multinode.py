"""Several raylets on one machine (`ray.cluster_utils.Cluster`), each with its own object store:
rollout workers spread over two nodes, the learner on a node of its own, so every segment and
every weights version crosses object stores as on a real cluster."""

import json

import pytest
import ray
from ray.cluster_utils import Cluster

from relay_rl.contracts.config import load_config
from tests.helpers import ray_loop

pytestmark = pytest.mark.ray
STORE = 150 * 1024 * 1024  # bytes of object store per node: small, there are four


@pytest.fixture
def three_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": STORE})
    learner_node = cluster.add_node(num_cpus=1, resources={"learner": 1}, object_store_memory=STORE)
    rollout_nodes = [cluster.add_node(num_cpus=2, object_store_memory=STORE) for _ in range(2)]
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    yield learner_node, rollout_nodes
    ray.shutdown()
    cluster.shutdown()


def test_segments_and_weights_cross_object_stores(three_nodes, tmp_path):
    learner_node, rollout_nodes = three_nodes
    cfg = load_config(
        "configs/cartpole_ppo.yaml",
        [
            "rollout.num_workers=4",
            "learner.buffer_size=1024",
            "learner.device=cpu",
            "learner.ray_resources={learner: 1}",
            "stop.env_steps=20000",
            "stop.episode_return_mean=null",
            "metrics.progress=none",
            "metrics.tensorboard=false",
        ],
    )
    loop, backend = ray_loop(cfg, tmp_path / "run")
    try:
        learner_at = ray.get(backend.learners.lead.describe.remote())["node_id"]
        workers_at = ray.get([w.node_id.remote() for w in backend.workers])
        assert learner_at == learner_node.node_id
        assert set(workers_at) == {n.node_id for n in rollout_nodes}  # spread over both, two each
        assert loop.run_until_stop() == "env_steps"
        lines = [json.loads(x) for x in loop.run.metrics_path.read_text().splitlines()]
        assert lines[-1]["env_steps"] >= 20000 and lines[-1]["lost_segments"] == 0
        assert lines[-1]["weights_version"] == len(lines)  # every version reached the workers
        assert lines[-1]["episode_return_mean"] > 2 * lines[0]["episode_return_mean"]
    finally:
        backend.close()


def test_a_learner_group_of_two_ranks_spreads_over_two_nodes_and_joins():
    """Two learner nodes of one CPU each: the group's placement group cannot pack both ranks on
    one, so each node gets a rank; they join one process group across the nodes, ordered by node."""
    from relay_rl.services.driver.learner_group import LearnerGroup, env_ranks
    from relay_rl.services.driver.preflight import check_env

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": STORE})
    nodes = [cluster.add_node(num_cpus=1, object_store_memory=STORE) for _ in range(2)]
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    try:
        cfg = load_config(
            "configs/cartpole_ppo.yaml",
            ["learner.num_learners=2", "learner.device=cpu", "rollout.num_workers=2", "learner.num_cpus=1"],
        )
        group = LearnerGroup(cfg, env_ranks(cfg, check_env(cfg)))
        try:
            assert set(group.nodes) == {n.node_id for n in nodes} and group.nodes == sorted(group.nodes)
            assert group.answer(group.each(lambda r: r.world.remote())) == [2, 2]
            assert group.answer(group.each(lambda r: r.node.remote())) == group.nodes
        finally:
            group.kill()
    finally:
        ray.shutdown()
        cluster.shutdown()
