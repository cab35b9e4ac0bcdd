"""A recurrent policy served with per-client sessions (the service without Ray; the Ray Serve path
is in tests/integration/test_serve.py): the replica carries each session's state between calls as
the policy steps it, says what the state was in every answer, starts over on `"reset": true`,
refuses what it cannot carry, and reports expiry and swapped weights instead of hiding them."""

import json
import shutil

import numpy as np
import pytest
import torch

from relay_rl.policy.actor_critic import STATE
from relay_rl.services.runs.checkpoints import list_checkpoints
from relay_rl.services.serving.service import BadRequest, PolicyService, parse_act
from tests.helpers import hold_back_checkpoints, train_local

OBS = [[0.01, 0.02], [-0.03, 0.04]]


@pytest.fixture(scope="module")
def novel_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("novel")
    sets = ["stop.env_steps=2048", "learner.buffer_size=256", "checkpoint.interval=2", "checkpoint.keep=5"]
    assert train_local("cartpole_novel_lstm_ppo.yaml", run, *sets) == 0
    return run


def _newest(run):
    return str(list_checkpoints(run / "checkpoints")[-1])


def _ask(service, **fields):
    return service.act([parse_act(json.dumps(fields).encode(), service.handle)])[0]


def _steps(service, obs_seq):
    """What the policy does stepping `obs_seq` greedily from zeros, its state carried by hand."""
    model, state, out = service.handle.model, torch.zeros(2, service.handle.model.acting_state_size), []
    for obs in obs_seq:
        with torch.no_grad():
            params, state = model.policy_step({"obs": torch.tensor(obs, dtype=torch.float32), STATE: state})
        out.append(params.argmax(-1).tolist())
    return out


@pytest.mark.parametrize("runtime", ["torch", "onnxruntime"])
def test_a_session_carries_the_state_as_the_policy_steps_it(novel_run, runtime):
    service = PolicyService(_newest(novel_run), runtime=runtime)
    rng = np.random.default_rng(0)
    seq = [rng.normal(0, 0.1, (2, 2)).tolist() for _ in range(30)]
    answers = [_ask(service, obs=obs, session="a") for obs in seq]
    assert [a["state"] for a in answers] == ["new"] + ["carried"] * 29
    assert [a["actions"] for a in answers] == _steps(service, seq)
    again = _ask(service, obs=seq[0], session="a", reset=True)
    assert again["state"] == "reset" and again["actions"] == answers[0]["actions"]
    other = _ask(service, obs=seq[0], session="b")  # sessions are separate
    assert other["state"] == "new" and other["actions"] == answers[0]["actions"]


def test_a_sessions_second_call_in_one_batch_starts_from_the_first(novel_run):
    service = PolicyService(_newest(novel_run))
    rng = np.random.default_rng(1)
    seq = [rng.normal(0, 0.1, (2, 2)).tolist() for _ in range(3)]
    batch = [parse_act(json.dumps({"obs": obs, "session": "s"}).encode(), service.handle) for obs in seq]
    answers = service.act(batch)
    assert [a["state"] for a in answers] == ["new", "carried", "carried"]
    assert [a["actions"] for a in answers] == _steps(service, seq)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"obs": OBS}, 'send "session"'),
        ({"obs": OBS, "session": ""}, '"session" is 1-128 characters'),
        ({"obs": OBS, "session": "a b"}, '"session" is 1-128 characters'),
        ({"obs": OBS, "session": "x" * 129}, '"session" is 1-128 characters'),
        ({"obs": OBS, "session": 7}, '"session" is 1-128 characters'),
        ({"obs": OBS, "session": "a", "reset": "yes"}, '"reset" is true or false'),
    ],
)
def test_session_fields_are_checked(novel_run, fields, says):
    service = PolicyService(_newest(novel_run))
    with pytest.raises(BadRequest, match=says) as err:
        parse_act(json.dumps(fields).encode(), service.handle)
    assert err.value.status == 400


def test_a_session_of_other_rows_is_refused_and_a_full_store_says_so(novel_run):
    service = PolicyService(_newest(novel_run))
    assert _ask(service, obs=OBS, session="a")["state"] == "new"
    refused = _ask(service, obs=OBS[0], session="a")
    assert refused["_status"] == 400 and "carries the state of 2 rows, this call has 1" in refused["error"]
    assert _ask(service, obs=OBS[0], session="a", reset=True)["state"] == "reset"  # starting over may
    service.sessions.capacity = 1
    full = _ask(service, obs=OBS, session="b")
    assert full["_status"] == 503 and "1 sessions are live" in full["error"]
    assert _ask(service, obs=OBS[0], session="a")["state"] == "carried"  # the live one is kept


