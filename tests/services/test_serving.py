"""The policy service behind `relay serve`, without Ray: request checks, batching, reproducible
sampling, both runtimes, following a run's checkpoints, and `relay serve`'s bad input."""

import json
import shutil
import socket

import numpy as np
import onnxruntime as ort
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_rl.learner.device import DeviceError
from relay_rl.services.cli import main
from relay_rl.services.runs.checkpoints import list_checkpoints
from relay_rl.services.serving import runtimes
from relay_rl.services.serving.service import (
    ActRequest,
    BadRequest,
    IncompatibleCheckpoint,
    PolicyService,
    parse_act,
)
from tests.helpers import hold_back_checkpoints, train_local
from tests.services.mlagents_like import export_opset9, randomized


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    """A short CartPole run with several checkpoints (weights versions)."""
    run = tmp_path_factory.mktemp("cartpole")
    sets = ["learner.buffer_size=512", "stop.env_steps=3072", "checkpoint.interval=2", "checkpoint.keep=5"]
    assert train_local("cartpole_ppo.yaml", run, *sets) == 0
    assert len(list_checkpoints(run / "checkpoints")) >= 2
    return run


@pytest.fixture(scope="module")
def pendulum_ckpt(tmp_path_factory):
    run = tmp_path_factory.mktemp("pendulum")
    assert train_local("pendulum_ppo.yaml", run, "learner.buffer_size=1024", "stop.env_steps=2048") == 0
    return list_checkpoints(run / "checkpoints")[-1]


def _newest(run):
    return str(list_checkpoints(run / "checkpoints")[-1])


def _body(**fields) -> bytes:
    return json.dumps(fields).encode()


# ---- requests -------------------------------------------------------------------------------------
BAD_BODIES = {
    b"not json": "not JSON",
    b"[1, 2]": '"obs"',
    b'{"observations": [0, 0, 0, 0]}': '"obs"',
    b'{"obs": [0, 0, 0]}': "shape [3]",
    b'{"obs": [[0, 0, 0, 0], [0, 0]]}': "ragged",
    b'{"obs": [0, NaN, 0, 0]}': "NaN",
    b'{"obs": [0, 1e999, 0, 0]}': "NaN or inf",
    b'{"obs": ["a", 0, 0, 0]}': "numbers",
    b'{"obs": [0, 0, 0, 0], "deterministic": "yes"}': '"deterministic"',
    b'{"obs": [0, 0, 0, 0], "seed": -1}': '"seed"',
    b'{"obs": [0, 1' + b"0" * 400 + b", 0, 0]}": "too large for float64",
    b'{"obs": [0, 0, 0, 0], "seed": 1.5}': '"seed"',
    b'{"obs": []}': "shape",
    b"\xff\xfe": "not JSON",
}


@pytest.mark.parametrize("body", list(BAD_BODIES))
def test_bad_requests_are_400_with_one_line(cartpole_run, body):
    service = PolicyService(_newest(cartpole_run))
    with pytest.raises(BadRequest) as err:
        parse_act(body, service.handle)
    assert err.value.status == 400 and BAD_BODIES[body] in str(err.value) and "\n" not in str(err.value)


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=200),
        st.recursive(
            st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
            lambda c: (
                st.lists(c, max_size=5)
                | st.dictionaries(st.sampled_from(["obs", "seed", "deterministic", "x"]), c, max_size=4)
            ),
            max_leaves=20,
        ).map(lambda v: json.dumps(v).encode()),
    )
)
def test_any_body_is_a_request_or_a_400(body):
    """Whatever a client sends: a checked request, or BadRequest(400), never another exception."""
    try:
        request = parse_act(body, HANDLE)
    except BadRequest as err:
        assert err.status == 400
    else:
        assert request.obs["obs"].shape[1:] == (4,) and np.isfinite(request.obs["obs"]).all()


HANDLE = None


@pytest.fixture(autouse=True, scope="module")
def _handle_for_hypothesis(cartpole_run):
    global HANDLE
    HANDLE = PolicyService(_newest(cartpole_run)).handle


# ---- answers --------------------------------------------------------------------------------------
def test_a_batch_answers_each_request_as_alone(pendulum_ckpt):
    service = PolicyService(str(pendulum_ckpt))
    rng = np.random.default_rng(0)
    requests = [
        ActRequest(rng.standard_normal((k, 3)), deterministic=bool(k % 2), seed=k) for k in (1, 3, 2, 5, 4)
    ]
    requests[-1].seeded = True  # sampled with the client's seed: a forward pass of its own
    together = service.act(requests)
    assert [a["batch_rows"] for a in together] == [11, 11, 11, 11, 4]
    assert [a["batch_requests"] for a in together] == [4, 4, 4, 4, 1]
    for request, answer in zip(requests, together, strict=True):
        alone = np.array(service.act([request])[0]["actions"])
        assert np.array(answer["actions"]).shape == alone.shape == (request.rows, 1)
        # Kernels round differently at other batch sizes (an ulp); seeded requests never share.
        np.testing.assert_allclose(np.array(answer["actions"]), alone, atol=1e-6, rtol=0)
    assert together[-1]["actions"] == service.act(requests[-1:])[0]["actions"]


