"""Weight wires (policy/weight_wires.py): how a version's weights travel from the learner to the
actors, chosen by `learner.weight_wire` from a registry."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from relay_rl.contracts.config import build_config
from relay_rl.policy.models import build_policy
from relay_rl.policy.weight_wires import WIRES, HostArrays, load_weights, wire_for, wire_name
from relay_rl.rollout_workers.envs import probe_env_spec
from relay_rl.services.cli import main
from tests.helpers import train_local

ROOT = Path(__file__).parents[2]
CARTPOLE = str(ROOT / "configs/cartpole_ppo.yaml")


def _tensor(x) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))


def _policy_weights() -> dict[str, torch.Tensor]:
    cfg = build_config({"env": {"id": "CartPole-v1"}})
    policy = build_policy(cfg, probe_env_spec(cfg.env), critic=True)
    with torch.no_grad():  # normalizer statistics that are not round numbers
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return policy.acting_weights()


@pytest.mark.parametrize("name", list(WIRES))
def test_every_wire_gives_every_key_back_exact_where_it_says_so(name):
    wire = WIRES[name]
    state = _policy_weights()
    payload = wire.pack(state)
    back = wire.unpack(payload)
    assert set(back) == set(state)
    assert wire.nbytes(payload) > 0
    for k, v in state.items():
        got = _tensor(back[k])
        assert got.shape == v.shape, k
        if wire.exact or not v.is_floating_point():
            assert torch.equal(got.to(v.dtype), v), k
        else:
            assert torch.allclose(got.float(), v, rtol=1e-2, atol=1e-2), k
    again = wire.unpack(wire.pack(state, payload))  # the previous payload's memory reused
    assert all(torch.equal(_tensor(again[k]), _tensor(back[k])) for k in state)


def test_an_exact_wire_loads_a_module_bit_for_bit_and_refuses_another_models():
    state = _policy_weights()
    cfg = build_config({"env": {"id": "CartPole-v1"}})
    target = build_policy(cfg, probe_env_spec(cfg.env), critic=True)
    wire = WIRES["packed_f32"]
    load_weights(target, wire.unpack(wire.pack(state)))
    assert all(torch.equal(target.acting_weights()[k], v) for k, v in state.items())
    with pytest.raises(ValueError, match="do not fit"):
        load_weights(torch.nn.Linear(2, 2), wire.unpack(wire.pack(state)))


def test_auto_is_each_familys_default():
    assert wire_name(build_config({})) == "arrays"
    lm = build_config(
        {"model": {"kind": "causal_lm", "path": "m"}, "learner": {"algo": "grpo", "group_size": 2}},
        ["prompts.train=p.jsonl", "prompts.rewards=[exact_match]"],
    )
    assert wire_name(lm) == "packed_bf16"
    assert wire_for(build_config({}, ["learner.weight_wire=packed_f32"])) is WIRES["packed_f32"]


@pytest.mark.parametrize(
    "wire, needle",
    [
        ("packed_bf16", "learner.weight_wire=packed_bf16 rounds the weights: an env policy acts"),
        ("pigeon", "learner.weight_wire='pigeon' is not a wire: choose auto, arrays"),
    ],
)
def test_a_wire_an_env_policy_cannot_use_is_one_line(capsys, wire, needle):
    assert main(["validate", CARTPOLE, "--set", f"learner.weight_wire={wire}"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err, err


class CountingArrays(HostArrays):
    """A new wire of this test: float32 arrays, every pack and unpack counted."""

    packs = 0
    unpacks = 0

    def pack(self, state, reuse=None):
        CountingArrays.packs += 1
        return super().pack(state, reuse)

    def unpack(self, payload):
        CountingArrays.unpacks += 1
        return super().unpack(payload)


def test_a_new_wire_is_one_class_and_one_registry_line(monkeypatch, tmp_path):
    """Registered, it is a choice of `--help-config`, passes preflight, and carries every version
    of a real (local) training."""
    monkeypatch.setitem(WIRES, "counting", CountingArrays())
    run = tmp_path / "run"
    assert train_local("cartpole_ppo.yaml", run, "learner.weight_wire=counting", "stop.env_steps=2048") == 0
    iterations = len((run / "metrics.jsonl").read_text().splitlines())
    assert CountingArrays.packs == CountingArrays.unpacks >= iterations >= 2
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["env_steps"] >= 2048
