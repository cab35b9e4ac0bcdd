"""PettingZoo envs as agent columns, on real envs: mpe2's simple_spread (3 cooperating agents),
butterfly's knights_archers_zombies (agents killed mid-episode: masked columns) and classic
connect_four (turn-based, an action mask in every observation, self-play against a pool)."""

import numpy as np
import pytest

from relay_rl.contracts.segment import SegmentLayout
from relay_rl.learner.algorithms import algorithm_traits
from relay_rl.rollout_workers.envs import EnvSpecError, probe_env_spec
from relay_rl.rollout_workers.multi_agent import ACTIVE_KEY, STATS_KEY, MultiAgentError
from relay_rl.rollout_workers.sampler import make_sampler
from relay_rl.rollout_workers.vector_backends import make_vector_env
from tests.helpers import local_config, sampled_twice

pytest.importorskip("pettingzoo")

SPREAD = "pettingzoo:mpe2.simple_spread_v3"
KAZ = "pettingzoo:butterfly.knights_archers_zombies_v11"
C4 = "pettingzoo:classic.connect_four_v3"


def _cfg(env_id, *overrides, T=32, N=6):
    return local_config(env_id, *overrides, T=T, N=N)


def test_spread_spec_is_one_agent_per_column():
    cfg = _cfg(SPREAD, "env.kwargs={N: 3, max_cycles: 25}")
    spec = probe_env_spec(cfg.env, None, cfg.multi_agent)
    assert spec.multi_agent == "parallel" and spec.agents == ("agent_0", "agent_1", "agent_2")
    assert spec.columns == 3 and spec.obs_shape == (18,) and spec.action.kind == "discrete"
    envs = make_vector_env(cfg.env, ma=cfg.multi_agent)
    assert envs.num_envs == 6 and len(envs.envs) == 2
    obs, _ = envs.reset(seed=list(range(6)))
    assert obs.shape == (6, 18)
    envs.close()


def test_a_step_returns_the_observations_after_it():
    """Each column's observation from a vector step is its agent's after that step, as the env
    itself steps it with the same seed and actions (not the one the action was chosen on)."""
    from mpe2 import simple_spread_v3

    cfg = _cfg(SPREAD, "env.kwargs={N: 3, max_cycles: 25}", N=3)
    envs = make_vector_env(cfg.env, ma=cfg.multi_agent)
    raw = simple_spread_v3.parallel_env(N=3, max_cycles=25)
    obs, _ = envs.reset(seed=[5, 5, 5])
    want, _ = raw.reset(seed=5)
    rng = np.random.default_rng(0)
    for _ in range(10):
        np.testing.assert_array_equal(obs, np.stack([want[a] for a in raw.possible_agents]))
        acts = rng.integers(0, 5, size=3)
        obs, *_ = envs.step(acts)
        want, *_ = raw.step(dict(zip(raw.possible_agents, acts.tolist(), strict=True)))
    envs.close()
    raw.close()


def test_columns_must_be_a_multiple_of_the_agents():
    cfg = _cfg(SPREAD, "env.kwargs={N: 3}", N=8)
    with pytest.raises(
        MultiAgentError, match=r"env.num_envs=8 .* multiple of the env's 3 agents.*use 6 or 9"
    ):
        make_vector_env(cfg.env, ma=cfg.multi_agent)


def test_a_parallel_env_needs_every_agent_played():
    cfg = _cfg(KAZ, "multi_agent.agents=[archer_*]", N=4)
    with pytest.raises(EnvSpecError, match="leaves out knight_0, knight_1"):
        probe_env_spec(cfg.env, None, cfg.multi_agent)
    cfg = _cfg(KAZ, "multi_agent.agents=[zombie_*]", N=4)
    with pytest.raises(EnvSpecError, match="matches none of the env's agents"):
        probe_env_spec(cfg.env, None, cfg.multi_agent)


