"""Sampling real envs with structured spaces: Taxi (Discrete observations, info masks), MiniGrid
(a Dict of image, direction and text), Blackjack (a Tuple of Discretes), and the envs of
`structured_envs.py` (a Dict with an obs mask and MultiDiscrete actions from start 1 and -1,
MultiBinary, a 2-D Box action, Discrete(3, start=1)). Every segment field is checked against
the layout, and every action the envs received against their spaces and masks."""

import re

import numpy as np
import pytest

from relay_rl.contracts.segment import SegmentLayout
from relay_rl.contracts.spaces import ActionSpec, SpecError
from relay_rl.learner.algorithms import algorithm_traits
from relay_rl.learner.buffer import SegmentRingBuffer
from relay_rl.rollout_workers.envs import EnvSpecError, probe_env_spec
from relay_rl.rollout_workers.sampler import make_sampler
from tests.helpers import local_config
from tests.rollout_workers import structured_envs

ENVS = "tests.rollout_workers.structured_envs"


def _cfg(env_id, *overrides, T=32, N=4):
    return local_config(env_id, *overrides, T=T, N=N)


def _sample(cfg, segments=1):
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    segs = [sampler.sample() for _ in range(segments)]
    layout = SegmentLayout(cfg.rollout.rollout_len, cfg.env.num_envs, sampler.spec)
    for seg in segs:
        layout.validate(seg)  # every field in its shape and dtype
        SegmentRingBuffer(layout, 2).add(seg)
    return sampler, segs


def test_taxi_one_hot_observations_and_its_info_masks():
    sampler, segs = _sample(_cfg("Taxi-v4", T=64), segments=2)
    spec = sampler.spec
    assert spec.action_mask == "info:action_mask"
    assert [(leaf.path, leaf.kind, leaf.nvec) for leaf in spec.leaves] == [("", "discrete", (500,))]
    for seg in segs:
        assert seg["obs"].dtype == np.int64 and seg["obs"].shape == (64, 4)
        assert seg["obs"].min() >= 0 and seg["obs"].max() < 500
        mask = seg["action_mask"]
        assert mask.shape == (64, 4, 6) and mask.dtype == np.bool_
        assert not mask.all(), "Taxi forbids moves into walls"
        chosen = np.take_along_axis(mask, seg["actions"][..., None], axis=-1)
        assert chosen.all(), "a masked action was sampled"
    assert sum(seg.env_faults.get("raised", 0) for seg in segs) == 0


def test_without_masks_taxi_segments_have_no_mask_field():
    sampler, (seg,) = _sample(_cfg("Taxi-v4", "env.action_mask=none"))
    assert sampler.spec.action_mask is None and "action_mask" not in seg.arrays


def test_minigrid_dict_leaves_keep_their_dtypes_and_skip_the_mission():
    notes = []
    spec = probe_env_spec(_cfg("MiniGrid-DoorKey-5x5-v0").env, notes)
    assert [leaf.path for leaf in spec.leaves] == ["direction", "image"]
    assert notes and "mission" in notes[0]
    _, (seg,) = _sample(_cfg("MiniGrid-DoorKey-5x5-v0"))
    assert seg["obs/image"].dtype == np.uint8 and seg["obs/image"].shape == (32, 4, 7, 7, 3)
    assert seg["obs/direction"].dtype == np.int64 and seg["obs/direction"].max() < 4
    assert set(seg["obs"]) == {"image", "direction"}  # the tree view


def test_obs_keys_choose_dict_keys():
    spec = probe_env_spec(_cfg("MiniGrid-DoorKey-5x5-v0", "env.obs_keys=[image]").env)
    assert [leaf.path for leaf in spec.leaves] == ["image"]
    with pytest.raises(EnvSpecError, match="no key 'nope'"):
        probe_env_spec(_cfg("MiniGrid-DoorKey-5x5-v0", "env.obs_keys=[nope]").env)


def test_blackjack_tuple_of_discretes():
    sampler, (seg,) = _sample(_cfg("Blackjack-v1"))
    assert [leaf.path for leaf in sampler.spec.leaves] == ["0", "1", "2"]
    assert set(seg["obs"]) == {"0", "1", "2"} and seg["obs/1"].max() < 11


def test_dict_obs_mask_and_multi_discrete_actions_from_their_start():
    before = structured_envs.REFUSED["pick"]
    sampler, segs = _sample(_cfg(f"{ENVS}:PickEnv"), segments=3)
    spec = sampler.spec
    assert spec.action_mask == "obs:action_mask"
    assert "action_mask" not in [leaf.path for leaf in spec.leaves]
    assert (
        spec.action.kind == "multi_discrete" and spec.action.nvec == (3, 4) and spec.action.start == (1, -1)
    )
    for seg in segs:
        assert seg["actions"].shape == (32, 4, 2) and seg["actions"].min() >= 0  # from 0 in segments
        assert (seg["actions"][..., 0] < 3).all() and (seg["actions"][..., 1] < 4).all()
        assert seg["obs/step"].min() >= 0 and seg["obs/step"].max() < 8  # stored from 0
        assert seg.env_faults.get("raised", 0) == 0
    assert structured_envs.REFUSED["pick"] == before