def test_the_session_store_is_bounded_by_bytes():
    """A count cap alone let 1,000 sessions of 4,096 rows take GBs: the store counts the bytes of
    the states it keeps, refuses a new session past `max_bytes` with a 503 saying so, keeps the
    live ones, and frees the bytes of a session that expires."""
    from relay_rl.services.serving.sessions import SessionStore

    store = SessionStore(idle_s=600.0, max_bytes=3 * 4096 * 64 * 4)
    for i in range(3):
        state, status, code = store.start_many([(f"s{i}", 4096, 64, "v1", False, None)])[0]
        assert code == 200 and status == "new"
        store.keep(f"s{i}", state + 1, "v1")
    assert store.bytes == 3 * 4096 * 64 * 4
    state, why, code = store.start_many([("s3", 4096, 64, "v1", False, None)])[0]
    assert state is None and code == 503 and "MiB of state" in why and "3 MiB the replica keeps" in why
    assert store.start_many([("s0", 4096, 64, "v1", False, None)])[0][1] == "carried"
    store.keep("s0", np.zeros((1, 64), np.float32), "v1")  # replaced by a smaller state
    assert store.bytes == 2 * 4096 * 64 * 4 + 64 * 4
    store.idle_s = -1.0  # everything idles out
    assert store.start_many([("s3", 4096, 64, "v1", False, None)])[0][2] == 200 and store.bytes == 0


def test_an_idle_session_expires_and_the_answer_says_so(novel_run):
    service = PolicyService(_newest(novel_run))
    _ask(service, obs=OBS, session="a")
    service.sessions.idle_s = 0.0
    assert _ask(service, obs=OBS, session="a")["state"] == "expired"


def test_swapped_weights_restart_a_session_and_the_answer_says_so(novel_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(novel_run, run)
    newest = list_checkpoints(run / "checkpoints")[-1]
    held = tmp_path / "held"
    hold_back_checkpoints(run, held, keep=len(list_checkpoints(run / "checkpoints")) - 1)
    service = PolicyService(str(run), follow=True)
    assert _ask(service, obs=OBS, session="a")["state"] == "new"
    assert _ask(service, obs=OBS, session="a")["state"] == "carried"
    (held / newest.name).rename(newest)
    assert service.refresh()
    assert _ask(service, obs=OBS, session="a")["state"] == "weights changed"
    assert _ask(service, obs=OBS, session="a")["state"] == "carried"


def test_a_policy_without_state_refuses_sessions(tmp_path):
    run = tmp_path / "cp"
    assert train_local("cartpole_ppo.yaml", run, "stop.env_steps=1024", "learner.buffer_size=512") == 0
    service = PolicyService(_newest(run))
    with pytest.raises(BadRequest, match="for recurrent policies"):
        parse_act(json.dumps({"obs": [0, 0, 0, 0], "session": "a"}).encode(), service.handle)


def test_a_session_started_with_a_key_is_its_clients_alone(novel_run):
    """Any client could reset (or advance) another's session by its id. A session whose first call
    named a session_key answers only calls carrying it: others get a 403, counted, and the owner's
    state is untouched; a session of the same id after it expires is anyone's again."""
    service = PolicyService(_newest(novel_run))
    rng = np.random.default_rng(2)
    seq = [rng.normal(0, 0.1, (2, 2)).tolist() for _ in range(4)]
    owner = [_ask(service, obs=obs, session="robot", session_key="k-7f3a") for obs in seq[:2]]
    assert [a["state"] for a in owner] == ["new", "carried"]
    for intruder in ({"reset": True}, {}, {"session_key": "guess"}):
        refused = _ask(service, obs=seq[2], session="robot", **intruder)
        assert refused["_status"] == 403 and "another client's" in refused["error"]
    assert service.sessions.forbidden == 3
    rest = [_ask(service, obs=obs, session="robot", session_key="k-7f3a") for obs in seq[2:]]
    assert [a["state"] for a in rest] == ["carried", "carried"]
    assert [a["actions"] for a in owner + rest] == _steps(service, seq)
    with pytest.raises(BadRequest, match='"session_key" is 1-128'):
        parse_act(
            json.dumps({"obs": OBS, "session": "a", "session_key": "no spaces"}).encode(), service.handle
        )
    service.sessions.idle_s = -1.0
    assert _ask(service, obs=seq[0], session="robot")["state"] == "expired"