def test_what_a_pettingzoo_env_cannot_take_is_one_line():
    for setting, words in (
        ("env.vectorization=async", "use sync"),
        ("env.max_episode_steps=10", "max_cycles"),
        ("multi_agent.self_play={pool_size: 2}", "turn-based"),
    ):
        with pytest.raises(EnvSpecError, match=words):
            probe_env_spec(_cfg(SPREAD, setting).env, None, _cfg(SPREAD, setting).multi_agent)
    with pytest.raises(EnvSpecError, match=r"pettingzoo:butterfly\.pistonball_v6"):
        probe_env_spec(_cfg("pettingzoo:no..module").env)
    with pytest.raises(EnvSpecError, match=r"cannot import|No module"):
        probe_env_spec(_cfg("pettingzoo:butterfly.no_such_env_v1").env)


def _kaz_envs(copies=2):
    cfg = _cfg(KAZ, "env.kwargs={line_death: true, max_cycles: 200}", N=4 * copies)
    return make_vector_env(cfg.env, ma=cfg.multi_agent)


def test_a_killed_agent_is_a_dead_column_until_its_copy_ends():
    """Random play with line_death kills agents early: each column's step is active until the
    step that ended its agent (terminated, final obs given), inactive after it until every agent
    of its copy is gone, then the copy resets and all its columns are active again."""
    envs = _kaz_envs()
    envs.reset(seed=[7] * 8)
    rng = np.random.default_rng(0)
    dead_since = {}
    saw_dead, saw_reset = False, False
    for _ in range(400):
        before = envs._live.copy()
        _, reward, term, trunc, info = envs.step(rng.integers(0, 6, size=8))
        active = info[ACTIVE_KEY]
        np.testing.assert_array_equal(active, before.reshape(-1))
        assert not (reward[~active].any() or term[~active].any() or trunc[~active].any())
        ended = term | trunc
        if ended.any():
            assert all(info["final_obs"][c] is not None for c in np.flatnonzero(ended))
        dead_since.update(dict.fromkeys(np.flatnonzero(ended).tolist(), True))
        saw_dead |= bool((~active).any())
        for name, _value in info[STATS_KEY]:
            assert name == "team_return_mean" or name.startswith("agent_return_mean/")
        finished = [e for e in range(2) if all(e * 4 + a in dead_since for a in range(4))]
        # a copy's episode ends (its statistics reported, its columns live again) exactly when
        # all four of its agents have ended
        assert len(info[STATS_KEY]) == 5 * len(finished)
        for e in finished:
            assert envs._live[e].all()
            for a in range(4):
                del dead_since[e * 4 + a]
        saw_reset |= bool(finished)
    assert saw_dead and saw_reset
    envs.close()


def test_the_team_return_is_the_sum_of_the_agents():
    envs = _kaz_envs(copies=1)
    envs.reset(seed=[3] * 4)
    rng = np.random.default_rng(1)
    totals = np.zeros(4)
    for _ in range(1000):
        _, reward, *_, info = envs.step(rng.integers(0, 6, size=4))
        totals += reward
        if info[STATS_KEY]:
            stats = dict(info[STATS_KEY])
            agents = [stats[f"agent_return_mean/{a}"] for a in envs.agents]
            np.testing.assert_allclose(agents, totals)
            assert stats["team_return_mean"] == pytest.approx(totals.sum())
            return
    pytest.fail("no episode ended in 1000 steps")


def test_a_segment_masks_dead_columns_and_reports_the_team():
    cfg = _cfg(KAZ, "env.kwargs={line_death: true, max_cycles: 200}", T=128, N=8)
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    segs = [sampler.sample() for _ in range(3)]
    layout = SegmentLayout(128, 8, sampler.spec)
    for seg in segs:
        layout.validate(seg)
        assert seg.env_steps == int(seg["mask"].sum())
        # after a column's episode ends it stays masked until its copy's episode ends
        assert (seg["rewards"][seg["mask"] == 0] == 0).all()
    mask = np.concatenate([s["mask"] for s in segs])
    assert 0 < mask.mean() < 1  # agents died and were masked
    stats = [v for s in segs for v in s.episode_stats.get("team_return_mean", [])]
    assert stats, "an episode of a copy finished"
    assert sum(len(s.episode_returns) for s in segs) >= 4 * len(stats)
    sampler.close()


def _c4(*sets, N=4, T=64):
    return _cfg(C4, *sets, N=N, T=T)


