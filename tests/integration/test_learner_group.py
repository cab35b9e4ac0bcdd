"""The learner group (`services/driver/learner_group.py`) on a real local Ray cluster: two ranks
placed and joined in one gloo process group, a dead rank heard as LearnerLost while its survivor
is blocked in a collective, a restart that replaces every rank, and nothing left behind."""

import time

import pytest
import ray

from relay_rl.contracts.config import load_config
from relay_rl.services.driver.learner_group import LearnerGroup, env_ranks
from relay_rl.services.driver.loop import LearnerLost
from relay_rl.services.driver.preflight import check_env

pytestmark = pytest.mark.ray


def _gone(actor) -> bool:
    """Whether the actor is dead within 30 s (ray.kill returns before the process ends)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.2)
    return False


def test_a_group_joins_fails_as_one_and_restarts_whole(local_ray):
    cfg = load_config(
        "configs/cartpole_ppo.yaml",
        ["learner.num_learners=2", "learner.device=cpu", "rollout.num_workers=2", "learner.num_cpus=1"],
    )
    group = LearnerGroup(cfg, env_ranks(cfg, check_env(cfg)))
    try:
        assert len(group) == 2 and group.started == 1
        first = list(group.ranks)
        assert group.answer(group.each(lambda r: r.world.remote())) == [2, 2]  # joined as one
        # one placement group, a bundle per rank; ranks ordered by node
        assert group.placement is not None and group.placement.bundle_count == 2
        assert group.nodes == sorted(group.nodes) and len(group.nodes) == 2
        placement = group.placement
        ray.kill(first[1], no_restart=True)
        assert _gone(first[1])  # ray.kill returns first: a call made meanwhile may still be served
        with pytest.raises(LearnerLost):
            group.answer(group.each(lambda r: r.state_dict.remote()), timeout_s=60)
        group.restart()
        assert group.started == 2 and len(group) == 2
        assert not set(group.ranks) & set(first)
        assert _gone(first[0])  # the survivor went with its peer: its process group was dead
        assert all(isinstance(s, dict) for s in group.answer(group.each(lambda r: r.state_dict.remote())))
        assert group.demand() == [group.demand()[0]] * 2 and group.demand()[0]["CPU"] == 1.0
    finally:
        kept = list(group.ranks)
        group.kill()
    assert group.ranks == [] and all(_gone(a) for a in kept)
    assert group.placement is None
    assert ray.util.placement_group_table(placement)["state"] == "REMOVED"
