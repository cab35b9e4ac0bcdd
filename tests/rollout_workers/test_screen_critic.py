"""A centralized critic over a screen: pistonball's `state()` is the whole [560, 880, 3] screen,
read as a 64 x 64 grey image (rollout_workers/multi_agent/global_state.py) that model.kind=cnn's
value trunk reads alone through a CNN of its own. Real pistonball throughout; the reader's own
arithmetic is tied to hand-made images."""

import re

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_rl.contracts.segment import SegmentLayout
from relay_rl.contracts.spaces import EnvSpec, SpecError
from relay_rl.learner.algorithms import algorithm_traits
from relay_rl.learner.learner import Learner
from relay_rl.policy.models import build_policy
from relay_rl.rollout_workers.multi_agent import GLOBAL_KEY, MultiAgentError
from relay_rl.rollout_workers.multi_agent.global_state import (
    GLOBAL_IMAGE_SIDE,
    GlobalStateReader,
    area_weights,
)
from relay_rl.rollout_workers.sampler import make_sampler
from relay_rl.rollout_workers.vector_backends import make_vector_env
from tests.helpers import local_config

pytest.importorskip("pettingzoo")

PISTONBALL = "pettingzoo:butterfly.pistonball_v6"


def _cfg(*sets, T=8, N=20):
    return local_config(
        PISTONBALL,
        "env.preprocess=pixels",
        "env.kwargs={continuous: false, max_cycles: 40}",
        "model.kind=cnn",
        "model.normalize_obs=false",
        "model.shared_trunk=false",
        "multi_agent.central_critic=true",
        *sets,
        T=T,
        N=N,
    )


class _Stated:
    """What the reader looks at: a state space and a state()."""

    def __init__(self, space, state=None):
        self.state_space, self._state = space, state

    def state(self):
        return self._state


def test_area_weights_average_whole_blocks_exactly():
    """128 -> 64 is 2 x 2 blocks: each output pixel the mean of its block."""
    rng = np.random.default_rng(0)
    screen = rng.integers(0, 256, size=(128, 128, 3), dtype=np.uint8)
    reader = GlobalStateReader(_Stated(gym.spaces.Box(0, 255, (128, 128, 3), np.uint8)))
    got = reader(screen).reshape(64, 64)
    grey = screen.astype(np.float64).mean(axis=2)
    want = grey.reshape(64, 2, 64, 2).mean(axis=(1, 3))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # channels first reads the same image
    first = GlobalStateReader(_Stated(gym.spaces.Box(0, 255, (3, 128, 128), np.uint8)))
    np.testing.assert_allclose(
        first(np.ascontiguousarray(screen.transpose(2, 0, 1))), got.reshape(-1), rtol=1e-6
    )


@settings(max_examples=40, deadline=None)
@given(size=st.integers(64, 1000), side=st.integers(1, 64))
def test_area_weights_keep_the_mean_of_any_size(size, side):
    """Each output pixel covers size / side input pixels (fractions weighted): rows sum to 1 and
    a row of pixels keeps its mean."""
    w = area_weights(size, side).astype(np.float64)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-5)
    row = np.random.default_rng(size).random(size)
    np.testing.assert_allclose((w @ row).mean(), row.mean(), rtol=1e-4)
    assert (w >= 0).all()


def test_states_neither_flat_nor_a_screen_are_one_line():
    for space, words in [
        (gym.spaces.Box(0, 1, (5000,)), "holds 5000 numbers"),
        (gym.spaces.Box(0, 255, (2, 100, 100, 3), np.uint8), "an image [H, W, C]"),
        (gym.spaces.Box(0, 255, (40, 200, 3), np.uint8), "at least 64 pixels a side"),
    ]:
        with pytest.raises(MultiAgentError, match=re.escape(words)) as err:
            GlobalStateReader(_Stated(space))
        assert "\n" not in str(err.value)
    with pytest.raises(MultiAgentError, match="no state_space Box"):
        GlobalStateReader(_Stated(gym.spaces.Discrete(3)))


