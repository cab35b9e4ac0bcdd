"""A centralized critic (multi_agent.central_critic) on a real env: mpe2's simple_spread, whose
global state (PettingZoo's `state()`) is its three agents' observations one after another. That
makes every check exact: the state a column's value trunk reads at a step must be its copy's agents'
observations at that same step, the one it ended in must be its copy's final observations."""

import numpy as np
import pytest
import torch

from relay_rl.contracts.config import ConfigError
from relay_rl.contracts.segment import SegmentLayout
from relay_rl.contracts.spaces import EnvSpec, SpecError
from relay_rl.learner.algorithms import algorithm_traits
from relay_rl.policy.models import build_policy
from relay_rl.policy.normalizer import Moments
from relay_rl.policy.numpy_mirror import cpu_policy
from relay_rl.rollout_workers.envs import EnvSpecError, probe_env_spec
from relay_rl.rollout_workers.multi_agent import FINAL_GLOBAL_KEY, GLOBAL_KEY
from relay_rl.rollout_workers.sampler import make_sampler
from relay_rl.rollout_workers.vector_backends import make_vector_env
from tests.helpers import local_config

pytest.importorskip("pettingzoo")

SPREAD = "pettingzoo:mpe2.simple_spread_v3"
CENTRAL = ("env.kwargs={N: 3, max_cycles: 25}", "multi_agent.central_critic=true")


def _cfg(*sets, T=32, N=6):
    return local_config(SPREAD, *CENTRAL, *sets, T=T, N=N)


def _copy_obs(obs, e):
    """Copy e's three agents' observations, one after another [T, 54] (the env's state)."""
    return obs[:, 3 * e : 3 * e + 3].reshape(obs.shape[0], -1)


def test_each_column_reads_its_copys_state_at_the_same_step():
    cfg = _cfg()
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    assert sampler.spec.global_state == 54
    for _ in range(2):  # the second segment starts from the first's carried envs
        seg = sampler.sample()
        SegmentLayout(32, 6, sampler.spec).validate(seg)
        state, obs = seg["global_state"], seg["obs"]
        for e in range(2):
            for a in range(3):
                np.testing.assert_array_equal(state[:, 3 * e + a], _copy_obs(obs, e))
        assert not np.array_equal(state[:, 0], state[:, 3])  # two copies, two states
        assert seg.global_moments["count"] == seg.env_steps
    sampler.close()


def test_an_ended_episode_keeps_the_state_it_ended_in():
    """The copy resets in the step its episode ends (the info's state is the new episode's); the
    state for the bootstrap value is the one the final observations were seen in."""
    cfg = _cfg(N=3)
    envs = make_vector_env(cfg.env, ma=cfg.multi_agent)
    _, info = envs.reset(seed=[0, 0, 0])
    np.testing.assert_array_equal(info[GLOBAL_KEY][0], info[GLOBAL_KEY][2])
    for _ in range(24):
        obs, _, term, trunc, info = envs.step(np.zeros(3, dtype=np.int64))
        assert not (term | trunc).any() and FINAL_GLOBAL_KEY not in info
        np.testing.assert_array_equal(info[GLOBAL_KEY][1], obs.reshape(-1))
    obs, _, _, trunc, info = envs.step(np.zeros(3, dtype=np.int64))
    assert trunc.all()  # max_cycles
    final = np.concatenate([info["final_obs"][a] for a in range(3)])
    np.testing.assert_array_equal(info[FINAL_GLOBAL_KEY][0], final)
    np.testing.assert_array_equal(info[GLOBAL_KEY][0], obs.reshape(-1))  # the next episode's
    assert not np.array_equal(final, obs.reshape(-1))
    envs.close()


