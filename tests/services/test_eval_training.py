"""Evaluation during training, in local mode: eval_* metrics on the lines where an evaluation
finished, videos in RUN/videos, checkpoints/best.pt holding the weights that scored best (and
`relay eval RUN --best` scoring it the same), stop.eval_return_mean, a resumed run keeping its
best, and the config rules."""

import json
from pathlib import Path

import pytest
import torch

from relay_rl.contracts.config import ConfigError, build_config
from relay_rl.services.cli import main
from relay_rl.services.driver.evaluations import best_return
from relay_rl.services.runs.run_dir import RunDir
from tests.helpers import train_local
from tests.helpers_proc import metrics_lines

EVAL = ["eval.every_iterations=2", "eval.episodes=4", "checkpoint.keep_best=true"]
# One evaluation runs at a time and those falling due meanwhile are skipped, so how many finish
# depends on the host and its load (a fast one trained 12k steps while 2 evaluations ran; a CI
# run beside other work finished 2 in 13k): 40k steps leave room for at least 3.
SHORT = ["learner.buffer_size=1024", "stop.env_steps=40000"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("evaluated")
    assert train_local("cartpole_ppo.yaml", run, *SHORT, *EVAL, "eval.video_every=2") == 0
    return run


def evaluations(run: Path) -> list[dict]:
    return [line for line in metrics_lines(run) if "eval_return_mean" in line]


def test_evaluations_report_on_the_lines_they_finish(run):
    lines = metrics_lines(run)
    evals = evaluations(run)
    assert len(evals) >= 3
    for line in evals:
        assert line["eval_episodes"] == 4
        assert line["eval_return_min"] <= line["eval_return_mean"] <= line["eval_return_max"]
        assert line["eval_iteration"] % 2 == 0 and line["eval_iteration"] <= line["iteration"]
        assert line["eval_weights_version"] <= line["weights_version"]
    # the evaluated iterations only ever move forward, and never twice the same weights
    done = [line["eval_iteration"] for line in evals]
    assert done == sorted(set(done))
    assert len(evals) < len(lines)  # the other lines carry no eval keys


def test_best_pt_holds_the_best_evaluated_weights_and_scores_the_same_again(run, capsys):
    best = max(line["eval_return_mean"] for line in evaluations(run))
    path = run / "checkpoints" / "best.pt"
    stored = torch.load(path, weights_only=True)["learner"]["eval"]
    assert stored["return_mean"] == best and best_return(RunDir(run)) == best
    # Evaluations play the same seeds every time, as `relay eval` does by default: the same score.
    assert main(["eval", str(run), "--best", "--episodes", "4", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["return_mean"] == best
    for command in (
        ["export", str(path), "--out", str(run / "best.onnx")],
        ["verify", str(path), "--dtypes", "float32"],
    ):
        assert main(command) == 0


def test_videos_are_named_by_iteration_and_return(run):
    videos = sorted((run / "videos").glob("*.mp4"))
    assert videos
    evaluated = {line["eval_iteration"] for line in evaluations(run)}
    for video in videos:
        iteration, _ = video.stem.removeprefix("iter-").split("-return-")
        assert int(iteration) in evaluated and video.stat().st_size > 1000


def test_stop_on_evaluation_return(tmp_path):
    run = tmp_path / "run"
    assert (
        train_local("cartpole_ppo.yaml", run, "stop.env_steps=100000", *EVAL, "stop.eval_return_mean=30") == 0
    )
    lines = metrics_lines(run)
    assert lines[-1]["env_steps"] < 100_000
    assert evaluations(run)[-1]["eval_return_mean"] >= 30


def test_a_resumed_run_keeps_its_best_until_a_better_one(run, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for part in ("config.yaml", "metrics.jsonl"):
        (copy / part).write_bytes((run / part).read_bytes())
    (copy / "checkpoints").mkdir()
    for ckpt in (run / "checkpoints").glob("*.pt"):
        (copy / "checkpoints" / ckpt.name).write_bytes(ckpt.read_bytes())
    before = best_return(RunDir(copy))
    assert main(["resume", str(copy), "--set", "stop.env_steps=16000", "--set", "metrics.progress=none"]) == 0
    after = best_return(RunDir(copy))
    new = [line["eval_return_mean"] for line in evaluations(copy) if line["iteration"] > 0]
    assert after == max([before, *new])


@pytest.mark.parametrize(
    "sets, says",
    [
        (["checkpoint.keep_best=true"], "checkpoint.keep_best=true needs evaluations"),
        (["stop.eval_return_mean=100"], "stop.eval_return_mean=100.0 needs evaluations"),
        (["eval.video_every=2"], "eval.video_every=2 needs evaluations"),
        (["eval.every_iterations=-1"], "every_iterations"),
        (["eval.episodes=0"], "episodes"),
    ],
)
def test_eval_config_rules(sets, says):
    with pytest.raises(ConfigError, match=says.replace(".", r"\.").replace("=", "=")):
        build_config({}, sets)


def test_a_stopping_run_does_not_wait_for_the_episodes_still_playing():
    """Local mode's evaluation thread is told to stop: closing it takes well under the time its
    10,000 episodes would."""
    import time

    from relay_rl.learner.algorithms import algorithm_traits
    from relay_rl.rollout_workers.evaluator import Evaluator
    from relay_rl.services.driver.backends import LocalBackend
    from relay_rl.services.driver.evaluations import ThreadEvalRunner

    cfg = build_config({}, ["eval.every_iterations=1", "eval.episodes=10000", "rollout.num_workers=0"])
    backend = LocalBackend(cfg)
    runner = ThreadEvalRunner(
        Evaluator(cfg, backend.env_spec, algorithm_traits(cfg)),
        lambda: (backend.learner.version, backend.learner.weights()),
    )
    runner.submit(1, video=False)
    time.sleep(0.5)
    assert runner.busy() and runner.poll() is None  # still playing
    t0 = time.perf_counter()
    runner.close()
    assert time.perf_counter() - t0 < 2.0
    backend.close()
