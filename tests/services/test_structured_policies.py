"""Every space through every place a policy goes: checkpoints of short runs on real envs with
structured spaces (Taxi's Discrete observations and info masks, MiniGrid's Dict, relay's own Dict +
MultiDiscrete with an obs mask, MultiBinary, a Tuple with a 2-D Box action, Discrete(3, start=1),
and two of its choices kept by env.actions)
go through `relay export` (one named input per leaf plus the mask), onnxruntime, `relay verify`
(of the checkpoint and of the ONNX file, which the importer reads back and cross-checks), and the
serving service (JSON trees, both runtimes, 400 naming the bad leaf)."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_rl.policy.actor_critic import fields_to_numpy, fields_to_torch
from relay_rl.services.cli import main
from relay_rl.services.runs.checkpoints import list_checkpoints
from relay_rl.services.serving.service import BadRequest, PolicyService, parse_act
from relay_rl.services.tools.handle import DeterministicPolicy
from relay_rl.services.tools.load import load_policy
from tests.helpers import train_local

ENVS = "tests.rollout_workers.structured_envs"
RUNS = {
    "taxi": ["env.id=Taxi-v4"],
    "minigrid": ["env.id=MiniGrid-DoorKey-5x5-v0"],
    "pick": [f"env.id={ENVS}:PickEnv"],
    "bits": [f"env.id={ENVS}:BitsEnv"],
    "matrix": [f"env.id={ENVS}:MatrixEnv"],
    "start": [f"env.id={ENVS}:StartEnv"],
    "kept": [f"env.id={ENVS}:StartEnv", "env.actions=[3, 1]"],
}
# One request body per run: a tree (or a lone leaf), in the env's own values.
BODIES = {
    "taxi": {"obs": 17, "action_mask": [1, 0, 1, 0, 0, 0]},
    "minigrid": {"obs": {"image": np.full((7, 7, 3), 2).tolist(), "direction": 3}},
    "pick": {"obs": {"target": 2, "step": 5, "pos": [0.1, -0.3]}, "action_mask": [1, 1, 1, 0, 1, 1, 0]},
    "bits": {"obs": [1, 0, 0, 1]},
    "matrix": {"obs": [[0.5, -0.2, 0.1], 1]},
    "start": {"obs": [0.0]},
    "kept": {"obs": [0.0]},
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for name, sets in RUNS.items():
        run = tmp_path_factory.mktemp(name)
        common = [
            "env.num_envs=4",
            "rollout.rollout_len=32",
            "learner.buffer_size=128",
            "learner.batch_size=64",
        ]
        assert (
            train_local(
                "cartpole_ppo.yaml",
                run,
                *sets,
                *common,
                "stop.env_steps=256",
                "stop.episode_return_mean=null",
            )
            == 0
        )
        out[name] = list_checkpoints(run / "checkpoints")[-1]
    return out


@pytest.mark.parametrize("name", list(RUNS))
def test_export_names_an_input_per_leaf_and_onnxruntime_agrees(checkpoints, tmp_path, name):
    out = tmp_path / f"{name}.onnx"
    assert main(["export", str(checkpoints[name]), "--out", str(out)]) == 0
    handle = load_policy(checkpoints[name])
    graph = onnx.load(str(out)).graph
    assert [i.name for i in graph.input] == handle.input_names
    if handle.env.action_mask is not None:
        assert handle.input_names[-1] == "action_mask"
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for batch in (1, 29):  # dynamic batch axis
        x = handle.as_input(
            fields_to_numpy(handle.synthetic_obs(batch, torch.Generator().manual_seed(batch)))
        )
        got = session.run(None, x)
        t = fields_to_torch(x)
        with torch.no_grad():
            want = DeterministicPolicy(handle)(*(t[n] for n in handle.input_names))
        for g, w in zip(got, want, strict=True):
            assert g.shape == tuple(w.shape) and np.abs(g.astype(np.float64) - w.numpy()).max() <= 1e-5
    # the ONNX file reads back (cross-checked against onnxruntime on load) and verifies
    assert main(["verify", str(out), "--dtypes", "float32,bfloat16"]) == 0
    assert main(["verify", str(checkpoints[name]), "--dtypes", "float32"]) == 0


def test_exported_actions_are_the_envs_own(checkpoints, tmp_path):
    """`action` of the graph is what the env takes: Discrete(3, start=1) answers 1..3, a 2-D Box
    answers [B, 2, 2], and a masked choice is never the greedy one."""
    for name, check in {
        "start": lambda a: set(np.unique(a)) <= {1, 2, 3},
        "kept": lambda a: set(np.unique(a)) <= {1, 3},  # env.actions=[3, 1]: never 2
        "matrix": lambda a: a.shape[1:] == (2, 2),
        "pick": lambda a: (a[:, 0] >= 1).all() and (a[:, 0] <= 3).all() and (a[:, 1] >= -1).all(),
    }.items():
        out = tmp_path / f"{name}.onnx"
        assert main(["export", str(checkpoints[name]), "--out", str(out)]) == 0
        handle = load_policy(out)
        x = handle.as_input(fields_to_numpy(handle.synthetic_obs(64, torch.Generator().manual_seed(0))))
        action = ort.InferenceSession(str(out)).run(["action"], x)[0]
        assert check(action), (name, action[:4])
        if name == "pick":
            mask = x["action_mask"][:, 3:]
            second = action[:, 1] + 1  # the second component's choice from 0
            allowed = mask[np.arange(64), second] | ~mask.any(1)
            assert allowed.all()


@pytest.mark.parametrize("runtime", ["torch", "onnxruntime"])
@pytest.mark.parametrize("name", list(RUNS))
def test_the_service_answers_json_trees_with_the_envs_actions(checkpoints, name, runtime):
    service = PolicyService(str(checkpoints[name]), runtime=runtime)
    body = BODIES[name]
    request = parse_act(json.dumps(body).encode(), service.handle)
    answer = service.act([request])[0]["actions"]
    assert len(answer) == 1
    sampled = service.act(
        [parse_act(json.dumps({**body, "deterministic": False, "seed": 3}).encode(), service.handle)]
    )
    assert sampled == service.act(
        [parse_act(json.dumps({**body, "deterministic": False, "seed": 3}).encode(), service.handle)]
    )
    if name == "taxi":
        assert answer[0] in (0, 2)  # the only two the mask allows
        assert all(a[0] in (0, 2) for a in [sampled[0]["actions"]])
    if name == "start":
        assert answer[0] in (1, 2, 3)
    if name == "kept":
        assert answer[0] in (1, 3) and sampled[0]["actions"][0] in (1, 3)
    if name == "matrix":
        assert np.asarray(answer).shape == (1, 2, 2)
    meta = service.metadata()
    assert meta["action_mask"] == (service.handle.env.action_mask is not None)
    assert [leaf["path"] for leaf in meta["obs_leaves"]] == [leaf.path for leaf in service.handle.env.leaves]


def test_both_runtimes_answer_alike(checkpoints):
    for name in RUNS:
        a = PolicyService(str(checkpoints[name]), runtime="torch")
        b = PolicyService(str(checkpoints[name]), runtime="onnxruntime")
        for seed in range(3):
            body = json.dumps({**BODIES[name], "deterministic": bool(seed % 2), "seed": seed}).encode()
            ra, rb = a.act([parse_act(body, a.handle)])[0], b.act([parse_act(body, b.handle)])[0]
            np.testing.assert_allclose(
                np.asarray(ra["actions"], float), np.asarray(rb["actions"], float), atol=1e-4
            )


BAD_TREES = {
    "minigrid": [
        ({"obs": {"direction": 3}}, '"obs/image" is missing'),
        (
            {"obs": {"image": np.full((7, 7, 3), 2).tolist(), "direction": 4}},
            '"obs/direction" holds whole numbers in [0, 3]',
        ),
        ({"obs": {"image": np.full((7, 7, 2), 2).tolist(), "direction": 1}}, '"obs/image" has shape'),
        (
            {"obs": {"image": np.full((7, 7, 3), 300).tolist(), "direction": 1}},
            '"obs/image" holds whole numbers in [0, 255]',
        ),
        ({"obs": [1, 2]}, '"obs/direction" is missing'),
        ({"obs": 3}, "an object of the observation's leaves"),
        ({"obs": {"image": np.full((2, 7, 7, 3), 2).tolist(), "direction": 1}}, "different numbers of rows"),
        (
            {"obs": {"image": np.full((7, 7, 3), 2).tolist(), "direction": 1}, "action_mask": [1]},
            "no action masks",
        ),
    ],
    "pick": [
        ({"obs": {"target": 2, "step": 1, "pos": [0, 0]}}, '"obs/step" holds whole numbers in [2, 9]'),
        ({"obs": {"target": 2, "step": 3, "pos": [0, 0]}, "action_mask": [1, 1]}, '"action_mask" has shape'),
        (
            {"obs": {"target": 2, "step": 3, "pos": [0, 0]}, "action_mask": [2, 1, 1, 1, 1, 1, 1]},
            '"action_mask" holds whole numbers',
        ),
        ({"obs": {"target": 2, "step": 3, "pos": [0, "x"]}}, '"obs/pos" is not an array of numbers'),
    ],
    "taxi": [({"obs": 500}, '"obs" holds whole numbers in [0, 499]'), ({"obs": [1.5]}, "whole numbers")],
}


@pytest.mark.parametrize(
    "name, body, message", [(n, b, m) for n, cases in BAD_TREES.items() for b, m in cases]
)
def test_bad_trees_are_400_naming_the_leaf(checkpoints, name, body, message):
    handle = PolicyService(str(checkpoints[name])).handle
    with pytest.raises(BadRequest) as err:
        parse_act(json.dumps(body).encode(), handle)
    assert err.value.status == 400 and message in str(err.value), str(err.value)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers(-3, 600) | st.text(max_size=4),
    lambda c: (
        st.lists(c, max_size=8)
        | st.dictionaries(
            st.sampled_from(["image", "direction", "target", "step", "pos", "0", "x"]), c, max_size=4
        )
    ),
    max_leaves=30,
)


@pytest.mark.parametrize("name", ["minigrid", "pick", "matrix"])
def test_any_tree_is_a_request_or_a_400(checkpoints, name):
    """Whatever tree a client sends: checked input fields in range, or BadRequest(400)."""
    handle = PolicyService(str(checkpoints[name])).handle

    @settings(max_examples=150, deadline=None)
    @given(obs=JSON_VALUES, mask=st.none() | JSON_VALUES)
    def check(obs, mask):
        body = {"obs": obs} if mask is None else {"obs": obs, "action_mask": mask}
        try:
            request = parse_act(json.dumps(body).encode(), handle)
        except BadRequest as err:
            assert err.status == 400 and "\n" not in str(err)
            return
        assert set(request.obs) == set(handle.input_names)
        for leaf in handle.env.leaves:
            arr = request.obs[leaf.field]
            assert arr.shape[1:] == leaf.shape and arr.dtype == leaf.storage_dtype
            if leaf.nvec:
                assert (arr >= 0).all() and (arr < np.asarray(leaf.nvec).reshape(leaf.shape)).all()

    check()
