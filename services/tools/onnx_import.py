"""Importing ONNX policies: relay's own exports (rebuilt from the config and env spec in their
metadata, weights by name) and Unity ML-Agents exports (read from the graph's structure,
`services/tools/mlagents.py`).

The metadata is data: it is validated, never executed, and no env is built from it. Whatever is
imported is cross-checked against onnxruntime running the original file (deterministic actions on
1,024 observations, and a recurrent policy's state after the step on them and over 100 steps with
each runtime feeding its own state back; max abs <= 1e-5) before anything uses it; a file that
does not match is refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...contracts.segment import Fields
from ...contracts.spaces import ActionSpec, EnvSpec, SpecError
from ...policy.actor_critic import STATE, fields_to_numpy
from ...policy.models import action_outputs
from ...services.tools.handle import (
    RELAY_CONFIG_KEY,
    RELAY_ENV_KEY,
    PolicyHandle,
    PolicyLoadError,
    rows_of,
)
from ...services.tools.mlagents import (
    DETERMINISTIC,
    MASKS_INPUT,
    MEMORY_INPUT,
    MEMORY_OUTPUT,
    is_mlagents_graph,
    mlagents_policy_from_graph,
)
from ...services.tools.onnx_check import (
    GraphIO,
    cpu_session,
    graph_outputs,
    max_difference,
    sequence_error,
    torch_outputs,
)
from ...services.tools.onnx_graph import GraphError, OnnxGraph
from ...services.tools.relay_policy import relay_policy


def _graph_env(proto: Any, meta: dict[str, str], weights: dict[str, torch.Tensor], source: str) -> EnvSpec:
    """The env spec from the graph's metadata (relay exports since format 2), else its shapes."""
    if RELAY_ENV_KEY in meta:
        try:
            return EnvSpec.from_dict(json.loads(meta[RELAY_ENV_KEY]))
        except (ValueError, SpecError) as err:
            raise PolicyLoadError(f"{source}: unreadable env spec in the graph ({err})") from None
    size = action_outputs(weights)
    if size is None:
        raise PolicyLoadError(f"{source}: no action head in the graph's weights")
    obs_shape = tuple(int(d.dim_value) for d in proto.graph.input[0].type.tensor_type.shape.dim[1:])
    discrete = "logits" in [o.name for o in proto.graph.output]
    action = ActionSpec("discrete", size) if discrete else ActionSpec("continuous", size)
    return EnvSpec(obs_shape, action)


IMPORT_TOLERANCE = 1e-5
CHECK_ROWS = 1024


def mlagents_io(graph: OnnxGraph, handle: PolicyHandle) -> GraphIO:
    """An ML-Agents graph's names: obs_N, action_masks (every action allowed: relay's import has
    no masks of its own), the memory as recurrent_in [B, 1, S]; the deterministic actions and the
    memory after the step compared."""
    obs = next(i for i in graph.inputs if i.startswith("obs_"))
    masks = MASKS_INPUT in graph.inputs

    def feeds(fields: Fields) -> dict[str, np.ndarray]:
        out = {obs: fields["obs"]}
        if masks:
            out[MASKS_INPUT] = np.ones((rows_of(fields), handle.model.action.param_size), np.float32)
        if handle.recurrent:
            out[MEMORY_INPUT] = fields[STATE][:, None, :]
        return out

    action = DETERMINISTIC["continuous" if handle.continuous else "discrete"]
    return GraphIO(feeds, (action, MEMORY_OUTPUT) if handle.recurrent else (action,))


def _check_obs(handle: PolicyHandle) -> Fields:
    """Input fields the policy accepts; with a normalizer, half of the rows of every float
    observation field scaled by 100 (to reach its clamp; a recurrent state keeps the range a core
    meets)."""
    fields = handle.as_input(
        fields_to_numpy(handle.synthetic_obs(CHECK_ROWS, torch.Generator().manual_seed(0)))
    )
    if handle.model.normalizer.enabled:
        for name, arr in fields.items():
            if arr.dtype.kind == "f" and name != STATE:
                arr[: CHECK_ROWS // 2] *= 100
    return fields


def import_onnx_policy(path: Path) -> PolicyHandle:
    """Rebuild the policy in torch, and refuse it unless onnxruntime on the file agrees."""
    import onnx

    try:
        data = path.read_bytes()
        proto = onnx.load_from_string(data)
    except OSError as err:
        raise PolicyLoadError(f"{path}: cannot be read ({err.strerror})") from None
    except Exception as err:
        raise PolicyLoadError(f"{path}: not an ONNX model ({type(err).__name__})") from None
    try:
        graph = OnnxGraph(proto)
    except GraphError as err:
        raise PolicyLoadError(f"{path}: {err}") from None
    if is_mlagents_graph(graph):
        handle = mlagents_policy_from_graph(graph, f"ML-Agents ONNX {path.name}")
        io = mlagents_io(graph, handle)
    else:
        handle = _relay_export(proto, graph, path)
        io = GraphIO(outputs=("action", "h_out") if handle.recurrent else ("action",))
    try:
        session = cpu_session(data)
        inputs = _check_obs(handle)
        want = torch_outputs(handle, inputs, io)
        got = graph_outputs(session, inputs, io, want)
        diff = max(max_difference(got, want), sequence_error(handle, session, io))
    except Exception as exc:  # onnxruntime refusing the file is the file's fault
        raise PolicyLoadError(f"{handle.source}: onnxruntime cannot run it ({type(exc).__name__})") from None
    if not diff <= IMPORT_TOLERANCE:
        raise PolicyLoadError(
            f"{handle.source}: the imported policy differs from onnxruntime on the file by {diff:.3g} "
            f"(> {IMPORT_TOLERANCE}); not using it"
        )
    return handle


def _relay_export(proto: Any, graph: OnnxGraph, path: Path) -> PolicyHandle:
    meta = {p.key: p.value for p in proto.metadata_props}
    source = f"relay ONNX {path.name}"
    if RELAY_CONFIG_KEY not in meta:
        raise PolicyLoadError(
            f"{path}: neither an ML-Agents graph (obs_0 -> deterministic_*_actions) nor a relay export "
            f"(no {RELAY_CONFIG_KEY})"
        )
    try:
        cfg_data = json.loads(meta[RELAY_CONFIG_KEY])
    except ValueError as err:
        raise PolicyLoadError(f"{source}: unreadable relay config in the graph ({err})") from None
    names = {init.name for init in proto.graph.initializer}
    weights = {
        k.removeprefix("model."): torch.from_numpy(v.copy()) for k, v in graph.consts.items() if k in names
    }
    env = _graph_env(proto, meta, weights, source)
    return relay_policy(cfg_data, env, weights, source, acting_only=True)
