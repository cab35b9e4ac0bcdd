"""Policy groups (multi_agent.policies) on a real env of two kinds of agents: mpe2's simple_tag,
3 predators (adversary_*: 16 observed numbers) and 1 prey (agent_0: 14). Each group has its own
spaces, sampler, segment and learner; they share every step of one env."""

import numpy as np
import pytest

from relay_rl.contracts.config import ConfigError, build_config
from relay_rl.contracts.policy_groups import PolicyGroupError, group_config, group_versions, joined, part_of
from relay_rl.contracts.segment import FIELD_NAMES, SegmentLayout
from relay_rl.contracts.spaces import EnvSpec, SpecError
from relay_rl.learner.algorithms import algorithm_traits
from relay_rl.learner.policy_groups import PolicyGroupsLearner, groups_state_problem
from relay_rl.policy.models import build_policy
from relay_rl.rollout_workers.envs import EnvSpecError, probe_env_spec
from relay_rl.rollout_workers.sampler import make_sampler
from tests.helpers import local_config, sampled_twice

pytest.importorskip("pettingzoo")

TAG = "pettingzoo:mpe2.simple_tag_v3"
KWARGS = "env.kwargs={num_good: 1, num_adversaries: 3, num_obstacles: 2, max_cycles: 25}"
GROUPS = "multi_agent.policies={predator: [adversary_*], prey: [agent_*]}"
PREDATORS = ("adversary_0", "adversary_1", "adversary_2")


def _cfg(*overrides, T=40, N=8, env_id=TAG, kwargs=KWARGS):
    return local_config(env_id, kwargs, GROUPS, *overrides, T=T, N=N)


def _spec(cfg):
    return probe_env_spec(cfg.env, None, cfg.multi_agent)


def test_the_spec_holds_each_groups_agents_and_spaces():
    spec = _spec(_cfg())
    assert spec.policy_names == ("predator", "prey")
    assert spec.agents == (*PREDATORS, "agent_0") and spec.columns == 4
    predator, prey = spec.policy("predator"), spec.policy("prey")
    assert predator.agents == PREDATORS and predator.obs_shape == (16,) and predator.columns == 3
    assert prey.agents == ("agent_0",) and prey.obs_shape == (14,) and prey.columns == 1
    assert EnvSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(KeyError, match="groups: predator, prey"):
        spec.policy("wolf")
    assert predator.policy(None) is predator  # a group's own spec is an ungrouped one


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda d: d["groups"].pop(), "every agent of the env exactly once"),
        (lambda d: d["groups"][0].update(name="no/slash"), "group name"),
        (lambda d: d["groups"][1].update(name="predator"), "exactly once|repeat a name"),
        (lambda d: d["groups"][0]["spec"].update(groups=[]), "not a group's"),
        (lambda d: d.update(groups="predator"), "a list"),
    ],
)
def test_a_spec_file_with_malformed_groups_is_refused(change, words):
    data = _spec(_cfg()).to_dict()
    change(data)
    with pytest.raises(SpecError, match=words):
        EnvSpec.from_dict(data)


@pytest.mark.parametrize(
    "groups, words",
    [
        ("{predator: [adversary_*]}", "agent_0 matches no group"),
        ("{everyone: ['*']}", "different spaces .* split policy group everyone"),
        ("{everyone: ['*'], prey: [agent_*]}", "prey=.* matches no agent the earlier groups left"),
    ],
)
def test_every_agent_plays_for_one_group_of_one_kind(groups, words):
    cfg = local_config(TAG, KWARGS, f"multi_agent.policies={groups}", T=8, N=8)
    with pytest.raises(EnvSpecError, match=words):
        _spec(cfg)


ROLES = "tests.rollout_workers.pettingzoo_factories:tag_roles"
NAMED_GROUPS = "multi_agent.policies={predator: [], prey: []}"


def test_a_mapping_in_code_chooses_the_same_groups_as_patterns():
    by_code = local_config(TAG, KWARGS, NAMED_GROUPS, f"multi_agent.policy_mapping={ROLES}", T=8, N=8)
    assert _spec(by_code) == _spec(_cfg(T=8, N=8))


