"""Evaluation during training on Ray: an evaluation actor beside the rollout workers plays the
published weights, and its scores, videos and best checkpoint land in the run as in local mode."""

import pytest

from relay_rl.services.cli import main
from tests.helpers import train_in_process
from tests.helpers_proc import metrics_lines

pytestmark = pytest.mark.ray


def test_an_evaluation_actor_scores_published_weights_while_training_goes_on(tmp_path, capsys):
    run = tmp_path / "run"
    sets = ["rollout.num_workers=2", "rollout.mode=async", "learner.buffer_size=2048", "stop.env_steps=48000"]
    evals = ["eval.every_iterations=2", "eval.episodes=3", "eval.video_every=2", "checkpoint.keep_best=true"]
    assert train_in_process("cartpole_ppo.yaml", run, *sets, *evals) == 0
    lines = metrics_lines(run)
    scored = [line for line in lines if "eval_return_mean" in line]
    # At least one: the niced evaluator finishes as many as the CPU training leaves it allows
    # (two of a loaded CI run's 48k steps once finished only one); each on the every-2 schedule.
    assert scored and all(line["eval_iteration"] % 2 == 0 for line in scored)
    # Training does not wait for evaluations: the evaluated weights trail the newest ones.
    assert all(line["eval_weights_version"] <= line["weights_version"] for line in scored)
    assert any(line["eval_iteration"] < line["iteration"] for line in scored)
    assert list((run / "videos").glob("iter-*-return-*.mp4"))
    best = max(line["eval_return_mean"] for line in scored)
    capsys.readouterr()
    assert main(["eval", str(run), "--best", "--episodes", "3", "--json"]) == 0
    assert f'"return_mean": {best}' in capsys.readouterr().out


def test_the_evaluation_actor_yields_the_cpu_to_training():
    """Niced below the workers and the learner: on a busy node it takes only CPU they leave idle."""
    import os

    import psutil
    import ray

    from relay_rl.contracts.config import build_config
    from relay_rl.learner.algorithms import algorithm_traits
    from relay_rl.rollout_workers.evaluator import EVAL_NICENESS, create_evaluator
    from relay_rl.services.driver.preflight import check_env

    cfg = build_config({}, ["eval.every_iterations=1"])
    ray.init(address="local", num_cpus=1, include_dashboard=False)
    try:
        actor = create_evaluator(cfg, check_env(cfg), algorithm_traits(cfg))
        pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
        assert psutil.Process(pid).nice() >= EVAL_NICENESS
    finally:
        ray.shutdown()