def test_bits_matrix_and_start_actions_reach_their_envs_in_range():
    for name in ("BitsEnv", "MatrixEnv", "StartEnv"):
        key = {"BitsEnv": "bits", "MatrixEnv": "matrix", "StartEnv": "start"}[name]
        before = structured_envs.REFUSED[key]
        sampler, (seg,) = _sample(_cfg(f"{ENVS}:{name}"))
        assert seg.env_faults.get("raised", 0) == 0 and structured_envs.REFUSED[key] == before, name
    sampler, (seg,) = _sample(_cfg(f"{ENVS}:MatrixEnv"))
    assert sampler.spec.action.env_shape == (2, 2) and seg["actions"].shape == (32, 4, 4)


def test_env_actions_keeps_some_choices_and_the_env_gets_its_own():
    """env.actions=[3, 1] of Discrete(3, start=1): the policy picks between two (stored 0 and 1 in
    segments, as its log-probs are), and the env receives 3 and 1, never 2."""
    structured_envs.STARTED.clear()
    before = structured_envs.REFUSED["start"]
    sampler, segs = _sample(_cfg(f"{ENVS}:StartEnv", "env.actions=[3, 1]"), segments=2)
    action = sampler.spec.action
    assert (action.kind, action.size, action.choices) == ("discrete", 2, (3, 1))
    assert action.describe() == "Discrete(2) of the env's [3, 1]"
    for seg in segs:
        assert set(np.unique(seg["actions"])) == {0, 1} and seg.env_faults.get("raised", 0) == 0
    assert set(structured_envs.STARTED) == {1, 3} and structured_envs.REFUSED["start"] == before
    assert sum(structured_envs.STARTED.values()) == 2 * 32 * 4


def test_kept_choices_travel_with_the_spec_and_bad_ones_are_refused():
    """A checkpoint's action spec is data: its choices come back as written, and a spec whose
    choices could not be the env's (another kind, a repeat, a count apart from its size, with a
    start) is refused on load."""
    kept = ActionSpec("discrete", 2, choices=(3, 1))
    assert ActionSpec.from_dict(kept.to_dict()) == kept
    assert "choices" not in ActionSpec("discrete", 2).to_dict()  # earlier checkpoints read as they were
    np.testing.assert_array_equal(kept.to_env(np.array([0, 1, 1, 0])), [3, 1, 1, 3])
    for bad in (
        {"kind": "multi_discrete", "size": 3, "nvec": [3], "choices": [0, 1, 2]},
        {"kind": "discrete", "size": 2, "choices": [1, 1]},
        {"kind": "discrete", "size": 2, "choices": [1, 2, 3]},
        {"kind": "discrete", "size": 2, "start": [1], "choices": [1, 2]},
        {"kind": "discrete", "size": 1, "choices": ["1"]},
    ):
        with pytest.raises(SpecError):
            ActionSpec.from_dict(bad)


@pytest.mark.parametrize(
    "env_id, setting, message",
    [
        ("Pendulum-v1", "env.actions=[0]", "keeps choices of a Discrete action space, not Box of 1 floats"),
        (f"{ENVS}:StartEnv", "env.actions=[0, 1]", "0 is not one of the env's choices 1..3"),
        (f"{ENVS}:StartEnv", "env.actions=[2, 2]", "names a choice twice"),
        ("Taxi-v4", "env.actions=[0, 1, 2, 3]", "the env's action masks (info:action_mask) flag all"),
        (f"{ENVS}:PickEnv", "env.actions=[1]", "not MultiDiscrete([3, 4])"),
    ],
)
def test_env_actions_that_cannot_be_kept_are_one_line(env_id, setting, message):
    with pytest.raises(EnvSpecError, match=re.escape(message)):
        probe_env_spec(_cfg(env_id, setting).env)


@pytest.mark.parametrize(
    "setting, message",
    [
        ("env.action_mask=obs:nope", "no key 'nope'"),
        ("env.action_mask=info:nope", "reset info has no 'nope'"),
    ],
)
def test_mask_sources_that_do_not_exist_are_one_line(setting, message):
    with pytest.raises(EnvSpecError, match=message):
        probe_env_spec(_cfg("Taxi-v4", setting).env)


def test_masks_on_box_actions_are_refused():
    with pytest.raises(EnvSpecError, match="masks apply to Discrete and MultiDiscrete"):
        probe_env_spec(_cfg("Pendulum-v1", "env.action_mask=info:action_mask").env)
