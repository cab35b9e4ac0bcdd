"""Policy groups end to end (configs/simple_tag_groups.yaml: mpe2's simple_tag, 3 predators and 1
prey, each kind its own policy): trained locally and on Ray actors, resumed, and each group's
policy exported, verified, served and evaluated in the whole scene on its own (`--policy`)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from relay_rl.services.cli import main
from relay_rl.services.runs.checkpoints import read_data
from relay_rl.services.serving.service import PolicyService
from tests.helpers import ROOT, train_in_process, train_local

pytest.importorskip("pettingzoo")

TAG = "pettingzoo:mpe2.simple_tag_v3"
SMALL = ["env.num_envs=8", "rollout.rollout_len=25", "learner.buffer_size=400", "learner.batch_size=200"]


def _lines(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_groups_train_locally_with_a_line_for_each_and_are_evaluated_in_the_scene(tmp_path, capsys):
    """Each group's line, and the evaluation during training: every group scored in its scene (the
    other group playing the same weights), a video of the first group's, and best.pt, which
    `relay eval --best --policy` and `relay export --policy --env` (observations recorded in the
    scene) read."""
    run = tmp_path / "tag"
    evals = ["eval.every_iterations=2", "eval.episodes=4", "eval.video_every=1", "checkpoint.keep_best=true"]
    assert train_local("simple_tag_groups.yaml", run, *SMALL, *evals, "stop.env_steps=4800") == 0
    lines = _lines(run)
    last = lines[-1]
    for group in ("predator", "prey"):
        assert {f"policy/{group}/{k}" for k in ("policy_loss", "entropy", "weights_version")} <= set(last)
        assert f"policy_return_mean/{group}" in last
    assert last["policy/predator/weights_version"] == last["policy/prey/weights_version"] == last["iteration"]
    assert last["weights_version"] == 2 * last["iteration"]

    scored = [x for x in lines if "eval_return_mean" in x]
    assert scored, "no evaluation finished"
    for x in scored:
        groups = [x["policy/predator/eval_return_mean"], x["policy/prey/eval_return_mean"]]
        assert x["eval_return_mean"] == pytest.approx(np.mean(groups))
        assert x["eval_episodes"] == 8 and x["eval_len_mean"] == 25  # 4 episodes of each group
        assert groups[1] <= 0  # the prey is only ever caught (or leaves the field): never rewarded
    assert list((run / "videos").glob("iter-*.mp4")), "no video of the scene"

    best = run / "checkpoints" / "best.pt"
    assert best.is_file()
    capsys.readouterr()
    args = ["eval", str(run), "--best", "--policy", "prey", "--env", TAG, "--episodes", "2", "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["episodes"] == 2
    out = tmp_path / "prey.onnx"
    assert main(["export", str(best), "--policy", "prey", "--env", TAG, "--out", str(out)]) == 0
    assert "checked on 2000 observations" in capsys.readouterr().out and out.is_file()


def test_a_group_config_that_does_not_split_is_one_line_and_exit_2(tmp_path, capsys):
    run = tmp_path / "bad"
    sets = ["env.num_envs=4", "rollout.rollout_len=2", "learner.buffer_size=8", "learner.batch_size=2"]
    args = ["train", "configs/simple_tag_groups.yaml", "--run-dir", str(run), "--set=rollout.num_workers=0"]
    code = main(args + [f"--set={kv}" for kv in sets])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "policy group predator" in err[0] and "minibatches" in err[0]
    assert not run.exists()


@pytest.mark.ray
def test_predators_learn_on_ray_and_each_group_is_exported_and_served(local_ray, tmp_path, capsys):
    run = tmp_path / "tag"
    sets = ["stop.env_steps=240000", "checkpoint.interval=25", "metrics.progress=none"]
    sets += ["eval.every_iterations=20", "eval.episodes=8"]  # on the evaluation actor
    assert train_in_process("simple_tag_groups.yaml", run, *sets) == 0
    lines = _lines(run)
    scored = [x for x in lines if "policy/predator/eval_return_mean" in x]
    assert scored and all(x["eval_episodes"] == 16 for x in scored)
    predator = [x["policy_return_mean/predator"] for x in lines if "policy_return_mean/predator" in x]
    # random predators catch the prey now and then (~3 a episode); learning ones chase it down
    first, last = np.mean(predator[:5]), np.mean(predator[-5:])
    assert last > 2 * first and last > 8, (first, last)
    assert lines[-1]["rejected_segments"] == 0 and lines[-1]["worker_restarts"] == 0

    # resumed (the env named on the command line, as for every id that imports a module)
    again = ["--set=stop.env_steps=250000", "--set=metrics.progress=none", "--set=env.id=" + TAG]
    assert main(["resume", str(run), *again]) == 0
    resumed = _lines(run)
    assert resumed[-1]["env_steps"] >= 250000
    assert resumed[-1]["policy/prey/weights_version"] > lines[-1]["policy/prey/weights_version"]

    ckpt = sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1]
    capsys.readouterr()
    assert main(["export", str(ckpt)]) == 2
    assert "choose one with --policy" in capsys.readouterr().err
    for group, width in (("predator", 16), ("prey", 14)):
        assert main(["export", str(ckpt), "--policy", group]) == 0
        onnx = ckpt.with_name(f"{ckpt.stem}-{group}.onnx")
        assert onnx.is_file()
        assert main(["verify", str(onnx), "--dtypes", "float32", "--batch", "8"]) == 0
        meta = PolicyService(str(run), follow=True, policy=group).metadata()
        assert meta["obs_shape"] == [width] and meta["policy"] == group
        assert meta["weights_version"] == resumed[-1][f"policy/{group}/weights_version"]
    assert main(["verify", str(ckpt), "--policy", "wolf", "--dtypes", "float32"]) == 2
    assert "no policy group 'wolf' (groups: predator, prey)" in capsys.readouterr().err

    # each group scored in the whole scene, the other group playing its own trained policy; sampled
    # as in training (a greedy pack of predators can all chase the same wrong way)
    scores = {}
    for group in ("predator", "prey"):
        args = [
            "eval",
            str(run),
            "--policy",
            group,
            "--env",
            TAG,
            "--episodes",
            "32",
            "--stochastic",
            "--json",
        ]
        assert main(args) == 0
        scores[group] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert scores[group]["episodes"] == 32 and scores[group]["len_mean"] == 25
    # random predators score ~2.5 an episode (the first training line)
    assert scores["predator"]["return_mean"] > 4 and scores["prey"]["return_mean"] < 0, scores


@pytest.mark.ray
def test_a_mapping_in_the_users_folder_chooses_the_groups_on_ray_workers(tmp_path):
    """`multi_agent.policy_mapping=roles:of` with roles.py in the working folder, as a user writes
    it: the driver's probe and the Ray rollout workers import it from there; a resume asks for it
    to be named again, and runs with it when it is."""
    (tmp_path / "roles.py").write_text(
        "def of(agent):\n    return 'predator' if agent.startswith('adversary') else 'prey'\n"
    )
    sets = [*SMALL, "rollout.num_workers=1", "metrics.progress=none", "checkpoint.interval=2"]
    sets += ["multi_agent.policies={predator: [], prey: []}", "multi_agent.policy_mapping=roles:of"]
    sets += ["multi_agent.central_critic=true"]  # each group's critic reads the scene's state too
    relay = [str(Path(sys.executable).parent / "relay")]  # the console script: cwd is not on sys.path

    def run(*args):
        proc = subprocess.run([*relay, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        return proc.returncode, proc.stderr

    code, err = run(
        "train",
        str(ROOT / "configs/simple_tag_groups.yaml"),
        "--run-dir",
        "run",
        *[f"--set={kv}" for kv in [*sets, "stop.env_steps=1600"]],
    )
    assert code == 0, err[-800:]
    last = _lines(tmp_path / "run")[-1]
    assert last["policy/predator/weights_version"] == last["policy/prey/weights_version"] >= 1
    assert last["rejected_segments"] == 0
    # each group's critic read the scene's state (3 predators' 16 numbers, the prey's 14)
    spec = read_data(sorted((tmp_path / "run" / "checkpoints").glob("ckpt-*.pt"))[-1])["env"]
    assert [g["spec"]["global_state"] for g in spec["groups"]] == [62, 62]
    code, err = run("resume", "run", "--set=stop.env_steps=3200")
    # both settings that import code (the pettingzoo env and the mapping) are asked for at once
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--set env.id=pettingzoo:mpe2.simple_tag_v3 --set multi_agent.policy_mapping=roles:of" in err
    named = ["--set=env.id=pettingzoo:mpe2.simple_tag_v3", "--set=multi_agent.policy_mapping=roles:of"]
    code, err = run("resume", "run", "--set=stop.env_steps=3200", *named)
    assert code == 0, err[-800:]
    assert _lines(tmp_path / "run")[-1]["env_steps"] >= 3200
