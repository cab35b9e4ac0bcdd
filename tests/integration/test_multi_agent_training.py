"""PettingZoo envs trained end to end with `relay train`, locally and on Ray actors: simple_spread
(parameter sharing over 3 agents, team and per-agent returns), knights_archers_zombies (agents
killed mid-episode are masked columns), Connect Four by self-play against a snapshot pool; and a
resumed self-play run keeps its episode statistics."""

import json

import pytest

from relay_rl.services.cli import main
from tests.helpers import train_in_process, train_local

pytest.importorskip("pettingzoo")

C4 = "pettingzoo:classic.connect_four_v3"
SPREAD = "pettingzoo:mpe2.simple_spread_v3"
SMALL = [
    "env.num_envs=12",
    "rollout.rollout_len=25",
    "learner.buffer_size=600",
    "learner.batch_size=300",
    "checkpoint.interval=5",
]


def _lines(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_simple_spread_locally_reports_the_team_and_each_agent(tmp_path):
    run = tmp_path / "spread"
    assert train_local("simple_spread_ppo.yaml", run, *SMALL, "stop.env_steps=6000") == 0
    last = _lines(run)[-1]
    agents = [last[f"agent_return_mean/agent_{i}"] for i in range(3)]
    assert last["team_return_mean"] < 0 and all(a < 0 for a in agents)
    # the team's return is the sum of its agents' (each averaged over the same episodes)
    assert last["team_return_mean"] == pytest.approx(sum(agents), rel=1e-6)
    assert last["env_steps"] >= 6000 and last["episodes"] > 0


def test_a_centralized_critic_trains_resumes_and_exports_the_policy_alone(tmp_path, capsys):
    """The learner folds the global state's statistics into the checkpoint's weights; a resume
    goes on from them; the export and its check take the agent's observation alone."""
    import onnx

    from relay_rl.services.runs.checkpoints import read_data

    run = tmp_path / "mappo"
    assert train_local("simple_spread_mappo.yaml", run, *SMALL, "stop.env_steps=3000") == 0
    first = _lines(run)
    ckpt = sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1]
    raw = read_data(ckpt)
    weights = raw["learner"]["model"]
    assert raw["env"]["global_state"] == 54 and weights["v_trunk.net.0.weight"].shape[1] == 18 + 54
    # every valid step's state was counted, up to the last update's (folded in after it)
    assert 1 < float(weights["global_normalizer.steps"]) <= first[-1]["env_steps"] + 1
    again = ["resume", str(run), "--set=stop.env_steps=4500", "--set=env.id=" + SPREAD]
    assert main(again) == 0
    assert (
        _lines(run)[-1]["env_steps"] >= 4500
        and _lines(run)[-1]["weights_version"] > first[-1]["weights_version"]
    )
    ckpt = sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1]
    capsys.readouterr()
    assert main(["export", str(ckpt)]) == 0
    graph = onnx.load(str(ckpt.with_suffix(".onnx"))).graph
    assert [i.name for i in graph.input] == ["obs"]
    assert main(["verify", str(ckpt.with_suffix(".onnx")), "--env", SPREAD, "--dtypes", "float32"]) == 0
    assert main(["eval", str(ckpt), "--env", SPREAD, "--episodes", "6", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["episodes"] == 6


@pytest.mark.parametrize("core", [[], ["model.recurrent=gru", "learner.minibatch=sequences"]])
def test_killed_agents_are_masked_while_training(tmp_path, core):
    """Dead columns are masked steps: a recurrent core's state is zeroed over them, as on a lost step."""
    run = tmp_path / "kaz"
    code = train_local(
        "simple_spread_ppo.yaml",
        run,
        "env.id=pettingzoo:butterfly.knights_archers_zombies_v11",
        "env.kwargs={line_death: true, max_cycles: 150}",
        "env.num_envs=8",
        "rollout.rollout_len=32",
        "learner.buffer_size=256",
        "learner.batch_size=128",
        "stop.env_steps=3000",
        *core,
    )
    assert code == 0
    lines = _lines(run)
    # env_steps counts the live agents' steps only: fewer than the columns' T x N per iteration
    assert lines[-1]["env_steps"] < 256 * len(lines)
    assert {"agent_return_mean/archer_0", "agent_return_mean/knight_1"} <= set(lines[-1])


def test_a_bad_column_count_is_one_line_and_exit_2(tmp_path, capsys):
    run = tmp_path / "bad"
    sets = ["env.num_envs=8", "rollout.rollout_len=25", "learner.buffer_size=400", "learner.batch_size=400"]
    code = main(
        ["train", "configs/simple_spread_ppo.yaml", "--run-dir", str(run), *(f"--set={kv}" for kv in sets)]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "env.num_envs=8" in err[0] and "use 6 or 9" in err[0]
    assert not run.exists()


@pytest.mark.slow
def test_connect_four_self_play_beats_a_random_player(tmp_path):
    """Self-play alone (20% of games against the random player, which it is scored on) lifts the
    score against it well above the 0.5 of random play."""
    run = tmp_path / "c4"
    assert train_local("connect_four_selfplay.yaml", run, "stop.env_steps=60000") == 0
    lines = _lines(run)
    assert lines[-1]["win_rate_random"] >= 0.8, lines[-1]
    assert "win_rate_pool" in lines[-1]


@pytest.mark.ray
def test_self_play_and_parameter_sharing_through_ray_actors(local_ray, tmp_path):
    run = tmp_path / "c4ray"
    sets = ["stop.env_steps=8000", "multi_agent.self_play.snapshot_every=2", "metrics.progress=none"]
    assert train_in_process("connect_four_selfplay.yaml", run, *sets) == 0
    last = _lines(run)[-1]
    assert last["weights_version"] >= 4 and {"win_rate_pool", "win_rate_random"} <= set(last)
    assert last["worker_restarts"] == 0 and last["rejected_segments"] == 0
    # resumed, the run goes on from its checkpoint with its episode statistics (checkpointed
    # counters: the first line after the resume point already has them); the env is named on the
    # command line, as every env id that imports a module must be (a run's files never do)
    before = len(_lines(run))
    again = ["--set=stop.env_steps=12000", "--set=metrics.progress=none", "--set=env.id=" + C4]
    assert main(["resume", str(run), *again]) == 0
    lines = _lines(run)
    assert len(lines) > before - 5 and lines[-1]["env_steps"] >= 12000
    assert all("win_rate_pool" in x for x in lines[-3:])
    spread = tmp_path / "spread"
    assert train_in_process("simple_spread_ppo.yaml", spread, *SMALL, "stop.env_steps=6000") == 0
    assert _lines(spread)[-1]["team_return_mean"] < 0
