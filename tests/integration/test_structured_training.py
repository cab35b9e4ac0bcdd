"""Structured spaces trained end to end with `relay train` on real envs: Taxi with its info masks,
MiniGrid's Dict observation (gymnasium and EnvPool), relay's own Dict + MultiDiscrete env with an
obs mask, and the same on Ray actors; checkpoints resume with their env spec."""

import json

import pytest

from tests.helpers import train_in_process, train_local


def _lines(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_taxi_with_its_masks_reaches_a_positive_return(tmp_path):
    assert train_local("taxi_ppo.yaml", tmp_path / "taxi", "stop.env_steps=250000") == 0
    last = _lines(tmp_path / "taxi")[-1]
    assert last["episode_return_mean"] >= 0, last  # random play is about -770


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sync", "envpool"])
def test_minigrid_doorkey_is_solved(tmp_path, backend):
    run = tmp_path / backend
    assert (
        train_local("minigrid_doorkey_ppo.yaml", run, f"env.vectorization={backend}", "stop.env_steps=200000")
        == 0
    )
    last = _lines(run)[-1]
    assert last["episode_return_mean"] >= 0.9, last


PICK = "tests.rollout_workers.structured_envs:PickEnv"


def _pick(run, *sets):
    return train_local(
        "cartpole_ppo.yaml",
        run,
        f"env.id={PICK}",
        "env.num_envs=8",
        "stop.episode_return_mean=null",
        "learner.entropy_coef=0.0",
        *sets,
    )


def test_a_dict_multi_discrete_env_with_obs_masks_learns_and_resumes(tmp_path):
    """Random play scores 8/3 a episode (one target of three per step, 8 steps); the policy must
    read the Discrete `target` leaf through its one-hot to do better."""
    run = tmp_path / "pick"
    assert _pick(run, "stop.env_steps=30000") == 0
    lines = _lines(run)
    assert lines[-1]["episode_return_mean"] > 5.0, lines[-1]
    assert lines[-1]["env_faults"] == 0  # no masked or out-of-range action reached the env
    from relay_rl.services.cli import main

    sets = ["stop.env_steps=40000", "metrics.progress=none", f"env.id={PICK}"]  # the user names the env again
    assert main(["resume", str(run), *[a for kv in sets for a in ("--set", kv)]]) == 0
    assert _lines(run)[-1]["env_steps"] >= 40000


@pytest.mark.ray
@pytest.mark.parametrize(
    "config, sets",
    [
        ("taxi_ppo.yaml", []),  # Discrete observations, info masks, sync vector envs
        # Dict, EnvPool (whose MiniGrid gives the mission as bytes: the keys both backends share)
        ("minigrid_doorkey_ppo.yaml", ["env.vectorization=envpool", "env.obs_keys=[image,direction]"]),
    ],
)
def test_structured_spaces_on_ray_actors(local_ray, tmp_path, config, sets):
    run = tmp_path / "ray"
    code = train_in_process(
        config, run, "rollout.num_workers=2", "env.num_envs=8", "stop.env_steps=20000", *sets
    )
    assert code == 0
    lines = _lines(run)
    assert lines[-1]["env_steps"] >= 20000 and lines[-1]["num_workers"] == 2
    assert lines[-1]["rejected_segments"] == 0 and lines[-1]["env_faults"] == 0


@pytest.mark.ray
def test_a_worker_env_with_other_leaves_than_the_probe_is_one_line(local_ray, tmp_path, capsys):
    """EnvPool's MiniGrid has a `mission` leaf (bytes) gymnasium's lacks (text): refused at start,
    exit 2, with the way out."""
    code = train_in_process(
        "minigrid_doorkey_ppo.yaml", tmp_path / "run", "env.vectorization=envpool", "env.num_envs=8"
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "mission" in err[-1] and "env.obs_keys" in err[-1]


def test_sequence_minibatches_train(tmp_path):
    """learner.minibatch=sequences (whole [T] columns per minibatch) learns CartPole as flat steps do.
    (30k steps: at 20k an fp32 learner reached 2.8x its third line's return, a bf16 one 3.3x.)"""
    run = tmp_path / "seq"
    assert train_local("cartpole_ppo.yaml", run, "learner.minibatch=sequences", "stop.env_steps=30000") == 0
    lines = _lines(run)
    assert lines[-1]["episode_return_mean"] > 3 * lines[2]["episode_return_mean"], lines[-1]


def test_grpo_takes_the_same_spaces(tmp_path):
    """GRPO's grouped layout on the Dict + MultiDiscrete env with its obs mask: it learns too."""
    run = tmp_path / "grpo"
    code = train_local(
        "cartpole_grpo.yaml",
        run,
        f"env.id={PICK}",
        "stop.episode_return_mean=null",
        "stop.env_steps=30000",
        "rollout.rollout_len=8",
        "env.num_envs=32",
        "learner.buffer_size=1024",
        "learner.batch_size=256",
    )
    assert code == 0
    lines = _lines(run)
    assert lines[-1]["env_faults"] == 0 and lines[-1]["episode_return_mean"] > 4.0, lines[-1]
