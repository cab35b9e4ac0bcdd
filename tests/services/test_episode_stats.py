"""Episode statistics (a multi-agent env's team and per-agent returns, self-play scores) from the
worker's segment to the metrics line and the checkpoint, and the multi-agent part of the env spec:
whatever a worker or a file holds is checked before it counts."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_rl.contracts.checkpoint import STAT_WINDOW, CheckpointError, RunCounters
from relay_rl.contracts.metrics import stat_means
from relay_rl.contracts.rounds import MAX_STAT_NAMES, RoundResult, add_stats
from relay_rl.contracts.spaces import ActionSpec, EnvSpec, SpecError

values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
    st.text(max_size=3),
    st.none(),
    st.booleans(),
)


@given(
    st.dictionaries(st.one_of(st.text(max_size=130), st.integers()), st.lists(values, max_size=5), max_size=8)
)
def test_add_stats_keeps_only_short_names_with_finite_numbers(more):
    out = add_stats({"team_return_mean": [1.0]}, more)
    assert out["team_return_mean"][0] == 1.0
    for name, vals in out.items():
        assert isinstance(name, str) and 0 < len(name) <= 120
        assert all(isinstance(v, float) and math.isfinite(v) for v in vals)


def test_add_stats_ignores_what_is_not_a_mapping_and_caps_the_names():
    assert add_stats({}, ["team_return_mean", 1.0]) == {}
    many = {f"agent_return_mean/a{i}": [1.0] for i in range(MAX_STAT_NAMES + 10)}
    assert len(add_stats({}, many)) == MAX_STAT_NAMES


def test_rounds_merge_and_counters_keep_a_window():
    parts = [
        RoundResult(episode_stats={"win_rate_pool": [1.0]}),
        RoundResult(episode_stats={"win_rate_pool": [0.0]}),
    ]
    merged = RoundResult.merge(parts)
    assert merged.episode_stats == {"win_rate_pool": [1.0, 0.0]}
    c = RunCounters()
    for _ in range(STAT_WINDOW):
        c.absorb(merged)
    assert len(c.stats["win_rate_pool"]) == STAT_WINDOW
    assert stat_means(c.stats) == {"win_rate_pool": 0.5}


def test_stat_means_name_only_known_statistics():
    stats = {
        "team_return_mean": [-2.0, -4.0],
        "agent_return_mean/agent_0": [1.0],
        "surprise": [1.0],
        "empty": [],
    }
    assert stat_means(stats) == {"agent_return_mean/agent_0": 1.0, "team_return_mean": -3.0}


def test_checkpointed_stats_round_trip_and_bad_ones_are_refused():
    c = RunCounters(stats={"team_return_mean": [float(i) for i in range(STAT_WINDOW + 5)]})
    back = RunCounters.from_dict(c.__dict__)
    assert back.stats["team_return_mean"] == [float(i) for i in range(5, STAT_WINDOW + 5)]
    for bad in ({"x": [float("nan")]}, {"x": "1"}, ["x"], {"x": [True]}):
        with pytest.raises(CheckpointError, match="stats"):
            RunCounters.from_dict({**RunCounters().__dict__, "stats": bad})


def _spec(**kw):
    return EnvSpec((18,), ActionSpec("discrete", 5), **kw)


def test_the_env_spec_carries_a_parallel_envs_agents():
    spec = _spec(multi_agent="parallel", agents=("agent_0", "agent_1", "agent_2"))
    assert spec.columns == 3
    assert EnvSpec.from_dict(spec.to_dict()) == spec
    turn = _spec(multi_agent="aec")
    assert turn.columns == 1 and EnvSpec.from_dict(turn.to_dict()) == turn
    assert _spec().columns == 1 and "multi_agent" not in _spec().to_dict()


@pytest.mark.parametrize(
    "patch",
    [
        {"multi_agent": "Matrix API"},  # a name is an identifier; its meaning, the registry's
        {"multi_agent": 3},
        {"multi_agent": "parallel", "agents": "agent_0"},
        {"multi_agent": "parallel", "agents": ["a", "a"]},
        {"multi_agent": "parallel", "agents": [""]},
        {"multi_agent": "parallel", "agents": ["x" * 101]},
        {"multi_agent": "parallel", "agents": [1, 2]},
        {"multi_agent": "parallel", "agents": [f"a{i}" for i in range(1025)]},
    ],
)
def test_a_bad_multi_agent_spec_is_refused(patch):
    with pytest.raises(SpecError):
        EnvSpec.from_dict({**_spec().to_dict(), **patch})


def test_policy_group_metrics_reach_the_sinks_by_group():
    """TensorBoard/MLflow/W&B take "policy/<group>/<key>"; Prometheus a gauge per key with the
    group as its `policy` tag; keys outside POLICY_KEYS and non-finite values are left out."""
    from relay_rl.contracts.metrics import group_metrics
    from relay_rl.services.runs.metric_keys import catalog

    record = {
        "iteration": 3,
        "entropy": 1.2,
        "policy/prey/entropy": 1.1,
        "policy/prey/device": "cpu",
        "policy/prey/unknown_key": 1.0,
        "policy/predator/approx_kl": float("nan"),
        "policy/a/b/entropy": 1.0,
        "policy_return_mean/predator": 12.5,
    }
    assert sorted(group_metrics(record)) == [
        ("predator", "policy_return_mean", 12.5),
        ("prey", "entropy", 1.1),
    ]
    named = dict(catalog().lines(record))
    assert named["entropy"] == 1.2 and named["policy/prey/entropy"] == 1.1
    assert named["policy/predator/policy_return_mean"] == 12.5 and "policy/prey/unknown_key" not in named
