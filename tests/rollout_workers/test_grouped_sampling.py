"""GRPO's grouped sampling: members of a group share a prompt, padding keeps shapes fixed."""

import numpy as np
import pytest

from relay_rl.contracts.config import build_config
from relay_rl.learner.algorithms import algorithm_traits
from relay_rl.rollout_workers.sampler import make_sampler
from relay_rl.rollout_workers.token_env import ReverseDigitsEnv


def _cfg(env_id: str, *overrides: str):
    return build_config({}, [f"env.id={env_id}", "learner.algo=grpo", "rollout.num_workers=0", *overrides])


CARTPOLE_TWO_GROUPS_OF_FOUR = (
    "CartPole-v1",
    "env.num_envs=8",
    "learner.group_size=4",
    "rollout.rollout_len=500",
    "learner.buffer_size=4000",
    "learner.batch_size=1000",
)


def test_members_of_a_group_start_identical_and_groups_differ():
    cfg = _cfg(*CARTPOLE_TWO_GROUPS_OF_FOUR)
    seg = make_sampler(cfg, algorithm_traits(cfg)).sample()
    first = seg["obs"][0]  # [N, 4]
    for g in range(2):
        members = first[4 * g : 4 * g + 4]
        assert np.array_equal(members, np.repeat(members[:1], 4, axis=0))
    assert not np.array_equal(first[0], first[4])


def test_finished_members_are_padding_and_outcome_is_their_return():
    cfg = _cfg(*CARTPOLE_TWO_GROUPS_OF_FOUR)
    seg = make_sampler(cfg, algorithm_traits(cfg)).sample()
    assert seg["obs"].shape == (500, 8, 4) and seg["outcome"].shape == (8,)
    lengths = seg["mask"].sum(axis=0)
    # CartPole pays 1 per step, so each member's outcome is its episode length
    np.testing.assert_array_equal(seg["outcome"], lengths)
    for i, n in enumerate(lengths.astype(int)):
        assert seg["mask"][:n, i].all() and not seg["mask"][n:, i].any()
        assert seg["terminated"][n - 1, i] + seg["truncated"][n - 1, i] == 1
    assert np.all(seg["rewards"][seg["mask"] == 0] == 0)
    assert seg.episode_returns == [float(x) for x in seg["outcome"]]
    assert seg.env_steps == int(lengths.sum())


def test_episodes_longer_than_the_segment_are_cut_and_flagged():
    cfg = _cfg(
        "CartPole-v1",
        "env.num_envs=4",
        "learner.group_size=2",
        "rollout.rollout_len=3",
        "learner.buffer_size=12",
        "learner.batch_size=12",
    )
    seg = make_sampler(cfg, algorithm_traits(cfg)).sample()
    assert seg["mask"].all()
    assert seg["truncated"][2].all()
    np.testing.assert_array_equal(seg["outcome"], [3.0] * 4)


def test_token_env_verifier_and_random_level():
    env = ReverseDigitsEnv(length=4, vocab=5)
    obs, _ = env.reset(seed=3)
    assert obs.shape == env.observation_space.shape
    target = list(env._prompt[::-1])
    rewards = [env.step(int(tok))[1] for tok in target]
    assert rewards[:-1] == [0.0, 0.0, 0.0] and rewards[-1] == 1.0
    with pytest.raises(RuntimeError, match="after the sequence finished"):
        env.step(0)
    rng = np.random.default_rng(0)
    scores = []
    for s in range(400):
        env.reset(seed=s)
        scores.append(env.score(list(rng.integers(0, 5, 4))))
    assert abs(np.mean(scores) - 0.2) < 0.03


def test_token_task_groups_share_the_prompt():
    cfg = _cfg(
        "relay/ReverseDigits-v0",
        "env.num_envs=8",
        "learner.group_size=4",
        "rollout.rollout_len=5",
        "learner.buffer_size=40",
        "learner.batch_size=40",
    )
    seg = make_sampler(cfg, algorithm_traits(cfg)).sample()
    prompt_part = seg["obs"][0, :, :5]  # the prompt's token ids
    assert np.array_equal(prompt_part[0], prompt_part[3]) and seg["mask"].all()
    assert ((seg["outcome"] >= 0) & (seg["outcome"] <= 1)).all()
