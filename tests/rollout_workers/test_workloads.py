"""Atari pixels, MuJoCo physics and EnvPool through the samplers: uint8 frames end to end, the
true game reported while learning sees lives and clipped rewards, EnvPool segments tied to
gymnasium's, and missing extras named with their pip command."""

import sys

import numpy as np
import pytest

from relay_rl.contracts.config import build_config
from relay_rl.learner.algorithms import algorithm_traits
from relay_rl.learner.buffer import SegmentRingBuffer
from relay_rl.rollout_workers.envs import EnvSpecError, check_env_id, extra_hint
from relay_rl.rollout_workers.sampler import make_sampler
from relay_rl.services.driver.preflight import check_config, check_env


def _cfg(*sets: str, T: int = 128, N: int = 2):
    base = [
        "rollout.num_workers=0",
        f"env.num_envs={N}",
        f"rollout.rollout_len={T}",
        f"learner.buffer_size={T * N}",
        f"learner.batch_size={T * N}",
    ]
    return build_config({}, [*base, *sets])


ATARI = ("env.id=ALE/Breakout-v5", "env.preprocess=atari", "model.kind=cnn", "model.normalize_obs=false")


@pytest.mark.parametrize("backend", ["sync", "envpool"])
def test_atari_frames_stay_uint8_and_the_true_game_is_reported(backend):
    cfg = _cfg(*ATARI, f"env.vectorization={backend}", T=600)
    check_config(cfg)
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    assert sampler.spec.obs_shape == (4, 84, 84) and sampler.spec.obs_dtype == "uint8"
    seg = sampler.sample()
    assert seg["obs"].dtype == np.uint8 and seg["obs"].shape == (600, 2, 4, 84, 84)
    assert set(np.unique(seg["rewards"])) <= {-1.0, 0.0, 1.0}  # sign-clipped for learning
    lives_lost = int(seg["terminated"].sum())
    # A game of Breakout has 5 lives: learning sees each life as an episode, the report sees games.
    assert lives_lost >= 5 and len(seg.episode_returns) <= lives_lost // 5 + 2
    assert all(length > 20 for length in seg.episode_lengths)
    buffer = SegmentRingBuffer(sampler.layout, 1)
    buffer.add(seg)
    assert str(buffer.storage["obs"].dtype) == "torch.uint8"
    assert sampler.layout.nbytes() < 600 * 2 * (4 * 84 * 84 + 64)  # 28 KB a step, not 113 KB


def test_a_seeded_reset_starts_a_new_atari_game_even_mid_game():
    """After a lost life, a plain reset continues the same game (learning sees lives); a reset
    given a seed starts that seed's game. `relay eval` resets with its own seed stream after a
    first reset: it used to keep playing the first reset's game, two steps into it, so its scores
    differed from SB3's evaluate_policy on the same seeds."""
    from relay_rl.rollout_workers.atari import atari_env
    from relay_rl.rollout_workers.envs import register_family

    register_family("ALE/Breakout-v5")

    def first_frames(env, seed):
        obs, _ = env.reset(seed=seed)
        return obs, [env.step(3)[0] for _ in range(5)]

    fresh = atari_env("ALE/Breakout-v5")
    want_obs, want_steps = first_frames(fresh, 11)
    played = atari_env("ALE/Breakout-v5")
    played.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(40):  # into the game (its first reset pressed FIRE: no longer a game over)
        played.step(int(rng.integers(4)))
    got_obs, got_steps = first_frames(played, 11)
    assert np.array_equal(got_obs, want_obs)
    assert all(np.array_equal(a, b) for a, b in zip(got_steps, want_steps, strict=True))
    lives = played.unwrapped.ale.lives()
    assert lives == 5  # a new game: every life back


def test_envpool_segments_match_gymnasiums_in_shape_masks_and_episodes():
    """Same env, same settings: the layouts are identical, every step is valid, every finished
    episode is counted once, and truncation bootstraps from the final observation."""
    segs = {}
    for backend in ("sync", "envpool"):
        cfg = _cfg(f"env.vectorization={backend}", "env.max_episode_steps=30", T=300, N=4)
        segs[backend] = make_sampler(cfg, algorithm_traits(cfg)).sample()
    a, b = segs["sync"], segs["envpool"]
    assert {k: (v.shape, v.dtype) for k, v in a.arrays.items()} == {
        k: (v.shape, v.dtype) for k, v in b.arrays.items()
    }
    for seg in (a, b):
        assert seg["mask"].all()
        ends = seg["terminated"] + seg["truncated"]
        assert ends.max() == 1  # terminated and truncated never both
        assert int(ends.sum()) == len(seg.episode_returns)
        assert max(seg.episode_lengths) <= 30
        trunc = seg["truncated"] > 0
        assert (
            trunc.any()
            and np.all(seg["bootstrap_value"][trunc] != 0)
            and np.all(seg["bootstrap_value"][~trunc] == 0)
        )
    # Episode lengths follow the same distribution (the random policy, the same physics).
    assert abs(np.mean(a.episode_lengths) - np.mean(b.episode_lengths)) < 5


def test_envpool_mujoco_and_resetting_some_envs():
    cfg = _cfg("env.id=Hopper-v5", "env.vectorization=envpool", T=64, N=3)
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    assert sampler.spec.obs_shape == (11,) and sampler.spec.action.kind == "continuous"
    seg = sampler.sample()
    assert seg["mask"].all() and np.isfinite(seg["obs"]).all()
    before = sampler.envs.env._last_obs.astype(np.float32)
    after = sampler.envs.reset(options={"reset_mask": np.array([False, True, False])})["obs"]
    assert np.array_equal(after[0], before[0]) and not np.array_equal(after[1], before[1])


@pytest.mark.parametrize(
    "sets, needle",
    [
        (
            ("env.id=NoSuch-v0", "env.vectorization=envpool"),
            "env.vectorization=envpool has no env 'NoSuch-v0'",
        ),
        (
            ("env.vectorization=envpool", "learner.algo=grpo", "learner.group_size=2"),
            "cannot start a group's members from one seed",
        ),
        (("env.vectorization=envpool", "env.kwargs={x: 1}"), "takes no env.kwargs"),
        (("model.kind=cnn", "model.normalize_obs=false"), None),
    ],
)
def test_what_a_backend_or_model_cannot_run_is_one_line(sets, needle):
    from relay_rl.contracts.config import ConfigError

    cfg = _cfg(*sets)
    if needle is None:  # a CNN on CartPole: the model kind's env check
        with pytest.raises(
            ValueError, match=r"model.kind=cnn reads images .* but CartPole-v1 observes a float32"
        ):
            check_env(cfg)
        return
    with pytest.raises(ConfigError, match=needle):
        check_config(cfg)


def test_missing_extras_are_named_with_their_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)  # as if ale-py were not installed
    with pytest.raises(EnvSpecError, match=r'needs the atari extra: pip install "relay-rl\[atari\]"'):
        check_env_id("ALE/Pong-v5")
    monkeypatch.setitem(sys.modules, "envpool", None)
    from relay_rl.contracts.config import ConfigError

    with pytest.raises(ConfigError, match=r'needs the envpool extra: pip install "relay-rl\[envpool\]"'):
        check_config(_cfg("env.vectorization=envpool"))
    hint = extra_hint("env.id=Hopper-v5", "MuJoCo is not installed, run `pip install gymnasium[mujoco]`")
    assert hint == 'env.id=Hopper-v5 needs the mujoco extra: pip install "relay-rl[mujoco]"'