def test_seeded_sampling_is_bit_for_bit_and_differs_from_greedy(pendulum_ckpt):
    service = PolicyService(str(pendulum_ckpt))
    obs = np.random.default_rng(1).standard_normal((16, 3))

    def seeded(seed):
        return parse_act(_body(obs=obs.tolist(), deterministic=False, seed=seed), service.handle)

    first = service.act([seeded(7)])[0]["actions"]
    crowd = [ActRequest(np.ones((5, 3)), deterministic=False) for _ in range(3)]
    again = service.act([*crowd, seeded(7)])[-1]["actions"]  # the same bits in a crowd
    other = service.act([seeded(8)])[0]["actions"]
    greedy = service.act([ActRequest(obs, deterministic=True)])[0]["actions"]
    assert first == again and first != other and first != greedy


@pytest.mark.parametrize("which", ["cartpole", "pendulum"])
def test_onnxruntime_answers_as_torch(which, cartpole_run, pendulum_ckpt):
    path = _newest(cartpole_run) if which == "cartpole" else str(pendulum_ckpt)
    torch_service = PolicyService(path, runtime="torch", device="cpu")
    ort_service = PolicyService(path, runtime="onnxruntime", device="cpu")
    assert ort_service.metadata()["runtime"] == "onnxruntime" and ort_service.metadata()["device"] == "cpu"
    dim = torch_service.handle.obs_dim
    obs = np.random.default_rng(2).standard_normal((64, dim))
    for deterministic in (True, False):
        request = [ActRequest(obs, deterministic=deterministic, seed=3)]
        a = np.array(torch_service.act(request)[0]["actions"])
        b = np.array(ort_service.act(request)[0]["actions"])
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_mlagents_export_is_served_as_onnxruntime_runs_it(tmp_path):
    path = tmp_path / "Huggy.onnx"
    path.write_bytes(export_opset9(randomized()))
    service = PolicyService(str(path), runtime="onnxruntime", device="cpu")
    meta = service.metadata()
    assert meta["obs_shape"] == [59] and meta["action"] == {"kind": "continuous", "size": 21}
    obs = np.random.default_rng(3).standard_normal((32, 59)).astype(np.float32) * 50
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        ["deterministic_continuous_actions"], {"obs_0": obs}
    )[0]
    got = np.array(service.act([ActRequest(obs.astype(np.float64))])[0]["actions"])
    assert np.abs(got - want).max() <= 1e-5


