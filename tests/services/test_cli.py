"""The relay command line: validate, bad input as one line with exit 2, local-mode training."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from relay_rl.contracts.metrics import REQUIRED_KEYS
from relay_rl.services.cli import main
from relay_rl.services.runs.metric_keys import catalog
from tests.helpers import train_local

ROOT = Path(__file__).parents[2]


def test_validate_prints_resolved_config(capsys):
    assert main(["validate", str(ROOT / "configs/cartpole_ppo.yaml"), "--set", "learner.lr=0.002"]) == 0
    out = capsys.readouterr().out
    assert "lr: 0.002" in out and "id: CartPole-v1" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["validate", "missing.yaml"], "config file not found"),
        (["validate", "configs/cartpole_ppo.yaml", "--set", "learner.epochs=0"], "learner.epochs"),
        (["validate", "configs/cartpole_ppo.yaml", "--set", "learner"], "expected key.path=value"),
        (
            ["train", "configs/cartpole_ppo.yaml", "--set", "env.id=NoSuchEnv-v9"],
            "not a registered gymnasium env",
        ),
        (["train", "configs/cartpole_ppo.yaml", "--set", "learner.device=tpu"], "learner.device"),
        (
            [
                "train",
                "configs/cartpole_ppo.yaml",
                "--set",
                "model.kind=transformer",
                "--set",
                "model.normalize_obs=false",
            ],
            "token ids (a 1-D integer Box in [-1, 2)), but CartPole-v1 observes a float32",
        ),
        (
            ["train", "configs/reverse_digits_grpo.yaml", "--set", "model.transformer.vocab_size=3"],
            "but relay/ReverseDigits-v0 observes a int64 Box of shape (10,) in [-1, 4]",
        ),
        (["resume", "/nonexistent/run"], "not a run directory"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "relay_rl.services.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_local_mode_trains_writes_metrics_and_checkpoints(tmp_path, capsys):
    run = tmp_path / "run"
    code = train_local(
        "cartpole_ppo.yaml",
        run,
        "learner.buffer_size=512",
        "stop.env_steps=6000",
        "checkpoint.interval=4",
        "metrics.progress=lines",
    )
    assert code == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) >= 10
    # Every key the contract promises on every line, the PPO ones, and nothing undeclared.
    required = {*REQUIRED_KEYS, "value_loss", "explained_variance"}
    assert required <= set(lines[-1])
    assert set(lines[-1]) <= set(catalog().keys)
    assert "startup_s" in lines[0]
    assert [x["iteration"] for x in lines] == list(range(1, len(lines) + 1))
    assert lines[-1]["env_steps"] >= 6000
    assert (run / "config.yaml").is_file()
    ckpts = sorted(p.name for p in (run / "checkpoints").glob("ckpt-*.pt"))
    assert 1 <= len(ckpts) <= 3 and ckpts[-1].endswith(f"{lines[-1]['iteration']:08d}.pt")
    assert "stopped: env_steps" in capsys.readouterr().err


def test_python_dash_m_services_train_is_the_same_entry(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "relay_rl.services.train",
            "configs/cartpole_ppo.yaml",
            "--run-dir",
            str(tmp_path / "r"),
            "--set",
            "rollout.num_workers=0",
            "--set",
            "learner.buffer_size=512",
            "--set",
            "stop.env_steps=512",  # two local-mode updates of 32 x 8 steps
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "r" / "metrics.jsonl").read_text().count("\n") == 2


TIMING_KEYS = {
    "wall_s",
    "env_steps_per_s",
    "learner_samples_per_s",
    "update_s",
    "wait_s",
    "ingest_s",
    "publish_s",
    "learner_busy",
    "startup_s",
    "host_memory_peak_bytes",
    "learner_rss_bytes",
    "learner_heap_in_use_bytes",
    "learner_heap_free_bytes",
    "driver_rss_bytes",
    "driver_heap_in_use_bytes",
    "driver_heap_free_bytes",
    # the machine's readings of the learner's device (learner/device_health.py)
    "device_utilization",
    "device_memory_used_bytes",
    "device_memory_total_bytes",
    "device_temperature_c",
    "device_power_w",
    "eval_s",
}


def test_a_seed_fixes_the_run(tmp_path):
    """Two runs with the same config and seed produce the same metrics, timing aside."""
    runs = []
    for name in ("a", "b"):
        run = tmp_path / name
        assert train_local("pendulum_ppo.yaml", run, "learner.buffer_size=1024", "stop.env_steps=5000") == 0
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        runs.append([{k: v for k, v in x.items() if k not in TIMING_KEYS} for x in lines])
    assert runs[0] == runs[1]


SAME_REFUSAL = [
    ["learner.device=tpu:0"],
    ["env.id=NoSuchEnv-v9"],
    ["learner.algo=a3c"],
    ["model.kind=resnet"],
    ["env.vectorization=envpoool"],
    ["learner.algo=grpo"],
    ["model.kind=transformer"],
    ["model.kind=transformer", "model.normalize_obs=false"],
    ["env.id=tests.rollout_workers.faulty_envs:nothing_here"],
]


@pytest.mark.parametrize("sets", SAME_REFUSAL, ids=lambda s: " ".join(s))
def test_validate_and_train_refuse_the_same_configs_with_the_same_line(sets, tmp_path, capsys):
    """`relay validate` runs exactly the checks `relay train` runs before starting anything."""
    args = [x for kv in sets for x in ("--set", kv)]
    config = str(ROOT / "configs/cartpole_ppo.yaml")
    assert main(["validate", config, *args]) == 2
    validate_err = capsys.readouterr().err.strip()
    run = tmp_path / "run"
    assert main(["train", config, "--run-dir", str(run), *args]) == 2
    train_err = capsys.readouterr().err.strip()
    assert len(validate_err.splitlines()) == 1 and len(train_err.splitlines()) == 1
    assert validate_err.removeprefix("relay validate: ") == train_err.removeprefix("relay train: ")
    assert not run.exists()  # nothing created


def test_help_config_lists_every_leaf_with_default_and_description(capsys):
    from relay_rl.services.runs.config_sections import all_leaves

    assert main(["validate", "--help-config"]) == 0
    out = capsys.readouterr().out
    for path, _, description in all_leaves():
        assert f"\n{path} = " in f"\n{out}" and description in out, path
    assert "learner.algo = ppo" in out and "Choices: ppo, grpo, rloo, reinforce_pp, bradley_terry." in out
    assert "rollout.placement_timeout_s = 300.0" in out
    assert "learner.lm.loss_agg = token_mean" in out and "metrics.mlflow.tracking_uri = (required)" in out
