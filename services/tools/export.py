"""`relay export CKPT --format onnx`: the deterministic policy with the normalizer folded in.

Graph (opset 17, dynamic batch axis): input `obs` [batch, *obs_shape] float32 (uint8 for image
policies), or for a Dict/Tuple observation one input per leaf (`obs/<path>`, each in its dtype:
uint8 images, int64 choices), plus `action_mask` [batch, param_size] bool where the env has masks;
outputs `action` (what the env takes) plus `mean` and `std` (continuous) or `logits` (the others).
A recurrent policy's graph also takes `h_in` [batch, S] and returns `h_out` (the state entering
and leaving the step, as ML-Agents' `memory_size` exports carry theirs). The
normalizer's statistics stay float32 tensors in the graph. The export is checked against
onnxruntime on CPU (2,000 random observations, or 1,000 random and 1,000 recorded in the env the
user names with `--env`; a recurrent policy also over 100 steps with each runtime feeding its own
`h_out` back; max abs error <= 1e-5; every output finite); a failing file is never
written, and neither is one over the checkpoint, a link, a FIFO or a device, or over an existing
file without `--force`. The run's config and env spec ride along as metadata (`relay_config`,
`relay_env`), as data.
"""

from __future__ import annotations

import io
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...contracts.config import config_data
from ...contracts.segment import Fields
from ...policy.actor_critic import fields_to_numpy, fields_to_torch
from ...services.runs.files import write_new
from ...services.tools.handle import (
    RELAY_CONFIG_KEY,
    RELAY_ENV_KEY,
    DeterministicPolicy,
    PolicyHandle,
    output_names,
    rows_of,
)
from ...services.tools.load import NamedEnv, recorded_observations
from ...services.tools.onnx_check import (
    RELAY_IO,
    cpu_session,
    graph_outputs,
    max_difference,
    sequence_error,
    torch_outputs,
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
    example = fields_to_torch(handle.as_input(fields_to_numpy(handle.synthetic_obs(2, torch.Generator()))))
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            module,
            tuple(example[name] for name in handle.input_names),
            buf,  # type: ignore[arg-type]  # a file-like object is documented and works
            input_names=handle.input_names,
            output_names=names,
            dynamic_axes={name: {0: "batch"} for name in [*handle.input_names, *names]},
            opset_version=opset,
            # Keep the statistics as named float32 initializers (import and audits read them).
            do_constant_folding=False,
            dynamo=False,
        )
    if handle.config is None:
        return buf.getvalue()
    import onnx

    # The run's config and env spec ride along, so `relay verify` can rebuild any relay policy
    # from the graph (as data: nothing in them is ever executed or used to build an env).
    proto = onnx.load_from_string(buf.getvalue())
    props = {
        RELAY_CONFIG_KEY: json.dumps(config_data(handle.config)),
        RELAY_ENV_KEY: json.dumps(handle.env.to_dict()),
    }
    onnx.helper.set_model_props(proto, props)
    return proto.SerializeToString()


def max_abs_error(handle: PolicyHandle, session: Any, obs: Fields) -> float:
    """The largest |onnxruntime - torch| over every output on input fields [B, ...] (`session`:
    onnxruntime's on the export); a policy whose outputs are not all finite fails here (NaN would
    drop out of a max and pass the check)."""
    x = handle.as_input(obs)
    want = torch_outputs(handle, x)
    got = graph_outputs(session, x, RELAY_IO, want)
    rows = rows_of(x)
    for name, g, w in zip(output_names(handle), got, want, strict=True):
        bad = sum(int(np.sum(~np.isfinite(a.astype(np.float64)))) for a in (g, w))
        if bad:
            raise ExportCheckFailed(
                f"the policy's {name!r} is not finite ({bad} NaN/inf values on {rows} observations); "
                "nothing written"
            )
    return max_difference(got, want)


def export_onnx(
    handle: PolicyHandle, out: Path, env: NamedEnv | None = None, seed: int = 0, replace: bool = False
) -> ExportReport:
    """Write the ONNX file after checking it against onnxruntime (on observations recorded in
    `env` too, when the user names one): to a temporary file, then renamed into place (with
    `replace` False only ever created, never over a file that appeared meanwhile)."""
    data = onnx_bytes(handle)
    gen = torch.Generator().manual_seed(seed)
    if env is None:
        batches = [fields_to_numpy(handle.synthetic_obs(2000, gen))]
    else:
        batches = [
            fields_to_numpy(handle.synthetic_obs(1000, gen)),
            recorded_observations(handle, env, 1000, seed),
        ]
    session = cpu_session(data)
    errors = [max_abs_error(handle, session, b) for b in batches]
    err = max(*errors, sequence_error(handle, session, seed=seed))
    if not err <= TOLERANCE:
        raise ExportCheckFailed(
            f"onnxruntime differs from torch by {err:.3g} (> {TOLERANCE}); nothing written"
        )
    write_new(out, data, replace)
    return ExportReport(out, err, sum(rows_of(b) for b in batches))
