"""`relay export` and `relay verify` on trained CartPole (discrete), Pendulum (continuous) and
ReverseDigits (token transformer) policies."""

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from relay_rl.services.cli import main
from relay_rl.services.tools import export as export_mod
from relay_rl.services.tools.handle import DeterministicPolicy
from relay_rl.services.tools.load import load_policy
from tests.helpers import train_local

ROOT = Path(__file__).parents[2]


SHORT_RUNS = {
    "cartpole_ppo": ["learner.buffer_size=1024", "stop.env_steps=3000"],
    "pendulum_ppo": ["learner.buffer_size=1024", "stop.env_steps=3000"],
    "reverse_digits_grpo": ["learner.buffer_size=320", "stop.env_steps=1600"],
    # The Nature CNN over uint8 frames: exported with a uint8 input, scaled inside the graph.
    "breakout_ppo": [
        "env.num_envs=2",
        "rollout.rollout_len=16",
        "learner.buffer_size=32",
        "learner.batch_size=32",
        "stop.env_steps=64",
    ],
}


@pytest.fixture(scope="module", params=list(SHORT_RUNS))
def checkpoint(request, tmp_path_factory):
    run = tmp_path_factory.mktemp(request.param)
    assert train_local(f"{request.param}.yaml", run, *SHORT_RUNS[request.param]) == 0
    return sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1]


def test_export_writes_a_checked_onnx_with_documented_names(checkpoint, tmp_path, capsys):
    out = tmp_path / "policy.onnx"
    assert main(["export", str(checkpoint), "--format", "onnx", "--out", str(out)]) == 0
    assert "checked on 2000 observations" in capsys.readouterr().out
    graph = onnx.load(str(out)).graph
    assert [i.name for i in graph.input] == ["obs"]
    names = [o.name for o in graph.output]
    assert names in (["action", "mean", "std"], ["action", "logits"])
    handle = load_policy(checkpoint)
    if handle.config.model.normalize_obs:
        names_init = {i.name for i in graph.initializer}
        assert {"model.normalizer.mean", "model.normalizer.var_sum", "model.normalizer.steps"} <= names_init
        assert all(i.data_type == onnx.TensorProto.FLOAT for i in graph.initializer if "normalizer" in i.name)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for batch in (1, 37):  # dynamic batch axis
        obs = handle.synthetic_obs(batch, torch.Generator().manual_seed(batch))["obs"].numpy()
        got = session.run(None, {"obs": obs})
        with torch.no_grad():
            want = DeterministicPolicy(handle)(torch.from_numpy(obs))
        for g, w in zip(got, want, strict=True):
            assert g.shape == tuple(w.shape) and np.abs(g - w.numpy()).max() <= 1e-5


def test_export_fails_loudly_and_writes_nothing(checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(export_mod, "TOLERANCE", -1.0)
    out = tmp_path / "bad.onnx"
    assert main(["export", str(checkpoint), "--out", str(out)]) == 1
    assert "onnxruntime differs from torch" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob("*.tmp"))


def test_verify_table_fingerprint_and_latency(checkpoint, tmp_path, capsys):
    assert main(["verify", str(checkpoint), "--dtypes", "float32,float16", "--batch", "32"]) in (0, 1)
    # (verify's latency table runs 220 forward passes per runtime and batch: small batches here)
    first = capsys.readouterr().out
    assert "float32 |   1.000000 |   0.00e+00 | pass" in first
    assert "torch cpu |    32" in first and "onnxruntime cpu |     1" in first
    fp = next(line for line in first.splitlines() if line.startswith("fingerprint"))
    main(["verify", str(checkpoint), "--dtypes", "float32", "--batch", "8"])
    assert fp in capsys.readouterr().out  # identical across runs
    out = tmp_path / "p.onnx"
    main(["export", str(checkpoint), "--out", str(out)])
    main(["verify", str(out), "--dtypes", "float32", "--batch", "8"])
    assert fp.split(": ")[1] in capsys.readouterr().out  # and for the exported graph


def test_verify_exits_1_when_a_dtype_fails(checkpoint, capsys):
    assert main(["verify", str(checkpoint), "--dtypes", "float16", "--max-abs", "0", "--batch", "8"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_verify_bad_input(tmp_path, capsys):
    assert main(["verify", str(tmp_path / "missing.pt")]) == 2
    junk = tmp_path / "junk.onnx"
    junk.write_text("not onnx")
    assert main(["verify", str(junk)]) == 2
    assert main(["verify", str(junk), "--dtypes", "float64"]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "not an ONNX model" in err and "--dtypes" in err


def test_metrics_of_amp_training_on_cpu(tmp_path):
    """bf16 autocast on the CPU trains; normalizer statistics stay float32 in the checkpoint."""
    run = tmp_path / "amp"
    assert (
        train_local(
            "cartpole_ppo.yaml", run, "learner.buffer_size=512", "learner.use_amp=true", "stop.env_steps=4000"
        )
        == 0
    )
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(x["policy_loss"]) for x in lines) and lines[-1]["amp_skipped_steps"] == 0
    state = torch.load(sorted((run / "checkpoints").glob("*.pt"))[-1], weights_only=True)
    assert state["learner"]["model"]["normalizer.var_sum"].dtype == torch.float32
