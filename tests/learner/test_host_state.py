"""The learner's state crosses Ray as host numpy (learner/actor.py `to_host`/`from_host`)."""

from __future__ import annotations

import pickle

import numpy as np
import torch

from relay_rl.contracts.config import load_config
from relay_rl.learner.actor import HostTensor, from_host, to_host
from relay_rl.learner.learner import Learner
from relay_rl.rollout_workers.envs import probe_env_spec


def test_every_tensor_goes_as_numpy_and_comes_back_equal_in_its_own_dtype():
    tree = {
        "w": torch.randn(3, 4),
        "half": torch.randn(5).to(torch.bfloat16),
        "step": torch.tensor(7.0),
        "ids": torch.arange(6, dtype=torch.int64).view(2, 3).t(),  # not contiguous
        "rng": torch.ByteTensor([1, 2, 3]),
        "nested": [{"m": torch.ones(2)}, (torch.zeros(1), 3)],
        "plain": {"version": 4, "name": "x", "none": None, "array": np.ones(2)},
    }
    hosted = to_host(tree)
    leaves = [hosted["w"], hosted["half"], hosted["step"], hosted["ids"], hosted["rng"]]
    assert all(isinstance(h, HostTensor) and isinstance(h.array, np.ndarray) for h in leaves)
    back = from_host(pickle.loads(pickle.dumps(hosted, protocol=5)))
    for key in ("w", "half", "step", "ids", "rng"):
        assert back[key].dtype == tree[key].dtype and torch.equal(back[key], tree[key]), key
    assert torch.equal(back["nested"][0]["m"], torch.ones(2)) and isinstance(back["nested"][1], tuple)
    assert back["plain"]["version"] == 4 and back["plain"]["array"] is not None
    back["w"].add_(1)  # writable, and not the sender's memory
    assert not torch.equal(back["w"], tree["w"])


def test_a_learners_state_survives_the_trip_bit_for_bit():
    cfg = load_config("configs/cartpole_ppo.yaml")
    learner = Learner(cfg, probe_env_spec(cfg.env))
    state = learner.state_dict()
    again = from_host(pickle.loads(pickle.dumps(to_host(state), protocol=5)))
    other = Learner(cfg, probe_env_spec(cfg.env))
    other.load_state_dict(again)
    assert all(
        torch.equal(a, b) for a, b in zip(other.weights().values(), learner.weights().values(), strict=True)
    )
    assert again["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    assert torch.equal(again["generator"], state["generator"])
