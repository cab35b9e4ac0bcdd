"""Reward models as runs (#61, `model.kind: reward_model`): `relay train` learns a programmatic
preference (sorted digits over unsorted) with held-out evaluations, a run cut and resumed ends
where an uncut one does, `relay eval` reports pair accuracy, `relay export --format hf` writes a
folder transformers and relay's served `model:` reward load; bad pairs files, hostile model
folders and settings no reward model takes are one line, exit 2, nothing created."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from relay_rl.services.cli import main
from relay_rl.services.runs.checkpoints import load_checkpoint
from relay_rl.services.runs.metric_keys import catalog
from tests.llm.test_reward_model_training import _sorted_pairs
from tests.lm_helpers import tiny_model_folder, write_jsonl

RUN_YAML = """\
model: {kind: reward_model, path: model}
prompts: {train: train.jsonl, eval: held.jsonl, batch_size: 16}
learner: {lr: 0.003, device: cpu, bradley_terry: {max_tokens: 16}}
eval: {every_iterations: 20, episodes: 64}
stop: {iterations: 60, env_steps: null}
checkpoint: {interval: 20, keep_best: true}
metrics: {progress: none}
"""


@pytest.fixture(scope="module")
def rmdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("rmrun")
    tiny_model_folder(root / "model")
    write_jsonl(root / "train.jsonl", _sorted_pairs(256, 0))
    write_jsonl(root / "held.jsonl", _sorted_pairs(64, 1))
    (root / "rm.yaml").write_text(RUN_YAML)
    return root


def _lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_reward_model_run_learns_resumes_evaluates_and_exports(rmdir, monkeypatch, capsys):
    monkeypatch.chdir(rmdir)
    run = rmdir / "runs" / "rm"
    assert main(["train", "rm.yaml", "--run-dir", str(run)]) == 0
    lines = _lines(run)
    assert [x["iteration"] for x in lines] == list(range(1, 61))
    assert [x["pairs"] for x in lines[:2]] == [16, 32]
    steps = [x["env_steps"] for x in lines]  # trained tokens: both sides of 16 pairs a round
    assert all(16 * 2 * 2 <= b - a <= 16 * 2 * 16 for a, b in zip([0, *steps[:-1]], steps, strict=True)), (
        steps[:3]
    )
    evals = [x["eval_return_mean"] for x in lines if x.get("eval_return_mean") is not None]
    assert len(evals) == 2 and evals[-1] >= 0.85, evals  # held-out pair accuracy (at 20 and 40)
    known = set(catalog().keys)
    for key in ("loss", "pair_accuracy", "reward_margin", "score_mean", "score_std", "pair_width"):
        assert key in lines[-1] and key in known, key
    # the return of a round is its pairs' accuracy
    assert lines[-1]["episode_return_mean"] is not None
    saved = (run / "config.yaml").read_text()
    assert "max_tokens: 16" in saved and "num_workers: 0" in saved  # every setting stated
    assert (run / "checkpoints" / "best.pt").is_file()

    # cut at 40 and resumed: the same weights as the uncut run's (a seed fixes the run)
    cut = rmdir / "runs" / "cut"
    assert main(["train", "rm.yaml", "--run-dir", str(cut), "--set", "stop.iterations=40"]) == 0
    assert main(["resume", str(cut), "--set", "stop.iterations=60"]) == 0
    assert [x["iteration"] for x in _lines(cut)] == list(range(1, 61))
    ours = load_checkpoint(run / "checkpoints" / "ckpt-00000060.pt").learner["model"]
    theirs = load_checkpoint(cut / "checkpoints" / "ckpt-00000060.pt").learner["model"]
    for name, tensor in ours.items():
        assert torch.equal(theirs[name], tensor), name

    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "64", "--json"]) == 0
    said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert said["episodes"] == 64 and said["return_mean"] >= 0.85, said
    assert main(["eval", str(run), "--episodes", "8", "--stochastic"]) == 2
    assert "takes no" in capsys.readouterr().err

    out = rmdir / "exported"
    assert main(["export", str(run), "--format", "hf", "--out", str(out)]) == 0
    assert "AutoModelForSequenceClassification" in capsys.readouterr().out
    assert main(["export", str(run), "--format", "hf", "--out", str(out)]) == 2  # never replaced
    last = run / "checkpoints" / "ckpt-00000060.pt"
    assert main(["export", str(last), "--format", "onnx", "--out", str(rmdir / "x.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "a preference run's checkpoint exports as --format hf" in err[-1]
    assert not (rmdir / "x.onnx").exists()
    from relay_rl.rollout_workers.lm.reward_models import RewardModel

    served = RewardModel(str(out))  # the `model:` reward a language run scores with
    held = [json.loads(x) for x in (rmdir / "held.jsonl").read_text().splitlines()][:32]
    prompts = [r["prompt"] for r in held]
    chosen = served(prompts, [r["chosen"] for r in held])
    rejected = served(prompts, [r["rejected"] for r in held])
    assert sum(c > r for c, r in zip(chosen, rejected, strict=True)) >= 27


def test_a_lora_reward_model_trains_its_adapters_and_exports_them_merged(rmdir, monkeypatch, capsys):
    """model.lora: only the adapters and the score head train; the export folds them in and
    scores as the run did (checked by the export itself, and here through transformers)."""
    monkeypatch.chdir(rmdir)
    run = rmdir / "runs" / "lora"
    args = ["--set", "model.lora={r: 4, target_modules: all-linear}", "--set", "stop.iterations=4"]
    assert (
        main(["train", "rm.yaml", "--run-dir", str(run), *args, "--set", "learner.grad_checkpointing=true"])
        == 0
    )
    model = load_checkpoint(run / "checkpoints" / "ckpt-00000004.pt").learner["model"]
    assert any("lora_A" in k for k in model) and any("score" in k for k in model)
    out = rmdir / "lora-exported"
    assert main(["export", str(run), "--format", "hf", "--out", str(out)]) == 0
    from transformers import AutoModelForSequenceClassification

    back = AutoModelForSequenceClassification.from_pretrained(str(out))
    assert not any("lora" in k for k in back.state_dict())


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (["--set", "prompts.train=bad.jsonl"], "row 1 has no 'rejected' column"),
        (["--set", "model.path=remote"], "remote"),
        (["--set", "model.path=pickled"], "pickle"),
        (["--set", "prompts.rewards=[numeric_match]"], "learns its reward from preference pairs"),
        (["--set", "learner.algo=grpo"], "is not a reward model's loss: choose bradley_terry"),
        (["--set", "rollout.num_workers=2"], "has no rollout workers"),
        (["--set", "learner.bradley_terry.max_tokens=3"], "over the 3 it may take"),
    ],
)
def test_a_reward_model_run_refuses_bad_input_in_one_line(rmdir, monkeypatch, capsys, change, said):
    monkeypatch.chdir(rmdir)
    write_jsonl(rmdir / "bad.jsonl", [{"prompt": "sort ", "chosen": "12"}])
    if not (rmdir / "remote").exists():
        shutil.copytree(rmdir / "model", rmdir / "remote")
        config = json.loads((rmdir / "remote" / "config.json").read_text())
        config["auto_map"] = {"AutoModelForSequenceClassification": "evil.Model"}
        (rmdir / "remote" / "config.json").write_text(json.dumps(config))
        shutil.copytree(rmdir / "model", rmdir / "pickled")
        (rmdir / "pickled" / "model.safetensors").rename(rmdir / "pickled" / "pytorch_model.bin")
    run = rmdir / "runs" / "refused"
    capsys.readouterr()
    assert main(["train", "rm.yaml", "--run-dir", str(run), *change]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and len(err.splitlines()) == 1, err
    assert not run.exists()


def test_grpo_names_where_a_reward_model_trains(rmdir, monkeypatch, capsys):
    """A language run asked for a reward model's loss says which model kind trains one."""
    monkeypatch.chdir(rmdir)
    (rmdir / "lm.yaml").write_text(
        "model: {kind: causal_lm, path: model}\n"
        "prompts: {train: train.jsonl, rewards: [numeric_match]}\n"
        "learner: {algo: bradley_terry}\nrollout: {num_workers: 0}\nstop: {iterations: 1}\n"
    )
    assert main(["validate", "lm.yaml"]) == 2
    assert "model.kind=reward_model" in capsys.readouterr().err