@pytest.mark.parametrize(
    "mapping, words",
    [
        ("tag_roles_raising", "policy_mapping raised for agent adversary_0: KeyError"),
        ("tag_roles_unknown", "gave agent adversary_0 'wolf', not a group of .*predator, prey"),
        ("nothing_here", "has no callable 'nothing_here'"),
    ],
)
def test_a_mapping_that_fails_is_one_line(mapping, words):
    fn = f"multi_agent.policy_mapping=tests.rollout_workers.pettingzoo_factories:{mapping}"
    with pytest.raises(EnvSpecError, match=words) as err:
        _spec(local_config(TAG, KWARGS, NAMED_GROUPS, fn, T=8, N=8))
    assert "\n" not in str(err.value)
    missing = local_config(TAG, KWARGS, NAMED_GROUPS, "multi_agent.policy_mapping=no_such_mod:f", T=8, N=8)
    with pytest.raises(EnvSpecError, match="cannot import module 'no_such_mod'"):
        _spec(missing)


@pytest.mark.parametrize(
    "setting, words",
    [
        ("multi_agent.policies={'a/b': [x]}", "not a group name"),
        ("multi_agent.policies={}", "1 to 16 groups"),
        ("multi_agent.policies={a: []}", "no agent patterns: name some, or choose groups in code"),
        (f"multi_agent.policy_mapping={ROLES}", "give multi_agent.policies.predator no patterns"),
        ("multi_agent.policy_mapping='os.path:join; rm'", "policy_mapping"),
        ("multi_agent.agents=[adversary_*]", "both choose agents"),
        ("learner.num_learners=2", "one learner actor"),
    ],
)
def test_a_config_of_groups_is_checked_up_front(setting, words):
    sets = [f"env.id={TAG}", GROUPS, setting] if "policies" not in setting else [f"env.id={TAG}", setting]
    with pytest.raises(ConfigError, match=words):
        build_config({"rollout": {"num_workers": 2}, "stop": {"env_steps": 10}}, sets)
    with pytest.raises(ConfigError, match=r"needs the groups it names in multi_agent\.policies"):
        build_config({"stop": {"env_steps": 10}}, [f"env.id={TAG}", f"multi_agent.policy_mapping={ROLES}"])


def test_each_group_gets_its_columns_and_the_same_rounds():
    sets = [f"env.id={TAG}", KWARGS, GROUPS, "env.num_envs=32", "rollout.rollout_len=50"]
    sets += ["rollout.num_workers=2", "learner.buffer_size=3200", "learner.batch_size=800"]
    cfg = build_config({}, sets)
    spec = _spec(cfg)
    predator, prey = group_config(cfg, spec, "predator"), group_config(cfg, spec, "prey")
    # 8 copies: 24 predator columns, 8 prey columns; 2 segments in the buffer; 4 minibatches
    assert (predator.env.num_envs, prey.env.num_envs) == (24, 8)
    assert predator.buffer_segments == prey.buffer_segments == cfg.buffer_segments == 2
    assert predator.learner.batch_size == 2 * 50 * 24 // 4 and prey.learner.batch_size == 2 * 50 * 8 // 4
    assert predator.multi_agent.policies is None and predator.multi_agent.policy_mapping is None
    small = local_config(TAG, KWARGS, GROUPS, "learner.batch_size=2", T=2, N=4)  # 4 minibatches of 8
    with pytest.raises(PolicyGroupError, match=r"policy group predator: its 6 steps .* 4 minibatches"):
        group_config(small, _spec(small), "predator")


def test_groups_sample_their_own_segments_from_one_env():
    cfg = _cfg()
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    assert sampler.spec == _spec(cfg)
    segs = sampler.sample()
    assert list(segs) == ["predator", "prey"]
    for name, columns, width in (("predator", 6, 16), ("prey", 2, 14)):
        seg = segs[name]
        SegmentLayout(40, columns, sampler.spec.policy(name)).validate(seg)
        assert seg["obs"].shape == (40, columns, width)
        assert seg.env_steps == 40 * columns  # nobody leaves simple_tag early
        # every copy finished an episode (max_cycles=25) in the segment: one return per column
        assert len(seg.episode_returns) == columns
    # the env's episode statistics come once, with the first group's segment
    assert len(segs["predator"].episode_stats["team_return_mean"]) == 2
    assert not segs["prey"].episode_stats
    # a collision pays every predator +10 and costs the prey -10 (plus its boundary penalty)
    hits = segs["predator"]["rewards"].reshape(40, 2, 3)[:, :, 0]
    assert ((segs["prey"]["rewards"] <= -hits + 1e-6) | (hits == 0)).all()
    sampler.close()


