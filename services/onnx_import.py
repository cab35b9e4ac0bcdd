"""Importing MLP policies from ONNX (relay's own exports, Unity ML-Agents PPO exports) and from
ML-Agents `.pt` checkpoints into relay's torch ActorCritic, so they can be verified on any device.

ML-Agents conventions (PPO, continuous actions, e.g. the Huggy dog: 59 obs -> 21 actions, three
SiLU layers of 512): normalizer `clamp((obs - running_mean) / sqrt(running_variance /
normalization_steps), -5, 5)` with no epsilon, body `network_body._body_endoder.seq_layers.{0,2,4}`,
head `action_model._continuous_distribution.mu`, `log_sigma`, and actions `clamp(a, -3, 3) / 3`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from learner.models import ActionSpec, ActorCritic
from services.policy_io import PolicyHandle, PolicyLoadError

MLAGENTS_BODY = re.compile(r"_body_endoder\.seq_layers\.(\d+)\.weight$")
RELAY_TRUNK = re.compile(r"^pi_trunk\.net\.(\d+)\.weight$")
ACTIVATION_OPS = {"Tanh": "tanh", "Relu": "relu", "Sigmoid": "silu"}  # SiLU exports as Sigmoid * x


def mlagents_clip(actions: Tensor) -> Tensor:
    """ML-Agents' action post-processing: clamp(a, -3, 3) / 3."""
    return torch.clamp(actions, -3.0, 3.0) / 3.0


def _find(sd: dict[str, Any], suffix: str) -> Tensor:
    hits = [k for k in sd if k.endswith(suffix)]
    if len(hits) != 1:
        raise PolicyLoadError(f"expected one tensor named *{suffix}, found {len(hits)}")
    value = sd[hits[0]]
    return (value if torch.is_tensor(value) else torch.from_numpy(np.array(value))).detach().float()


def _layers(sd: dict[str, Any], pattern: re.Pattern[str]) -> list[tuple[Tensor, Tensor]]:
    found = sorted((int(m.group(1)), k) for k in sd if (m := pattern.search(k)))
    return [(_find(sd, k), _find(sd, k[: -len("weight")] + "bias")) for _, k in found]


def _load_trunk(model: ActorCritic, layers: list[tuple[Tensor, Tensor]]) -> None:
    linears = [m for m in model.pi_trunk.net if isinstance(m, torch.nn.Linear)]
    for linear, (w, b) in zip(linears, layers, strict=True):
        linear.weight.data.copy_(w)
        linear.bias.data.copy_(b)


def mlagents_policy_from_state_dict(sd: dict[str, Any], source: str) -> PolicyHandle:
    """An ML-Agents PPO policy (continuous actions) as a relay ActorCritic plus ML-Agents' clip."""
    layers = _layers(sd, MLAGENTS_BODY)
    if not layers:
        raise PolicyLoadError(f"{source}: no ML-Agents body layers (*_body_endoder.seq_layers.N.weight)")
    mu_w, mu_b = (
        _find(sd, "_continuous_distribution.mu.weight"),
        _find(sd, "_continuous_distribution.mu.bias"),
    )
    model = ActorCritic(
        obs_dim=layers[0][0].shape[1],
        action=ActionSpec("continuous", mu_w.shape[0]),
        hidden=[w.shape[0] for w, _ in layers],
        activation="silu",
        critic=False,
    )
    _load_trunk(model, layers)
    model.pi_head.weight.data.copy_(mu_w)
    model.pi_head.bias.data.copy_(mu_b)
    model.log_std.data.copy_(_find(sd, "_continuous_distribution.log_sigma").reshape(-1))
    model.normalizer.mean.copy_(_find(sd, "normalizer.running_mean"))
    model.normalizer.var_sum.copy_(_find(sd, "normalizer.running_variance"))
    model.normalizer.steps.copy_(_find(sd, "normalizer.normalization_steps").reshape(()))
    return PolicyHandle(model.eval(), source, None, mlagents_clip)


def _relay_policy_from_onnx(sd: dict[str, Any], graph: Any, source: str) -> PolicyHandle:
    sd = {k.removeprefix("model."): v for k, v in sd.items()}
    layers = _layers(sd, RELAY_TRUNK)
    if not layers:
        raise PolicyLoadError(f"{source}: neither an ML-Agents nor a relay policy graph")
    outputs = [o.name for o in graph.output]
    ops = [n.op_type for n in graph.node]
    activation = next((ACTIVATION_OPS[op] for op in ops if op in ACTIVATION_OPS), "tanh")
    head_w = _find(sd, "pi_head.weight")
    kind = "discrete" if "logits" in outputs else "continuous"
    model = ActorCritic(
        layers[0][0].shape[1],
        ActionSpec(kind, head_w.shape[0]),
        [w.shape[0] for w, _ in layers],
        activation=activation,
        critic=False,
    )
    _load_trunk(model, layers)
    model.pi_head.weight.data.copy_(head_w)
    model.pi_head.bias.data.copy_(_find(sd, "pi_head.bias"))
    if kind == "continuous":
        model.log_std.data.copy_(_find(sd, "log_std"))
    model.normalizer.mean.copy_(_find(sd, "normalizer.mean"))
    model.normalizer.var_sum.copy_(_find(sd, "normalizer.var_sum"))
    model.normalizer.steps.copy_(_find(sd, "normalizer.steps").reshape(()))
    return PolicyHandle(model.eval(), source)


def import_onnx_policy(path: Path) -> PolicyHandle:
    """Read the graph's initializers and rebuild the policy in torch."""
    import onnx
    from onnx import numpy_helper

    try:
        proto = onnx.load(str(path))
    except Exception as err:
        raise PolicyLoadError(f"{path}: not an ONNX model ({type(err).__name__})") from None
    sd = {init.name: numpy_helper.to_array(init) for init in proto.graph.initializer}
    if any(MLAGENTS_BODY.search(k) for k in sd):
        return mlagents_policy_from_state_dict(sd, f"ML-Agents ONNX {path.name}")
    return _relay_policy_from_onnx(sd, proto.graph, f"relay ONNX {path.name}")
