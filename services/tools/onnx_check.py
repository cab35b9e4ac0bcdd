"""A policy handle against onnxruntime running a graph: the same inputs through both, output by
output, on one batch or over a sequence of recurrent steps with each runtime feeding its own
state back (so a drift that compounds shows). `relay export` checks the file it writes this way,
the ONNX importer the file it reads.

relay's own exports share the handle's names (inputs, and every output compared by position); an
imported graph (ML-Agents) names its own inputs and the two outputs that matter: the action and,
for a recurrent policy, the state after the step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...contracts.segment import Fields
from ...policy.actor_critic import STATE, fields_to_numpy, fields_to_torch
from ...services.tools.handle import DeterministicPolicy, PolicyHandle


def _same_names(fields: Fields) -> dict[str, np.ndarray]:
    return dict(fields)


@dataclass(frozen=True)
class GraphIO:
    """How a graph's names meet the handle's. `feeds` maps the handle's input fields ("h_in"
    included) to the graph's feeds; `outputs` names the graph's action output and, for a
    recurrent policy, its state output (compared with the handle's first and last), or is None
    for every output in the handle's order."""

    feeds: Callable[[Fields], dict[str, np.ndarray]] = field(default=_same_names)
    outputs: tuple[str, ...] | None = None


RELAY_IO = GraphIO()


def cpu_session(model_bytes: bytes) -> Any:
    """An onnxruntime session on the CPU for a graph's bytes: one per checked file, shared by
    every comparison made on it (onnxruntime is imported here, where a check needs it)."""
    import onnxruntime as ort

    return ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])


def torch_outputs(handle: PolicyHandle, fields: Fields, io: GraphIO = RELAY_IO) -> list[np.ndarray]:
    """The handle's compared outputs on its input `fields` [B, ...]: all of them in order, or the
    action and the state after the step where the graph names its own."""
    inputs = fields_to_torch(fields)
    with torch.no_grad():
        out = [w.numpy() for w in DeterministicPolicy(handle)(*(inputs[n] for n in handle.input_names))]
    return out if io.outputs is None else [out[0], out[-1]][: len(io.outputs)]


def graph_outputs(session: Any, fields: Fields, io: GraphIO, like: list[np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's compared outputs on the same fields, each in the shape of its torch twin in
    `like` where their sizes agree (ML-Agents' memory is [B, 1, S], relay's state [B, S])."""
    got = session.run(None if io.outputs is None else list(io.outputs), io.feeds(fields))
    return [g.reshape(w.shape) if g.size == w.size else g for g, w in zip(got, like, strict=True)]


def max_difference(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """The largest |onnxruntime - torch| over the outputs (inf where a shape differs)."""
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape:
            return float("inf")
        worst = max(worst, float(np.abs(g.astype(np.float64) - w.astype(np.float64)).max()))
    return worst


def sequence_error(
    handle: PolicyHandle,
    session: Any,
    io: GraphIO = RELAY_IO,
    steps: int = 100,
    batch: int = 8,
    seed: int = 0,
) -> float:
    """The largest |onnxruntime - torch| over `steps` steps of a recurrent policy from zero states,
    each runtime feeding its own state back as the next step's (`session`: onnxruntime's on the
    graph); 0.0 for a policy without state."""
    if not handle.recurrent:
        return 0.0
    gen = torch.Generator().manual_seed(seed)
    h_ort = h_torch = handle.initial_state(batch)
    worst = 0.0
    for _ in range(steps):
        x = handle.as_input(fields_to_numpy(handle.synthetic_obs(batch, gen)))
        want = torch_outputs(handle, {**x, STATE: h_torch}, io)
        got = graph_outputs(session, {**x, STATE: h_ort}, io, want)
        worst = max(worst, max_difference(got, want))
        h_ort, h_torch = got[-1], want[-1]
    return worst