def test_groups_explore_apart_and_load_only_new_weights():
    cfg = _cfg()
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    noise = [s.noise.initial_seed() for s in sampler.samplers.values()]
    assert noise[0] != noise[1]
    learner = PolicyGroupsLearner(cfg, sampler.spec)
    weights = learner.weights()
    assert group_versions(weights) == {"predator": 0, "prey": 0}
    sampler.set_weights(learner.version, weights)
    learner.learners["prey"].version = 3  # as if only the prey had updated
    moved = learner.weights()
    sampler.samplers["predator"].fast.load = lambda w: pytest.fail("the predator's weights did not change")
    sampler.set_weights(learner.version, moved)
    assert sampler.version == 3 and sampler.samplers["prey"].version == 3
    sampler.close()


def test_a_grouped_sync_run_reproduces():
    for a, b in zip(*sampled_twice(_cfg(T=30)), strict=True):
        for name in ("predator", "prey"):
            for field in FIELD_NAMES:
                if field in a[name].arrays:
                    np.testing.assert_array_equal(a[name][field], b[name][field], err_msg=f"{name} {field}")


FAULTY = "tests.rollout_workers.pettingzoo_factories:faulty_tag"


def test_a_non_finite_observation_cuts_that_copy_in_every_group():
    cfg = _cfg(env_id=FAULTY, kwargs="env.kwargs={fault: nan, at: 5, max_cycles: 25}", T=12, N=8)
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    segs = sampler.sample()
    pred, prey = segs["predator"], segs["prey"]
    # both copies hit the fault at their 5th step (index 4): every column of both, in both groups
    assert (pred["mask"][4] == 0).all() and (prey["mask"][4] == 0).all()
    assert (pred["truncated"][3] == 1).all() and (prey["truncated"][3] == 1).all()
    assert (pred["mask"][5:] == 1).all() and (prey["mask"][5:] == 1).all()  # reset, going on
    assert np.isfinite(prey["obs"]).all()
    assert pred.env_faults["nonfinite_obs"] == 2 and prey.env_faults["nonfinite_obs"] == 0  # counted once
    sampler.close()


def test_a_raising_env_is_rebuilt_once_for_every_group():
    cfg = _cfg(env_id=FAULTY, kwargs="env.kwargs={fault: raise, at: 3, max_cycles: 25}", T=10, N=4)
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    joint = sampler.joint.env
    segs = sampler.sample()
    assert sampler.joint.env is not joint  # rebuilt
    for seg in segs.values():
        # the 3rd step raised; the rebuilt env (a fresh instance) raises at its own 3rd step again
        assert (seg["mask"][[2, 5, 8]] == 0).all() and (seg["truncated"][[1, 4, 7]] == 1).all()
        assert (seg["mask"][[3, 4, 6, 7, 9]] == 1).all()
    assert segs["predator"].env_faults["raised"] == 3 and segs["prey"].env_faults["raised"] == 0
    sampler.close()


# ---- the learner ---------------------------------------------------------------------------------
def _learner_and_sampler(**kw):
    cfg = _cfg(**kw)
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    return PolicyGroupsLearner(cfg, sampler.spec), sampler