def test_connect_four_is_one_seat_per_copy_with_masks():
    cfg = _c4()
    spec = probe_env_spec(cfg.env, None, cfg.multi_agent)
    assert spec.multi_agent == "aec" and spec.columns == 1 and spec.action_mask == "obs:action_mask"
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    seg = sampler.sample()
    SegmentLayout(64, 4, sampler.spec).validate(seg)
    assert seg["mask"].all()  # the seat moves every step
    taken = seg["actions"].reshape(-1)
    allowed = seg["action_mask"].reshape(-1, 7)
    assert allowed[np.arange(taken.size), taken].all()  # never a full column
    ended = (seg["terminated"] + seg["truncated"]).sum()
    assert ended >= 4 and set(np.unique(seg["rewards"])) <= {-1.0, 0.0, 1.0}
    assert "win_rate_self" not in seg.episode_stats  # games against the current weights are not scored
    sampler.close()


def test_the_seat_alternates_and_the_random_player_keeps_the_mask():
    cfg = _c4()
    envs = make_vector_env(cfg.env, ma=cfg.multi_agent)
    envs.reset(seed=[0, 1, 2, 3])
    seats = [list(envs._seat)]
    rng = np.random.default_rng(0)
    for _ in range(200):
        _obs, *_, info = envs.step(
            np.array([rng.choice(np.flatnonzero(m)) for m in np.asarray(envs._batch()["action_mask"])])
        )
        seats.append(list(envs._seat))
        for name, value in info[STATS_KEY]:
            assert name == "win_rate_random" and value in (0.0, 0.5, 1.0)
    assert {s for row in seats for s in row} == {"player_0", "player_1"}
    assert (envs._games > 2).all()
    envs.close()


def test_self_play_snapshots_by_version_and_scores_the_pool():
    cfg = _c4("multi_agent.self_play={snapshot_every: 2, pool_size: 2, random_opponent: 0.5}", N=8)
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    opponents = sampler.opponents
    assert opponents is not None and opponents.pool == []
    learner_weights = _weights(cfg, sampler)
    for version in range(7):  # versions 0..6: buckets 0, 1, 2, 3 -> 4 snapshots, 2 kept
        sampler.set_weights(version, learner_weights)
    assert len(opponents.pool) == 2 and opponents._bucket == 3
    kinds = {opponents.draw(e) for e in range(200)}
    assert kinds == {"pool", "random"}
    stats = {}
    for _ in range(4):
        for k, v in sampler.sample().episode_stats.items():
            stats.setdefault(k, []).extend(v)
    assert set(stats) == {"win_rate_pool", "win_rate_random"}
    sampler.close()


def _weights(cfg, sampler):
    from relay_rl.policy.models import build_policy

    return build_policy(cfg, sampler.spec, critic=True).state_dict()


def test_a_sync_self_play_run_reproduces():
    cfg = _c4("multi_agent.self_play={snapshot_every: 1, pool_size: 2}", N=4, T=32)
    runs = []
    for _ in range(2):
        sampler = make_sampler(cfg, algorithm_traits(cfg))
        w = _weights(cfg, sampler)
        sampler.set_weights(0, w)
        sampler.set_weights(1, w)
        segs = [sampler.sample() for _ in range(2)]
        runs.append(segs)
        sampler.close()
    for a, b in zip(*runs, strict=True):
        for name in a.arrays:
            np.testing.assert_array_equal(a[name], b[name])
        assert a.episode_stats == b.episode_stats


def test_a_parallel_envs_segments_reproduce_padding_included():
    cfg = _cfg(KAZ, "env.kwargs={line_death: true, max_cycles: 100}", T=64, N=8)
    for a, b in zip(*sampled_twice(cfg), strict=True):
        assert (a["mask"] == 0).any()  # dead columns are in it
        for name in a.arrays:
            np.testing.assert_array_equal(a[name], b[name])
        assert a.episode_stats == b.episode_stats


