"""Importing ML-Agents PPO policies: ONNX exports read from the graph's structure (folded
normalizer, no normalizer, a discrete branch with action masks, an LSTM memory), cross-checked
against onnxruntime on the original file, and `.pt` checkpoints with a Policy state dict.

Real exports: tests/services/data/mlagents/*.onnx were written by ML-Agents 1.1.0's own
SimpleActor and ModelSerializer (make_exports.py there says how; `mlagents` pins a Python and
numpy relay does not run, so it is never imported at test time). tests/services/mlagents_like.py
builds more graphs with ML-Agents' structure and exporter settings (opset 9, constant folding on)
for the variations a real file cannot show: scrambled names, a .pt state dict, odd structures.
"""

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from relay_rl.services.cli import main
from relay_rl.services.serving.service import PolicyService, parse_act
from relay_rl.services.tools.handle import DeterministicPolicy, PolicyLoadError
from relay_rl.services.tools.load import load_policy
from tests.services.mlagents_like import export_opset9, randomized

SMALL = dict(obs=8, hidden=64, layers=2)
MLAGENTS_EXPORTS = Path(__file__).parent / "data" / "mlagents"
REAL = ["continuous_normalized", "continuous_plain", "discrete_one_branch", "discrete_cartpole"]


def _onnx_actions(path, obs, masks=None):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {"obs_0": obs}
    if masks is not None:
        feeds["action_masks"] = masks
    name = next(o.name for o in session.get_outputs() if o.name.startswith("deterministic_"))
    return session.run([name], feeds)[0]


def _relay_actions(handle, obs):
    with torch.no_grad():
        return DeterministicPolicy(handle)(torch.from_numpy(obs))[0].numpy()


def _scramble_names(data: bytes) -> bytes:
    """Rename every initializer as some exporters do (onnx::Gemm_17 ...): names carry no meaning."""
    proto = onnx.load_from_string(data)
    renames = {init.name: f"onnx::T_{i}" for i, init in enumerate(proto.graph.initializer)}
    for init in proto.graph.initializer:
        init.name = renames[init.name]
    for node in proto.graph.node:
        node.input[:] = [renames.get(name, name) for name in node.input]
    return proto.SerializeToString()


@pytest.mark.parametrize("scrambled", [False, True])
def test_huggy_with_a_folded_normalizer(tmp_path, scrambled):
    data = export_opset9(randomized())
    names = [i.name for i in onnx.load_from_string(data).graph.initializer]
    assert not any("running_variance" in n for n in names)  # the exporter folded var / steps
    path = tmp_path / "Huggy.onnx"
    path.write_bytes(_scramble_names(data) if scrambled else data)
    handle = load_policy(path)
    assert handle.obs_dim == 59 and handle.model.action.size == 21  # read from the graph
    assert handle.model.normalizer.enabled
    assert handle.model.pi_trunk.net[1].__class__ is torch.nn.SiLU and len(handle.model.pi_trunk.net) == 6
    torch.testing.assert_close(handle.model.log_std.detach(), torch.full((21,), -0.5))
    obs = np.random.default_rng(0).standard_normal((1000, 59)).astype(np.float32) * 100
    want = _onnx_actions(path, obs)
    assert np.abs(_relay_actions(handle, obs) - want).max() <= 1e-5
    assert np.abs(want).max() <= 1.0  # clamp(a, -3, 3) / 3


def test_policy_trained_without_normalization(tmp_path):
    path = tmp_path / "plain.onnx"
    path.write_bytes(export_opset9(randomized(normalize=False, **SMALL)))
    handle = load_policy(path)
    assert not handle.model.normalizer.enabled
    obs = np.random.default_rng(1).standard_normal((500, 8)).astype(np.float32) * 3
    assert np.abs(_relay_actions(handle, obs) - _onnx_actions(path, obs)).max() <= 1e-5