def test_each_group_trains_its_own_policy():
    learner, sampler = _learner_and_sampler()
    before = {k: v.clone() for k, v in learner.weights().items()}
    out = learner.train_round([sampler.sample()])
    line = out.metrics
    assert line is not None and out.env_steps == 40 * 8
    assert line["weights_version"] == 2 == learner.version
    assert line["policy/predator/weights_version"] == line["policy/prey/weights_version"] == 1
    assert line["parameters"] == line["policy/predator/parameters"] + line["policy/prey/parameters"]
    means = (line["policy/predator/entropy"] + line["policy/prey/entropy"]) / 2
    assert line["entropy"] == pytest.approx(means)
    assert set(out.episode_stats) >= {"policy_return_mean/predator", "policy_return_mean/prey"}
    assert len(out.episode_stats["policy_return_mean/predator"]) == 6
    after = learner.weights()
    for name in ("predator", "prey"):
        moved = [
            k for k, v in part_of(after, name).items() if not np.array_equal(v, part_of(before, name)[k])
        ]
        assert any("pi" in k for k in moved), name
    assert learner.learners["prey"].buffer.layout.num_envs == 2
    sampler.close()


def test_a_segment_one_group_rejects_is_rejected_for_all():
    learner, sampler = _learner_and_sampler()
    bad = sampler.sample()
    bad["prey"]["rewards"][0, 0] = np.nan
    out = learner.train_round([bad])
    assert out.rejected_segments == 1 and "policy group prey" in out.reject_reason
    assert out.metrics is None and out.env_steps == 0
    assert all(lrn.buffer.size == 0 for lrn in learner.learners.values())
    out = learner.train_round([{"predator": sampler.sample()["predator"]}])
    assert out.rejected_segments == 1 and "one segment for each policy group" in out.reject_reason
    sampler.close()


def test_a_grouped_learner_state_round_trips_and_is_checked():
    learner, sampler = _learner_and_sampler()
    learner.train_round([sampler.sample()])
    state = learner.state_dict()
    assert sorted(state["groups"]) == ["predator", "prey"] and "model" not in state["groups"]["prey"]
    fresh = PolicyGroupsLearner(learner.cfg, learner.env)
    fresh.load_state_dict(state)
    assert fresh.version == learner.version == 2
    for k, v in learner.weights().items():
        np.testing.assert_array_equal(fresh.weights()[k], v)
    models = {n: build_policy(lrn.cfg, lrn.env, critic=True) for n, lrn in learner.learners.items()}
    assert groups_state_problem(models, state) is None
    swapped = {**state, "model": joined({"predator": part_of(state["model"], "prey"), "prey": {}})}
    assert "policy group predator: weights do not fit" in groups_state_problem(models, swapped)
    assert "are not predator, prey" in groups_state_problem(models, {**state, "groups": {}})
    sampler.close()


def test_a_groups_scene_plays_the_other_groups_with_their_own_policies(tmp_path):
    """`relay eval --policy prey`'s env: the prey's columns as a plain vector env; the predators
    are moved by the act function given for them (here: always action 1), and copy 0 renders."""
    from relay_rl.rollout_workers.scenes import GroupScene
    from relay_rl.rollout_workers.vector_backends import make_vector_env

    cfg = _cfg("env.kwargs={max_cycles: 25, render_mode: rgb_array}", N=8)
    env = make_vector_env(cfg.env, ma=cfg.multi_agent)
    spec = _spec(cfg)
    seen = []

    def predators(fields):
        seen.append(fields["obs"].shape)
        return np.ones(len(fields["obs"]), dtype=np.int64), None

    scene = GroupScene(env, "prey", {"predator": (spec.policy("predator"), predators, 0)})
    obs, _ = scene.reset(seed=[7, 0])
    assert obs.shape == (2, 14) and scene.num_envs == 2
    before = [copy.unwrapped.world.agents[0].state.p_pos.copy() for copy in env.envs]
    for _ in range(2):  # MPE moves a body by the velocity of the step before
        obs, reward, _, _, info = scene.step(np.zeros(2, dtype=np.int64))
    assert obs.shape == (2, 14) and reward.shape == (2,) and info["relay_active"].all()
    assert seen == [(6, 16)] * 2  # the 3 predators of both copies, in their own observation space
    moved = [copy.unwrapped.world.agents[0].state.p_pos - b for copy, b in zip(env.envs, before, strict=True)]
    assert all(m[0] < 0 and m[1] == 0 for m in moved)  # action 1 pushes a predator along -x
    frame = scene.envs[0].render()
    assert frame.ndim == 3 and frame.shape[2] == 3
    scene.close()