def test_only_the_value_reads_the_state_and_the_numpy_mirror_matches_torch():
    cfg = _cfg()
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    seg = sampler.sample()
    sampler.close()
    policy = build_policy(cfg, sampler.spec, critic=True)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    policy.normalizer.update(Moments.of(torch.from_numpy(seg["obs"].reshape(-1, 18))))
    policy.global_normalizer.update(Moments.of(torch.from_numpy(seg["global_state"].reshape(-1, 54))))
    fast = cpu_policy(cfg.model, policy)
    obs = seg["obs"].reshape(-1, 18)
    mine = {"obs": obs, "global_state": seg["global_state"].reshape(-1, 54)}
    other = {"obs": obs, "global_state": mine["global_state"][::-1].copy()}  # other copies' states
    noise = np.random.default_rng(0).random((obs.shape[0],)).astype(np.float32)
    a_np, logp_np, v_np, _ = fast.act(mine, noise)
    with torch.no_grad():
        a_t, logp_t, v_t = policy.act(
            {k: torch.from_numpy(v) for k, v in mine.items()}, torch.from_numpy(noise)
        )
    np.testing.assert_array_equal(a_np, a_t.numpy())
    np.testing.assert_allclose(logp_np, logp_t.numpy(), atol=1e-5)
    np.testing.assert_allclose(v_np, v_t.numpy(), atol=1e-5)
    a_other, logp_other, v_other, _ = fast.act(other, noise)
    np.testing.assert_array_equal(a_other, a_np)
    np.testing.assert_array_equal(logp_other, logp_np)
    assert np.abs(v_other - v_np).max() > 1e-3
    # the acting path (exports, serving) takes the observation alone
    with torch.no_grad():
        params, _ = policy.policy_step({"obs": torch.from_numpy(obs)})
        full, _ = policy.policy_step({k: torch.from_numpy(v) for k, v in mine.items()})
    torch.testing.assert_close(params, full)


def test_a_sync_run_with_the_state_reproduces():
    cfg = _cfg()
    segs = []
    for _ in range(2):
        sampler = make_sampler(cfg, algorithm_traits(cfg))
        segs.append(sampler.sample())
        sampler.close()
    for name, arr in segs[0].arrays.items():
        np.testing.assert_array_equal(arr, segs[1].arrays[name], err_msg=name)


@pytest.mark.parametrize(
    ("sets", "words"),
    [
        (["model.shared_trunk=true"], "model.shared_trunk=false"),
        (["env.id=CartPole-v1", "env.kwargs={}"], "CartPole-v1 is a gymnasium env"),
        (["env.id=pettingzoo:classic.connect_four_v3", "env.kwargs={}"], "turn-based (AEC) game"),
        (
            [
                "env.id=tests.rollout_workers.pettingzoo_factories:faulty_tag",
                "env.kwargs={at: 1000}",
                "multi_agent.policies={predator: ['adversary_*'], prey: ['agent_*']}",
                "env.num_envs=8",
                "learner.buffer_size=256",
                "learner.batch_size=256",
            ],
            "FaultyTag has no state_space Box and state()",
        ),
    ],
)
def test_what_a_centralized_critic_cannot_take_is_one_line(sets, words):
    try:
        cfg = _cfg(*sets)
        probe_env_spec(cfg.env, None, cfg.multi_agent)
    except (ConfigError, EnvSpecError) as err:
        assert words in str(err) and "\n" not in str(err), err
    else:
        pytest.fail("accepted")


def test_a_spec_carries_the_state_size_and_a_file_cannot_lie_about_it():
    cfg = _cfg()
    spec = probe_env_spec(cfg.env, None, cfg.multi_agent)
    assert EnvSpec.from_dict(spec.to_dict()) == spec and spec.global_state == 54
    for bad in (-1, 5000, 2.5, True, "54"):
        with pytest.raises(SpecError, match="global_state"):
            EnvSpec.from_dict({**spec.to_dict(), "global_state": bad})
    plain = {**spec.to_dict(), "global_state": 54}
    del plain["multi_agent"], plain["agents"]
    with pytest.raises(SpecError, match="of an env whose agents are its columns only"):
        EnvSpec.from_dict(plain)


def test_a_spec_file_names_an_api_but_only_its_agents_make_columns():
    """The contract knows columns, not API names (their meaning is the multi-agent registry's):
    agents without an API, or an API name that is no identifier, are refused."""
    spec = probe_env_spec(_cfg().env, None, _cfg().multi_agent)
    data = spec.to_dict()
    assert EnvSpec.from_dict(data).columns == len(spec.agents) > 1
    with pytest.raises(SpecError, match="multi_agent is missing"):
        EnvSpec.from_dict({k: v for k, v in data.items() if k not in ("multi_agent", "global_state")})
    with pytest.raises(SpecError, match="must be an API name"):
        EnvSpec.from_dict({**data, "multi_agent": "../x"})