def test_each_column_reads_its_copys_screen_and_it_moves():
    """Every piston of a copy reads that copy's screen, grey 64 x 64, as the env draws it."""
    cfg = _cfg(N=40)
    envs = make_vector_env(cfg.env, ma=cfg.multi_agent)
    assert (envs.global_state, envs.global_image) == (GLOBAL_IMAGE_SIDE**2, GLOBAL_IMAGE_SIDE)
    _, info = envs.reset(seed=[3] * 40)
    first = info[GLOBAL_KEY].copy()
    reader = GlobalStateReader(envs.envs[0])
    rng = np.random.default_rng(0)
    for _ in range(10):
        _, _, _, _, info = envs.step(rng.integers(0, 3, size=40))
    state = info[GLOBAL_KEY]
    assert state.shape == (40, GLOBAL_IMAGE_SIDE**2) and state.dtype == np.float32
    for e in range(2):
        np.testing.assert_array_equal(state[20 * e : 20 * e + 20], np.repeat(state[20 * e][None], 20, axis=0))
        np.testing.assert_allclose(state[20 * e], reader(envs.envs[e].state()), rtol=1e-6)
    assert np.abs(state - first).max() > 10  # pistons and ball moved on the screen
    assert state.min() >= 0 and state.max() <= 255 + 1e-3  # grey levels (float32 weights round)
    envs.close()


def test_a_spec_carries_the_image_side_and_a_file_cannot_lie_about_it():
    cfg = _cfg()
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    spec = sampler.spec
    sampler.close()
    assert (spec.global_state, spec.global_image) == (4096, 64)
    assert EnvSpec.from_dict(spec.to_dict()) == spec
    for bad in (63, -64, True, "64", 64.0):
        with pytest.raises(SpecError, match="global_image"):
            EnvSpec.from_dict({**spec.to_dict(), "global_image": bad})
    flat = {k: v for k, v in spec.to_dict().items() if k != "global_image"}
    assert EnvSpec.from_dict(flat).global_image == 0


def test_the_value_reads_the_screen_alone_and_a_round_trains():
    """The value trunk is a CNN over the grey screen: other frames, same screen, same value;
    same frames, another screen, another value; the acting path never reads the screen. A local
    round of PPO updates it."""
    cfg = _cfg()
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    seg = sampler.sample()
    SegmentLayout(8, 20, sampler.spec).validate(seg)
    assert seg["global_state"].shape == (8, 20, 4096)
    policy = build_policy(cfg, sampler.spec, critic=True)
    obs = torch.from_numpy(seg["obs"].reshape(-1, 3, 84, 84))
    state = torch.from_numpy(seg["global_state"].reshape(-1, 4096))
    with torch.no_grad():
        _, v = policy.distribution_params({"obs": obs, "global_state": state})
        _, v_frames = policy.distribution_params({"obs": obs.flip(0), "global_state": state})
        _, v_screen = policy.distribution_params({"obs": obs, "global_state": 255 - state})
        pi, _ = policy.policy_step({"obs": obs})
        pi_full, _ = policy.distribution_params({"obs": obs, "global_state": 255 - state})
    torch.testing.assert_close(v_frames, v)
    assert (v_screen - v).abs().max() > 1e-4
    torch.testing.assert_close(pi_full, pi)
    learner = Learner(cfg, sampler.spec)
    before = {k: t.clone() for k, t in learner.model.v_trunk.state_dict().items()}
    result = learner.train_round([seg])
    sampler.close()
    assert result.metrics and np.isfinite(result.metrics["value_loss"])
    after = learner.model.v_trunk.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("recurrent", ["none", "gru"])
def test_a_flat_state_beside_frames_has_a_value_trunk_of_its_own_width(recurrent):
    """model.kind=cnn with a flat global state: an MLP over the state alone, whose width (64) is
    not the frame CNN's (512); with a core each trunk feeds a core of its own width."""
    from relay_rl.contracts.config import build_config
    from relay_rl.contracts.spaces import ActionSpec

    spec = EnvSpec(
        (3, 36, 36),
        ActionSpec("discrete", 3),
        "uint8",
        0.0,
        255.0,
        multi_agent="parallel",
        agents=("a", "b"),
        global_state=8,
    )
    cfg = build_config(
        {},
        [
            "model.kind=cnn",
            "model.normalize_obs=false",
            "model.shared_trunk=false",
            "model.hidden_sizes=[64]",
            f"model.recurrent={recurrent}",
            "model.recurrent_size=16",
            *(["learner.minibatch=sequences"] if recurrent != "none" else []),
        ],
    )
    policy = build_policy(cfg, spec, critic=True)
    assert policy.v_trunk.reads_state_only and policy.v_trunk.out_dim == 64
    gen = torch.Generator().manual_seed(0)
    fields = {
        "obs": torch.randint(0, 255, (6, 3, 36, 36), generator=gen, dtype=torch.uint8),
        "global_state": torch.randn(6, 8, generator=gen),
    }
    if recurrent != "none":
        fields["h_in"] = policy.initial_state(6)
    with torch.no_grad():
        _, value = policy.distribution_params(fields)
        _, other = policy.distribution_params({**fields, "global_state": fields["global_state"] + 1})
    assert value.shape == (6,) and (value - other).abs().max() > 1e-5
