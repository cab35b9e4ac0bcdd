"""`relay export CKPT --format onnx`: the deterministic policy with the normalizer folded in.

Graph (opset 17, dynamic batch axis): input `obs` [batch, obs_dim] float32; outputs `action`
plus `mean` and `std` (continuous) or `logits` (discrete). The normalizer's statistics stay
float32 tensors in the graph. The export is checked against onnxruntime on CPU (1,000 random and
1,000 recorded observations, max abs error <= 1e-5); a failing file is removed, never left behind.
"""

from __future__ import annotations

import io
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from services.policy_io import (
    RELAY_CONFIG_KEY,
    DeterministicPolicy,
    PolicyHandle,
    output_names,
    recorded_observations,
)

TOLERANCE = 1e-5


class ExportCheckFailed(RuntimeError):
    """onnxruntime disagrees with torch beyond the tolerance."""


@dataclass
class ExportReport:
    path: Path
    max_abs_error: float
    checked: int


def onnx_bytes(handle: PolicyHandle, opset: int = 17) -> bytes:
    module = DeterministicPolicy(handle).eval()
    names = output_names(handle)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            module,
            (torch.zeros(1, handle.obs_dim),),
            buf,
            input_names=["obs"],
            output_names=names,
            dynamic_axes={name: {0: "batch"} for name in ["obs", *names]},
            opset_version=opset,
            # Keep the statistics as named float32 initializers (import and audits read them).
            do_constant_folding=False,
            dynamo=False,
        )
    if handle.config is None:
        return buf.getvalue()
    import onnx

    # The run's config rides along, so `relay verify` can rebuild any relay policy from the graph.
    proto = onnx.load_from_string(buf.getvalue())
    onnx.helper.set_model_props(proto, {RELAY_CONFIG_KEY: handle.config.model_dump_json()})
    return proto.SerializeToString()


def max_abs_error(handle: PolicyHandle, model_bytes: bytes, obs: np.ndarray) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    got = session.run(None, {"obs": obs.astype(np.float32)})
    with torch.no_grad():
        want = DeterministicPolicy(handle)(torch.from_numpy(obs.astype(np.float32)))
    return max(
        float(np.abs(g.astype(np.float64) - w.numpy().astype(np.float64)).max())
        for g, w in zip(got, want, strict=True)
    )


def export_onnx(handle: PolicyHandle, out: Path, seed: int = 0) -> ExportReport:
    """Write the ONNX file atomically after checking it against onnxruntime."""
    data = onnx_bytes(handle)
    batches = [handle.synthetic_obs(1000, torch.Generator().manual_seed(seed)).numpy()]
    if handle.config is not None:
        batches.append(recorded_observations(handle, 1000, seed))
    err = max(max_abs_error(handle, data, b) for b in batches)
    if not err <= TOLERANCE:
        raise ExportCheckFailed(
            f"onnxruntime differs from torch by {err:.3g} (> {TOLERANCE}); nothing written"
        )
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, out)
    return ExportReport(out, err, sum(len(b) for b in batches))
