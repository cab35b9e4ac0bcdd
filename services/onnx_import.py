"""Importing policies from ONNX (relay's own exports, Unity ML-Agents PPO exports) and from
ML-Agents `.pt` checkpoints into relay's torch ActorCritic, so they can be verified on any device.

relay's exports carry the run's config as metadata and are rebuilt from it (any model kind).

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

from learner.learner import EnvSpec, build_policy
from learner.models import ActionSpec, ActorCritic
from services.config import RelayConfig
from services.policy_io import RELAY_CONFIG_KEY, PolicyHandle, PolicyLoadError

MLAGENTS_BODY = re.compile(r"_body_endoder\.seq_layers\.(\d+)\.weight$")


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


def _relay_policy_from_config(sd: dict[str, Any], graph: Any, config_json: str, source: str) -> PolicyHandle:
    """Any relay policy (MLP or transformer): rebuilt from the run's config, weights by name."""
    try:
        cfg = RelayConfig.model_validate_json(config_json)
    except ValueError as err:
        raise PolicyLoadError(f"{source}: unreadable relay config in the graph ({err})") from None
    obs_dim = graph.input[0].type.tensor_type.shape.dim[1].dim_value
    kind = "discrete" if "logits" in [o.name for o in graph.output] else "continuous"
    head = sd.get("model.pi_head.weight")
    if head is None:
        raise PolicyLoadError(f"{source}: no model.pi_head.weight in the graph")
    model = build_policy(cfg, EnvSpec((obs_dim,), ActionSpec(kind, head.shape[0])))
    state = {k.removeprefix("model."): torch.from_numpy(v.copy()) for k, v in sd.items()}
    # The exported graph holds the acting path only: no value network, no unused normalizer.
    unused = ("v_trunk.", "v_head.") + (() if cfg.model.normalize_obs else ("normalizer.",))
    needed = [k for k in model.state_dict() if not k.startswith(unused)]
    missing = [k for k in needed if k not in state]
    if missing:
        raise PolicyLoadError(f"{source}: the graph lacks {len(missing)} weights, e.g. {missing[0]}")
    model.load_state_dict({k: state[k] for k in needed}, strict=False)
    return PolicyHandle(model.eval(), source, cfg)


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
    meta = {p.key: p.value for p in proto.metadata_props}
    if RELAY_CONFIG_KEY not in meta:
        raise PolicyLoadError(
            f"{path}: neither an ML-Agents graph nor a relay export (no {RELAY_CONFIG_KEY})"
        )
    return _relay_policy_from_config(sd, proto.graph, meta[RELAY_CONFIG_KEY], f"relay ONNX {path.name}")