@pytest.mark.parametrize("factory", ["spread_aec", "spread_parallel"])
def test_a_factory_making_a_pettingzoo_env_is_played_as_columns(factory):
    """A parallelizable AEC env goes through PettingZoo's own aec_to_parallel: the same columns."""
    cfg = _cfg(f"tests.rollout_workers.pettingzoo_factories:{factory}", "env.kwargs={N: 3, max_cycles: 10}")
    spec = probe_env_spec(cfg.env, None, cfg.multi_agent)
    assert spec.multi_agent == "parallel" and spec.agents == ("agent_0", "agent_1", "agent_2")
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    seg = sampler.sample()
    assert seg["mask"].all() and seg["truncated"].sum() == 6 * 3  # 32 steps of 10-step episodes
    sampler.close()


def test_a_pettingzoo_module_of_the_users_own_is_found_in_the_working_folder(tmp_path):
    """`pettingzoo:<package>.<module>` names a package of the user's (as mpe2 is one of its own):
    run from the folder holding it, relay imports it from there (after everything installed)."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    (tmp_path / "mypz").mkdir()
    (tmp_path / "mypz" / "__init__.py").write_text("")
    (tmp_path / "mypz" / "spread_v1.py").write_text(
        "from mpe2 import simple_spread_v3\n\n"
        "def parallel_env(**kw):\n    return simple_spread_v3.parallel_env(**kw)\n"
    )
    cmd = [
        sys.executable,
        "-m",
        "relay_rl.services.cli",
        "validate",
        str(ROOT / "configs/simple_spread_ppo.yaml"),
    ]
    ok = subprocess.run(
        [*cmd, "--set", "env.id=pettingzoo:mypz.spread_v1"], cwd=tmp_path, capture_output=True
    )
    assert ok.returncode == 0, ok.stderr.decode()[-500:]
    bad = subprocess.run([*cmd, "--set", "env.id=pettingzoo:mypz.nope_v1"], cwd=tmp_path, capture_output=True)
    err = bad.stderr.decode().strip().splitlines()
    assert bad.returncode == 2 and len(err) == 1 and "mypz.nope_v1" in err[0]


PISTONBALL = "pettingzoo:butterfly.pistonball_v6"


def test_pixels_preprocessing_gives_pistonball_as_the_cnn_reads_images():
    """env.preprocess=pixels: SuperSuit's own wrappers (blue channel, 84x84, 3 frames stacked),
    channels first; every piston a column of uint8 frames, which move: pistonball draws its screen
    only with a render mode set, and built without one every frame was the reset's."""
    cfg = _cfg(
        PISTONBALL, "env.preprocess=pixels", "env.kwargs={continuous: false, max_cycles: 20}", T=8, N=20
    )
    spec = probe_env_spec(cfg.env, None, cfg.multi_agent)
    assert spec.obs_shape == (3, 84, 84) and spec.obs_dtype == "uint8" and spec.columns == 20
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    seg = sampler.sample()
    assert seg["obs"].shape == (8, 20, 3, 84, 84) and seg["obs"].dtype == np.uint8
    moved = (seg["obs"][-1, :, 2] != seg["obs"][0, :, 2]).reshape(20, -1).any(axis=1)
    assert moved.sum() >= 15, f"only {moved.sum()} of 20 pistons' newest frames changed in 7 steps"
    # the stack shifts: a step's newest frame is the next step's middle one (SuperSuit's stack
    # starts shifting after the first step)
    for t in (1, 2):
        np.testing.assert_array_equal(seg["obs"][t + 1, :, 1], seg["obs"][t, :, 2])
    assert seg["obs"].any()
    sampler.close()


@pytest.mark.parametrize(
    "env_id, preprocess, words",
    [
        ("CartPole-v1", "pixels", "env.preprocess=pixels is for PettingZoo envs"),
        (
            PISTONBALL,
            "atari",
            "env.preprocess=atari is for gymnasium envs; a PettingZoo env takes none, pixels",
        ),
    ],
)
def test_a_preprocessing_of_the_other_kind_of_env_is_one_line(env_id, preprocess, words):
    cfg = _cfg(env_id, f"env.preprocess={preprocess}", N=20)
    with pytest.raises(EnvSpecError, match=words):
        probe_env_spec(cfg.env, None, cfg.multi_agent)