def test_follow_swaps_in_a_newer_checkpoint(cartpole_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(cartpole_run, run)
    held = tmp_path / "held"
    hold_back_checkpoints(run, held)
    service = PolicyService(str(run), follow=True)
    first, first_print = service.served.version, service.metadata()["fingerprint"]
    assert service.refresh() is False
    newest = sorted(held.iterdir())[-1]
    newest.rename(run / "checkpoints" / newest.name)
    assert service.refresh() is True
    assert service.served.version > first and service.served.source == newest.name
    assert service.metadata()["fingerprint"] != first_print  # the new weights' fingerprint
    answer = service.act([ActRequest(np.zeros((1, 4)))])[0]
    assert answer["weights_version"] == service.served.version


def test_follow_keeps_serving_when_a_checkpoint_of_another_interface_lands(
    cartpole_run, pendulum_ckpt, tmp_path
):
    """A Pendulum checkpoint copied into a CartPole run: every later request would fail; it is
    refused once and the CartPole policy goes on answering."""
    run = tmp_path / "run"
    shutil.copytree(cartpole_run, run)
    service = PolicyService(str(run), follow=True)
    served = service.served.source
    shutil.copy(pendulum_ckpt, run / "checkpoints" / "ckpt-99999999.pt")
    with pytest.raises(IncompatibleCheckpoint, match=r"not swapping in ckpt-99999999\.pt: it reads"):
        service.refresh()
    assert service.refresh() is False  # said once, not every poll
    assert service.served.source == served
    assert len(service.act([ActRequest(np.zeros((1, 4)))])[0]["actions"]) == 1


# ---- devices (stand-ins: no GPU or NPU on this machine) --------------------------------------------
def test_onnxruntime_providers_for_each_device(monkeypatch):
    """Stand-in for hosts with onnxruntime-gpu / onnxruntime-cann: the provider list is faked."""
    monkeypatch.setattr(
        ort, "get_available_providers", lambda: ["CANNExecutionProvider", "CPUExecutionProvider"]
    )
    assert runtimes.ort_providers("npu") == ["CANNExecutionProvider", "CPUExecutionProvider"]
    assert runtimes.ort_providers("auto") == ["CANNExecutionProvider", "CPUExecutionProvider"]
    with pytest.raises(DeviceError, match="onnxruntime-gpu"):
        runtimes.ort_providers("cuda")
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert runtimes.ort_providers("auto") == ["CPUExecutionProvider"]
    with pytest.raises(DeviceError, match="onnxruntime-cann"):
        runtimes.ort_providers("npu:1")


def test_replicas_ask_ray_for_the_device():
    from relay_rl.services.serving.app import ServeArgs, replica_options

    assert replica_options(ServeArgs(model="m.pt", device="npu")) == {
        "num_cpus": 1.0,
        "resources": {"NPU": 1.0},
    }
    assert replica_options(ServeArgs(model="m.pt", device="cuda:0")) == {"num_cpus": 1.0, "num_gpus": 1.0}
    assert replica_options(ServeArgs(model="m.pt", device="cpu")) == {"num_cpus": 1.0}


# ---- relay serve: bad input is one line, exit 2, nothing started -----------------------------------
def _busy_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


@pytest.mark.parametrize(
    "args, says",
    [
        (["no/such.pt"], "no such policy file"),
        (["{run}"], "needs --follow"),
        (["{ckpt}", "--follow"], "--follow serves a run directory"),
        (["{empty}", "--follow"], "holds no checkpoint"),
        (["{ckpt}", "--replicas", "0"], "--replicas 0"),
        (["{ckpt}", "--runtime", "tensorflow"], "--runtime 'tensorflow'"),
        (["{ckpt}", "--max-batch-size", "0"], "--max-batch-size 0"),
        (["{ckpt}", "--batch-wait-ms", "nan"], "--batch-wait-ms"),
        (["{ckpt}", "--device", "cuda"], "cuda"),
        (["{ckpt}", "--device", "tpu"], "tpu"),
        (["{ckpt}", "--runtime", "onnxruntime", "--device", "npu"], "onnxruntime-cann"),
        (["{ckpt}", "--port", "{busy}"], "cannot listen"),
        (["{ckpt}", "--port", "70000"], "not a port number"),
        (["{ckpt}", "--address", "127.0.0.1:1"], "cannot reach"),
        (["{notapolicy}"], "not a relay checkpoint"),
        (["{nan}"], "the weights are not finite ('pi_head.weight'"),
    ],
)
def test_relay_serve_bad_input(args, says, cartpole_run, tmp_path, capsys):
    import ray

    busy = _busy_port()
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    (tmp_path / "junk.pt").write_bytes(b"\x00" * 64)
    torch.save({"weights": [1, 2]}, tmp_path / "notapolicy.pt")
    spoiled = torch.load(_newest(cartpole_run), weights_only=True)
    spoiled["learner"]["model"]["pi_head.weight"][0, 0] = float("nan")
    torch.save(spoiled, tmp_path / "nan.pt")
    values = {
        "run": str(cartpole_run),
        "ckpt": _newest(cartpole_run),
        "empty": str(tmp_path / "empty"),
        "busy": str(busy.getsockname()[1]),
        "notapolicy": str(tmp_path / "notapolicy.pt"),
        "nan": str(tmp_path / "nan.pt"),
    }
    argv = ["serve", *(a.format(**values) for a in args)]
    try:
        code = main(argv)
    except SystemExit as exit:  # argparse's own refusals
        code = exit.code
    finally:
        busy.close()
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert says in err and err.count("\n") == 0, err
    assert not ray.is_initialized()  # nothing started


def test_follow_passes_over_a_torn_newest_checkpoint(cartpole_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(cartpole_run, run)
    good = list_checkpoints(run / "checkpoints")[-1]
    (run / "checkpoints" / "ckpt-99999999.pt").write_bytes(b"torn" * 10)
    service = PolicyService(str(run), follow=True)
    assert service.served.source == good.name
    assert service.metadata()["fingerprint"] == service.served.fingerprint


def test_a_request_the_policy_cannot_answer_is_never_a_500(pendulum_ckpt, monkeypatch):
    """A runtime whose actions come out non-finite answers 422 for that request, one that raises a
    503 naming why; neither is a bare 500. (The runtime is replaced: finite weights, refused at load
    otherwise, give finite actions for any finite observation a request may carry.)"""
    service = PolicyService(str(pendulum_ckpt))
    request = parse_act(json.dumps({"obs": [[1.0, 0.0, 0.1]]}).encode(), service.handle)
    assert "actions" in service.act([request])[0]
    runtime = service.served.runtime
    monkeypatch.setattr(runtime, "act", lambda obs, det, noise: (np.full((1, 1), np.nan, np.float32), None))
    (answer,) = service.act([request])
    assert answer["_status"] == 422 and "not finite" in answer["error"]

    def broken(*_args):
        raise RuntimeError("device lost")

    monkeypatch.setattr(runtime, "act", broken)
    (answer,) = service.act([request])
    assert answer["_status"] == 503 and "RuntimeError: device lost" in answer["error"]