def test_discrete_branch_with_action_masks(tmp_path):
    path = tmp_path / "discrete.onnx"
    path.write_bytes(export_opset9(randomized(branches=(5,), **SMALL)))
    handle = load_policy(path)
    assert handle.model.action.kind == "discrete" and handle.model.action.size == 5
    obs = np.random.default_rng(2).standard_normal((500, 8)).astype(np.float32) * 10
    want = _onnx_actions(path, obs, np.ones((500, 5), np.float32))
    assert want.shape == (500, 1)
    np.testing.assert_array_equal(_relay_actions(handle, obs), want[:, 0])
    assert len(np.unique(want)) > 1  # the check would be empty on a constant policy


def _one_line_refusal(path, capsys) -> str:
    assert main(["verify", str(path), "--dtypes", "float32"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    return err


@pytest.mark.parametrize("branches", [(3, 2), (2, 4, 3)])
def test_several_discrete_branches_import_as_multi_discrete(tmp_path, branches):
    """Each branch's greedy choice, in the graph's order, from one MultiDiscrete head; the import is
    cross-checked against onnxruntime on the file, and the .pt state dict reads the same."""
    model = randomized(branches=branches, **SMALL)
    path = tmp_path / "multi.onnx"
    path.write_bytes(export_opset9(model))
    handle = load_policy(path)
    assert handle.model.action.kind == "multi_discrete" and handle.model.action.nvec == branches
    obs = torch.randn(64, model.obs_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model.deterministic(obs).numpy()
        got = handle.model.deterministic(obs).numpy()
    assert np.array_equal(got, want)
    pt = tmp_path / "multi.pt"
    torch.save({"Policy": model.state_dict()}, pt)
    with torch.no_grad():
        assert np.array_equal(load_policy(pt).model.deterministic(obs).numpy(), want)


def test_unknown_structure_is_refused_in_one_line(tmp_path, capsys):
    proto = onnx.load_from_string(export_opset9(randomized(**SMALL)))
    next(n for n in proto.graph.node if n.op_type == "Sigmoid").op_type = "Softsign"
    path = tmp_path / "odd.onnx"
    path.write_bytes(proto.SerializeToString())
    assert "on the path from obs_0 to the action head" in _one_line_refusal(path, capsys)


def test_a_graph_that_does_not_match_onnxruntime_is_refused(tmp_path, capsys):
    """The structure reads as an argmax branch, but the argmax runs over the batch axis: the
    cross-check against onnxruntime catches what the structural reader cannot."""
    proto = onnx.load_from_string(export_opset9(randomized(branches=(5,), **SMALL)))
    argmax = next(n for n in proto.graph.node if n.op_type == "ArgMax")
    next(a for a in argmax.attribute if a.name == "axis").i = 0
    path = tmp_path / "tampered.onnx"
    path.write_bytes(proto.SerializeToString())
    with pytest.raises(PolicyLoadError, match="differs from onnxruntime"):
        load_policy(path)
    assert "differs from onnxruntime" in _one_line_refusal(path, capsys)


@pytest.mark.parametrize("kw", [{}, dict(normalize=False, **SMALL), dict(branches=(4,), **SMALL)])
def test_pt_checkpoint_with_policy_state_dict(tmp_path, kw):
    model = randomized(seed=1, **kw)
    torch.save({"Policy": model.state_dict()}, tmp_path / "checkpoint.pt")
    handle = load_policy(tmp_path / "checkpoint.pt")
    obs = torch.randn(64, model.obs_size) * 10
    with torch.no_grad():
        want = model.deterministic(obs)
        got = DeterministicPolicy(handle)(obs)[0]
    if model.branches:
        torch.testing.assert_close(got, want[:, 0])
    else:
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


@pytest.mark.parametrize("name", REAL)
def test_real_mlagents_exports_load_and_act_as_onnxruntime_does(name):
    """Normalized (its statistics in initializers the exporter wrote), plain, one discrete branch
    (with its `action_masks` input: all actions allowed)."""
    path = MLAGENTS_EXPORTS / f"{name}.onnx"
    handle = load_policy(path)
    inputs = {i.name: i.shape for i in ort.InferenceSession(str(path)).get_inputs()}
    obs = (np.random.default_rng(1).standard_normal((512, inputs["obs_0"][1])) * 10).astype(np.float32)
    masks = np.ones((512, inputs["action_masks"][1]), np.float32) if "action_masks" in inputs else None
    want = _onnx_actions(path, obs, masks)
    got = _relay_actions(handle, obs)
    if name.startswith("discrete"):
        assert np.array_equal(got.reshape(want.shape), want)
    else:
        assert np.abs(got - want).max() <= 1e-5


def test_real_mlagents_exports_verify_two_branches_included(capsys):
    assert main(["verify", str(MLAGENTS_EXPORTS / "continuous_normalized.onnx")]) == 0
    assert "fingerprint" in capsys.readouterr().out
    assert main(["verify", str(MLAGENTS_EXPORTS / "discrete_two_branches.onnx")]) == 0
    assert "fingerprint" in capsys.readouterr().out
    handle = load_policy(MLAGENTS_EXPORTS / "discrete_two_branches.onnx")
    assert handle.model.action.kind == "multi_discrete" and len(handle.model.action.nvec) == 2


RECURRENT = ["recurrent_discrete", "recurrent_continuous"]


def _memory_steps(path, handle, steps, seed):
    """Greedy actions and memories of `steps` steps of 4 envs, onnxruntime on the ML-Agents file
    (its own recurrent_out fed back as recurrent_in) and relay's import (its own h_out fed back),
    on the same observations."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = {i.name: i.shape for i in session.get_inputs()}
    action = next(o.name for o in session.get_outputs() if o.name.startswith("deterministic_"))
    rng = np.random.default_rng(seed)
    m_ort = np.zeros((4, 1, inputs["recurrent_in"][2]), np.float32)
    h_relay = handle.initial_state(4)
    out = []
    for _ in range(steps):
        obs = (rng.standard_normal((4, inputs["obs_0"][1])) * 3).astype(np.float32)
        feeds = {"obs_0": obs, "recurrent_in": m_ort}
        if "action_masks" in inputs:
            feeds["action_masks"] = np.ones((4, inputs["action_masks"][1]), np.float32)
        want, m_ort = session.run([action, "recurrent_out"], feeds)
        with torch.no_grad():
            got = DeterministicPolicy(handle)(torch.from_numpy(obs), torch.from_numpy(h_relay))
        h_relay = got[-1].numpy()
        out.append((want, got[0].numpy(), m_ort.reshape(4, -1), h_relay))
    return out


@pytest.mark.parametrize("name", RECURRENT)
@pytest.mark.parametrize("suffix", [".onnx", ".pt"])
def test_recurrent_mlagents_policies_step_as_onnxruntime_does(name, suffix):
    """ML-Agents' memory (network_settings.memory: an LSTM after the body, [h | c] carried as
    recurrent_in/recurrent_out) imported from the real export and from the real checkpoint written
    beside it: over 100 steps with each side carrying its own memory, the same greedy actions and
    the same memory (<= 1e-5), and the memory does change the actions."""
    handle = load_policy(MLAGENTS_EXPORTS / f"{name}{suffix}")
    assert handle.recurrent and handle.input_names == ["obs", "h_in"]
    steps = _memory_steps(MLAGENTS_EXPORTS / f"{name}.onnx", handle, 100, seed=5)
    for want, got, m_ort, h_relay in steps:
        if name.endswith("discrete"):
            np.testing.assert_array_equal(got, want[:, 0])
        else:
            assert np.abs(got - want).max() <= 1e-5
        assert np.abs(m_ort - h_relay).max() <= 1e-5
    # the same observation from two memories: a policy that ignored its memory would agree
    obs = torch.ones(2, handle.obs_dim)
    states = torch.from_numpy(np.stack([np.zeros_like(steps[-1][3][0]), steps[-1][3][0]]))
    with torch.no_grad():
        params, _ = handle.model.policy_step({"obs": obs, "h_in": states})
    assert not torch.allclose(params[0], params[1])


@pytest.mark.parametrize("runtime", ["torch", "onnxruntime"])
def test_recurrent_mlagents_exports_verify_and_serve_with_sessions(capsys, runtime):
    """`relay verify` on the recurrent ML-Agents file; served (the service without Ray), a session
    carries the memory between calls as onnxruntime on the file does when fed its own memory."""
    path = MLAGENTS_EXPORTS / "recurrent_continuous.onnx"
    assert main(["verify", str(path)]) == 0
    assert "fingerprint" in capsys.readouterr().out
    service = PolicyService(str(path), runtime=runtime)
    handle = load_policy(path)
    steps = _memory_steps(path, handle, 20, seed=7)
    rng = np.random.default_rng(7)  # the observations _memory_steps drew
    for i, (want, _, _, _) in enumerate(steps):
        obs = (rng.standard_normal((4, 8)) * 3).astype(np.float32)
        body = json.dumps({"obs": obs.tolist(), "session": "s"}).encode()
        answer = service.act([parse_act(body, service.handle)])[0]
        assert answer["state"] == ("new" if i == 0 else "carried")
        assert np.abs(np.array(answer["actions"]) - want).max() <= 1e-5


def test_a_recurrent_graph_that_disagrees_with_its_memory_is_refused(tmp_path):
    """The cross-check compares the memory after the step too: a graph whose recurrent_out is not
    the LSTM's state (here its h and c swapped) is refused in one line, not imported."""
    proto = onnx.load(MLAGENTS_EXPORTS / "recurrent_continuous.onnx")
    concat = next(n for n in proto.graph.node if n.op_type == "Concat" and "lstm" in n.output[0])
    concat.input[:] = [concat.input[1], concat.input[0]]
    path = tmp_path / "swapped.onnx"
    onnx.save(proto, path)
    with pytest.raises(PolicyLoadError, match="differs from onnxruntime"):
        load_policy(path)


def test_a_normalized_mlagents_checkpoint_names_its_normalizer_twice():
    """ML-Agents 1.1.0's checkpoints hold the normalizer under two module paths (the same values):
    one normalizer, not an ambiguity."""
    raw = torch.load(MLAGENTS_EXPORTS / "recurrent_discrete.pt", weights_only=True)["Policy"]
    assert len([k for k in raw if k.endswith("normalizer.running_mean")]) == 2
    handle = load_policy(MLAGENTS_EXPORTS / "recurrent_discrete.pt")
    assert handle.model.normalizer.enabled


@pytest.mark.parametrize("name", [*REAL, "discrete_two_branches"])
def test_real_mlagents_checkpoints_act_as_their_exports(name):
    """The .pt checkpoint ML-Agents' saver writes beside each real export (its normalizer
    registered under two module paths where it has one) loads and acts as the export does on
    onnxruntime."""
    path = MLAGENTS_EXPORTS / f"{name}.onnx"
    handle = load_policy(MLAGENTS_EXPORTS / f"{name}.pt")
    inputs = {i.name: i.shape for i in ort.InferenceSession(str(path)).get_inputs()}
    obs = (np.random.default_rng(2).standard_normal((512, inputs["obs_0"][1])) * 10).astype(np.float32)
    masks = np.ones((512, inputs["action_masks"][1]), np.float32) if "action_masks" in inputs else None
    want, got = _onnx_actions(path, obs, masks), _relay_actions(handle, obs)
    if name.startswith("discrete"):
        assert np.array_equal(got.reshape(want.shape), want)
    else:
        assert np.abs(got - want).max() <= 1e-5
