"""Importing an ML-Agents-shaped PPO policy (ONNX at opset 9, and a `.pt` with a Policy state dict).

The `mlagents` package does not install on this Python, so tests/services/mlagents_like.py builds a
graph with exactly ML-Agents' structure and names (Huggy: 59 obs, 21 actions, 3 SiLU layers of 512).
"""

import numpy as np
import onnx
import onnxruntime as ort
import torch

from services.cli import main
from services.tools.handle import DeterministicPolicy
from services.tools.load import load_policy
from tests.services.mlagents_like import export_opset9, randomized


def test_onnx_import_reproduces_onnxruntimes_deterministic_actions(tmp_path):
    path = tmp_path / "Huggy.onnx"
    path.write_bytes(export_opset9(randomized()))
    assert onnx.load(str(path)).opset_import[0].version == 9
    handle = load_policy(path)
    assert handle.obs_dim == 59 and handle.model.action.size == 21  # read from the graph
    assert handle.model.pi_trunk.net[1].__class__ is torch.nn.SiLU and len(handle.model.pi_trunk.net) == 6
    obs = np.random.default_rng(0).standard_normal((1000, 59)).astype(np.float32) * 100
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = session.run(["deterministic_continuous_actions"], {"obs_0": obs})[0]
    with torch.no_grad():
        got = DeterministicPolicy(handle)(torch.from_numpy(obs))[0].numpy()
    assert np.abs(got - want).max() <= 1e-5
    assert np.abs(want).max() <= 1.0  # clamp(a, -3, 3) / 3


def test_pt_checkpoint_with_policy_state_dict(tmp_path):
    model = randomized(seed=1)
    torch.save({"Policy": model.state_dict()}, tmp_path / "checkpoint.pt")
    handle = load_policy(tmp_path / "checkpoint.pt")
    obs = torch.randn(64, 59) * 10
    with torch.no_grad():
        want = model(obs)[4]
        got = DeterministicPolicy(handle)(obs)[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_relay_verify_runs_on_the_mlagents_graph(tmp_path, capsys):
    path = tmp_path / "Huggy.onnx"
    path.write_bytes(export_opset9(randomized()))
    code = main(["verify", str(path), "--dtypes", "float32,bfloat16", "--batch", "64"])
    out = capsys.readouterr().out
    assert "ML-Agents ONNX Huggy.onnx  obs_dim=59" in out
    assert "float32 |   1.000000 |   0.00e+00 | pass" in out
    assert "onnxruntime cpu |    64" in out
    assert code in (0, 1) and ("FAIL" in out) == (code == 1)
