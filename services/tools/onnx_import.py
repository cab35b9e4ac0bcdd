"""Importing ONNX policies: relay's own exports (rebuilt from the config and env spec in their
metadata, weights by name) and Unity ML-Agents exports (`services/tools/mlagents.py`).

The metadata is data: it is validated, never executed, and no env is built from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from contracts.spaces import ActionSpec, EnvSpec, SpecError
from services.tools.handle import RELAY_CONFIG_KEY, RELAY_ENV_KEY, PolicyHandle, PolicyLoadError
from services.tools.mlagents import MLAGENTS_BODY, mlagents_policy_from_state_dict
from services.tools.relay_policy import relay_policy


def _graph_env(proto: Any, meta: dict[str, str], weights: dict[str, torch.Tensor], source: str) -> EnvSpec:
    """The env spec from the graph's metadata (relay exports since format 2), else its shapes."""
    if RELAY_ENV_KEY in meta:
        try:
            return EnvSpec.from_dict(json.loads(meta[RELAY_ENV_KEY]))
        except (ValueError, SpecError) as err:
            raise PolicyLoadError(f"{source}: unreadable env spec in the graph ({err})") from None
    head = weights.get("pi_head.weight")
    if head is None:
        raise PolicyLoadError(f"{source}: no model.pi_head.weight in the graph")
    obs_shape = tuple(int(d.dim_value) for d in proto.graph.input[0].type.tensor_type.shape.dim[1:])
    size = int(head.shape[0])
    discrete = "logits" in [o.name for o in proto.graph.output]
    action = ActionSpec("discrete", size) if discrete else ActionSpec("continuous", size)
    return EnvSpec(obs_shape, action)


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
    source = f"relay ONNX {path.name}"
    if RELAY_CONFIG_KEY not in meta:
        raise PolicyLoadError(
            f"{path}: neither an ML-Agents graph nor a relay export (no {RELAY_CONFIG_KEY})"
        )
    try:
        cfg_data = json.loads(meta[RELAY_CONFIG_KEY])
    except ValueError as err:
        raise PolicyLoadError(f"{source}: unreadable relay config in the graph ({err})") from None
    weights = {k.removeprefix("model."): torch.from_numpy(v.copy()) for k, v in sd.items()}
    env = _graph_env(proto, meta, weights, source)
    return relay_policy(cfg_data, env, weights, source, acting_only=True)
