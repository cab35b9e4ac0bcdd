"""A language learner sharded over two ranks with torch's FSDP2 (gloo on this CPU), on a real
local Ray: the learner group places and joins the ranks, each samples and trains its whole groups
of every round, and the run is the run one learner makes (the same completions, the same weights
to float tolerance), its checkpoint resumable at either N."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from relay_rl.services.cli import main
from relay_rl.services.runs.checkpoints import load_newest_valid
from tests.lm_helpers import sums_rows, tiny_model_folder, write_jsonl

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False)
    yield
    ray.shutdown()


def _run(folder: Path, name: str, *sets: str) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """`relay train` of the tiny model for 5 iterations with CPU-drawn noise: its metrics lines and
    its final checkpoint's weights."""
    run = folder / "runs" / name
    args = ["train", "run.yaml", "--run-dir", str(run)]
    for kv in sets:
        args += ["--set", kv]
    assert main(args) == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    _, ckpt = load_newest_valid(run / "checkpoints")
    return lines, ckpt.learner["model"]


def test_two_fsdp_ranks_train_what_one_learner_does(local_ray, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny_model_folder(tmp_path / "model")
    write_jsonl(tmp_path / "sums.jsonl", sums_rows())
    (tmp_path / "run.yaml").write_text(
        "model: {kind: causal_lm, path: model}\n"
        "prompts: {train: sums.jsonl, max_prompt_tokens: 8, rewards: ['regex:7'], batch_size: 4, seed: 3}\n"
        "generation: {max_new_tokens: 6, noise: cpu}\n"
        "learner: {group_size: 4, lr: 0.003, device: cpu, use_amp: false, kl_coef: 0.05, num_cpus: 1}\n"
        "rollout: {num_workers: 1, num_cpus_per_worker: 1}\n"
        "checkpoint: {interval: 5}\n"
        "stop: {iterations: 5, env_steps: null}\n"
        "metrics: {progress: none}\n"
    )
    one, w1 = _run(tmp_path, "one")
    two, w2 = _run(tmp_path, "two", "learner.num_learners=2")
    assert len(one) == len(two) == 5
    # the same completions: their rewards and lengths, round by round
    for a, b in zip(one, two, strict=True):
        assert a["reward_mean"] == b["reward_mean"] and a["completion_len_mean"] == b["completion_len_mean"]
        assert a["policy_loss"] == pytest.approx(b["policy_loss"], abs=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    assert set(w1) == set(w2)
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) < 1e-6  # 1.2e-7 measured
    # each rank holds about half the parameters; the whole model is the one learner's
    assert two[-1]["model_param_bytes"] == one[-1]["model_param_bytes"]
    assert two[-1]["learner_param_bytes"] <= 0.55 * one[-1]["learner_param_bytes"]
    # the memory estimate's weights term is what a rank measures holding (within 20%)
    from relay_rl.contracts.config import load_config
    from relay_rl.services.driver.families.language import memory_estimate

    for n, lines in ((1, one), (2, two)):
        est = memory_estimate(load_config("run.yaml", [f"learner.num_learners={n}"]))
        assert abs(est.weights - lines[-1]["learner_param_bytes"]) <= 0.2 * lines[-1]["learner_param_bytes"]
    # the sharded run resumes at N=1 from its whole-tensor checkpoint, and goes on learning
    assert (
        main(
            [
                "resume",
                str(tmp_path / "runs" / "two"),
                "--set",
                "learner.num_learners=1",
                "--set",
                "stop.iterations=7",
            ]
        )
        == 0
    )
    lines = (tmp_path / "runs" / "two" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["iteration"] for x in lines] == list(range(1, 8))
