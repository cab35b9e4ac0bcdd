"""Writes the ML-Agents exports next to this file with ML-Agents' own code (mlagents 1.1.0):
its SimpleActor built the way its PPO trainer builds it, its ModelSerializer writing the .onnx,
its normalizer updated on observations. These files are what `mlagents-learn` writes at the end
of a run, without a Unity build to train in (each .onnx with the .pt checkpoint its
TorchModelSaver writes beside it); relay's tests read them as data.

mlagents 1.1.0 pins Python <= 3.10.12, numpy < 1.24, protobuf < 3.21 and grpcio <= 1.48, none of
which relay's environment has, and it never runs at test time. To regenerate:

    mkdir -p /tmp/mla && cd /tmp/mla
    pip download --no-deps --ignore-requires-python mlagents==1.1.0 mlagents-envs==1.1.0
    unzip -oq mlagents-1.1.0-py3-none-any.whl -d ml && unzip -oq mlagents_envs-1.1.0-py3-none-any.whl -d envs
    pip install --target deps --no-deps "cattrs<1.7" "protobuf==3.20.3" "setuptools<81" h5py "onnx==1.14.1"
    cd -  # back to relay's root
    PYTHONPATH=/tmp/mla/ml:/tmp/mla/envs:/tmp/mla/deps PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python \\
        python tests/services/data/mlagents/make_exports.py

Two shims, both outside ML-Agents' graph: numpy's removed aliases (np.float, ...) that 1.1.0
still names, and torch.onnx.export's TorchScript exporter (dynamo=False), the only exporter of the
torch 2.1-2.2 that ML-Agents 1.1.0 ran on (it loads `onnx`: the one of that time, 1.14, which
reads protobuf 3 as ML-Agents does, sits in deps/ before relay's).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

for alias, kind in {"float": float, "int": int, "bool": bool}.items():
    setattr(np, alias, kind)

import torch  # noqa: E402

torch.onnx.export = functools.partial(torch.onnx.export, dynamo=False)

from mlagents.trainers.policy.torch_policy import TorchPolicy  # noqa: E402
from mlagents.trainers.settings import NetworkSettings  # noqa: E402
from mlagents.trainers.torch_entities.encoders import VectorInput  # noqa: E402
from mlagents.trainers.torch_entities.model_serialization import ModelSerializer  # noqa: E402
from mlagents.trainers.torch_entities.networks import SimpleActor  # noqa: E402
from mlagents_envs.base_env import (  # noqa: E402
    ActionSpec,
    BehaviorSpec,
    DimensionProperty,
    ObservationSpec,
    ObservationType,
)

HERE = Path(__file__).parent

# name: (observation size, ActionSpec, network settings)
POLICIES = {
    # Huggy's shape (continuous control, normalized observations), smaller hidden layers to keep
    # the file small.
    "continuous_normalized": (
        59,
        ActionSpec(4, ()),
        NetworkSettings(normalize=True, hidden_units=128, num_layers=3),
    ),
    "continuous_plain": (
        8,
        ActionSpec(2, ()),
        NetworkSettings(normalize=False, hidden_units=64, num_layers=2),
    ),
    "discrete_one_branch": (
        12,
        ActionSpec(0, (5,)),
        NetworkSettings(normalize=True, hidden_units=64, num_layers=2),
    ),
    "discrete_two_branches": (
        12,
        ActionSpec(0, (3, 2)),
        NetworkSettings(normalize=False, hidden_units=32, num_layers=1),
    ),
    # Recurrent (memory_size > 0): an LSTM after the body, its [h | c] memory the graph's
    # recurrent_in [batch, 1, memory_size] input and recurrent_out output.
    "recurrent_discrete": (
        12,
        ActionSpec(0, (5,)),
        NetworkSettings(
            normalize=True,
            hidden_units=64,
            num_layers=2,
            memory=NetworkSettings.MemorySettings(sequence_length=16, memory_size=32),
        ),
    ),
    "recurrent_continuous": (
        8,
        ActionSpec(2, ()),
        NetworkSettings(
            normalize=False,
            hidden_units=32,
            num_layers=1,
            memory=NetworkSettings.MemorySettings(sequence_length=8, memory_size=64),
        ),
    ),
    # CartPole's shape (4 observations, one branch of 2): a discrete ML-Agents policy that
    # `relay eval --env CartPole-v1` can play, as recurrent_continuous and continuous_plain
    # play Swimmer-v5 (8 observations, 2 actions in [-1, 1]). Last, so the files above keep
    # their bytes.
    "discrete_cartpole": (
        4,
        ActionSpec(0, (2,)),
        NetworkSettings(normalize=True, hidden_units=32, num_layers=2),
    ),
}


def export(name: str, obs_size: int, action_spec: ActionSpec, network: NetworkSettings) -> None:
    obs_spec = ObservationSpec((obs_size,), (DimensionProperty.NONE,), ObservationType.DEFAULT, "obs")
    policy = TorchPolicy(
        seed=0,
        behavior_spec=BehaviorSpec([obs_spec], action_spec),
        network_settings=network,
        actor_cls=SimpleActor,
        actor_kwargs={"conditional_sigma": False, "tanh_squash": False},  # PPO's actor
    )
    rng = np.random.default_rng(0)
    for module in policy.actor.modules():
        if isinstance(module, VectorInput) and network.normalize:
            # A trained normalizer: observations with scales and offsets of their own per feature.
            obs = rng.normal(rng.normal(0, 3, obs_size), rng.uniform(0.2, 5, obs_size), (4096, obs_size))
            module.update_normalization(torch.as_tensor(obs, dtype=torch.float32))
    with torch.no_grad():  # weights away from their init, as after training (log-std included);
        for p in policy.actor.parameters():  # the export's constants (version, sizes) stay as they are
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    ModelSerializer(policy).export_policy_model(str(HERE / name))
    # and the checkpoint beside it, as ML-Agents' TorchModelSaver writes it
    modules = policy.get_modules()
    torch.save({key: module.state_dict() for key, module in modules.items()}, HERE / f"{name}.pt")
    print(
        name,
        json.dumps(
            {
                "obs": obs_size,
                "continuous": action_spec.continuous_size,
                "branches": list(action_spec.discrete_branches),
            }
        ),
    )


if __name__ == "__main__":
    torch.manual_seed(0)  # one stream for all, in order: the files are reproduced byte for byte
    for name, spec in POLICIES.items():
        export(name, *spec)
