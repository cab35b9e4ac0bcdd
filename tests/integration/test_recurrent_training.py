"""Recurrent policies trained end to end with `relay train`: CartPole without its velocities
(relay/CartPoleNoVel-v1, which one frame cannot solve) learned by an LSTM on Ray actors, its state
carried through segments; a GRU under GRPO and V-trace locally; a resumed run goes on; export
writes the state as the graph's h_in/h_out (checked against onnxruntime over 100 fed-back steps),
verify reads the checkpoint and the graph (serving with per-client sessions:
tests/services/test_serving_sessions.py, tests/integration/test_serve.py)."""

import json

import pytest

from relay_rl.services.cli import main
from tests.helpers import train_in_process, train_local

NOVEL = "cartpole_novel_lstm_ppo.yaml"


def _lines(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.ray
def test_an_lstm_learns_cartpole_without_velocities_on_ray(local_ray, tmp_path):
    """Measured here: ~130 in 30k steps with memory; a memoryless policy plateaus near 50
    (docs/benchmarks.md "Recurrent policies")."""
    run = tmp_path / "novel"
    code = train_in_process(NOVEL, run, "stop.episode_return_mean=130", "stop.env_steps=60000")
    assert code == 0
    lines = _lines(run)
    assert lines[-1]["episode_return_mean"] >= 130, lines[-1]
    assert lines[-1]["num_workers"] == 2 and lines[-1]["rejected_segments"] == 0


def test_a_recurrent_run_resumes_exports_and_verifies(tmp_path, capsys):
    import onnx

    run = tmp_path / "novel"
    assert (
        train_local(NOVEL, run, "stop.env_steps=4096", "learner.buffer_size=256", "model.recurrent=gru") == 0
    )
    sets = ["stop.env_steps=8192", "metrics.progress=none"]
    assert main(["resume", str(run), *[a for kv in sets for a in ("--set", kv)]]) == 0
    assert _lines(run)[-1]["env_steps"] >= 8192
    ckpt = sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1]
    out = tmp_path / "p.onnx"
    assert main(["export", str(ckpt), "--out", str(out), "--env", "relay/CartPoleNoVel-v1"]) == 0
    graph = onnx.load(out).graph
    assert [i.name for i in graph.input] == ["obs", "h_in"]
    assert [o.name for o in graph.output] == ["action", "logits", "h_out"]
    assert graph.input[1].type.tensor_type.shape.dim[1].dim_value == 64  # the GRU's 64 units
    for model in (ckpt, out):
        assert main(["verify", str(model), "--dtypes", "float32"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    "sets",
    [
        ["learner.off_policy_correction=vtrace", "model.recurrent=gru"],
        ["learner.off_policy_correction=decoupled", "model.shared_trunk=true"],
    ],
)
def test_recurrent_cores_train_under_the_off_policy_corrections(tmp_path, sets):
    run = tmp_path / "novel"
    assert train_local(NOVEL, run, "stop.env_steps=12800", "learner.buffer_size=256", *sets) == 0
    lines = _lines(run)
    assert lines[-1]["episode_return_mean"] > lines[0]["episode_return_mean"], (lines[0], lines[-1])


def test_grpo_takes_a_recurrent_core(tmp_path):
    code = train_local(
        "cartpole_grpo.yaml",
        tmp_path / "grpo",
        "model.recurrent=gru",
        "learner.minibatch=sequences",
        # short grouped segments: the GRU replays each [T] column step by step, per minibatch
        "rollout.rollout_len=100",
        "env.num_envs=8",
        "learner.buffer_size=800",
        "learner.batch_size=400",
        "stop.env_steps=1600",
        "stop.episode_return_mean=null",
    )
    assert code == 0
    lines = [json.loads(x) for x in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    # env_steps counts the episodes' real steps, fewer than a round's T x N slots
    assert [x["iteration"] for x in lines] == list(range(1, len(lines) + 1)) and len(lines) >= 2
    assert lines[-1]["env_steps"] >= 1600 and lines[-1]["rejected_segments"] == 0
