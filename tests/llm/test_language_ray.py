"""A language run through real Ray actors: the learner actor generates and trains, reward
functions of the user's own module run on CPU reward actors, and a reward that hangs or raises
is counted, said once, and the run goes on."""

from __future__ import annotations

import json

import pytest

from relay_rl.services.cli import main
from tests.lm_helpers import sums_rows, tiny_model_folder, write_jsonl

pytestmark = pytest.mark.ray

USER_REWARDS = '''
import pathlib, time

def flaky(prompts, completions, completion_ids, answer, **kwargs):
    """Hangs on the run's 2nd call and raises on its 4th (counted in a file: actors are replaced)."""
    calls = pathlib.Path("calls.txt")
    n = int(calls.read_text() if calls.exists() else "0") + 1
    calls.write_text(str(n))
    if n == 2:
        time.sleep(60)
    if n == 4:
        raise RuntimeError("judge unavailable")
    assert len(completion_ids) == len(completions)
    return [float("7" in c) for c in completions]
'''


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=4, include_dashboard=False)
    yield
    ray.shutdown()


def test_rewards_on_actors_with_a_hang_and_a_raise(local_ray, tmp_path, monkeypatch, capsys):
    tiny_model_folder(tmp_path / "model")
    write_jsonl(tmp_path / "sums.jsonl", sums_rows())
    (tmp_path / "my_rewards.py").write_text(USER_REWARDS)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(
        "model: {kind: causal_lm, path: model}\n"
        "prompts: {train: sums.jsonl, rewards: ['my_rewards:flaky'], batch_size: 4, max_prompt_tokens: 8,"
        " reward_timeout_s: 3}\n"
        "generation: {max_new_tokens: 6}\n"
        "learner: {group_size: 8, lr: 0.003, device: cpu}\n"
        "rollout: {num_workers: 1, num_cpus_per_worker: 1}\n"
        "stop: {env_steps: 3000}\n"
        "metrics: {progress: none}\n"
    )
    run = tmp_path / "runs" / "r"
    assert main(["train", "run.yaml", "--run-dir", str(run)]) == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    last = lines[-1]
    # One round's 32 completions timed out (its actor was replaced), another's raised.
    assert last["reward_faults_timeout"] == 32 and last["reward_faults_raised"] == 32
    assert last["reward_faults"] == last["reward_faults_timeout"] + last["reward_faults_raised"]
    faulted = [x for x in lines if x["reward_mean"] is None]
    assert len(faulted) == 2 and all(x["policy_loss"] == 0 for x in faulted)  # no reward, no advantage
    err = capsys.readouterr().err
    assert err.count("reward_timeout_s=3") == 1 and err.count("judge unavailable") == 1
