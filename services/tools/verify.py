"""`relay verify MODEL`: precision table, action fingerprint and latency on a device.

Precision: for each dtype, actions on the device vs a CPU float32 reference on 100 normally
distributed observations (plus 100 recorded in the env named with `--env`): cosine similarity
and max abs error; pass when cosine >= 0.999 and max abs <= 0.01. The normalizer stays float32 in
every dtype. Actions are the deterministic ones (the mean, after the source's action transform)
for continuous policies and the action probabilities for discrete ones.

Fingerprint: sha256 of the stochastic actions for a fixed seed and observation stream; noise is
drawn on the CPU, so the sequence is the same on any device. Continuous actions are rounded to
1e-4 first, which absorbs last-bit float differences between devices' kernels.

Latency: batch-1 and batch-B forward after warm-up (p50/p95/p99 ms), the first (cold) call on its
own, next to onnxruntime's on the same machine.
"""

from __future__ import annotations

import copy
import hashlib
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ...contracts.segment import Fields
from ...learner.device import AMP_DTYPES, DeviceContext, resolve_device
from ...policy.actor_critic import draw_noise, fields_to_numpy, fields_to_torch
from ...policy.protocol import EnvPolicy
from ...services.tools.export import onnx_bytes
from ...services.tools.handle import (
    PolicyHandle,
    concat_fields,
    rows_of,
)
from ...services.tools.load import NamedEnv, recorded_observations

DTYPES = {"float32": torch.float32, **AMP_DTYPES}


@dataclass
class PrecisionRow:
    dtype: str
    cosine: float
    max_abs: float
    passed: bool


@torch.no_grad()
def policy_outputs(handle: PolicyHandle, model: EnvPolicy, obs: dict[str, Tensor]) -> Tensor:
    """What precision is judged on, [B, P] fp32: transformed mean actions, the (allowed) action
    probabilities per component, or each bit's probability."""
    summary = model.action_summary(obs)
    return handle.action_transform(summary) if handle.continuous else summary


def _to(fields: dict[str, Tensor], device: torch.device, dtype: torch.dtype) -> dict[str, Tensor]:
    """Fields on `device`; float ones in `dtype` (frames, choices and masks keep theirs)."""
    return {k: v.to(device, dtype) if v.is_floating_point() else v.to(device) for k, v in fields.items()}


def _on(handle: PolicyHandle, dev: DeviceContext, dtype: torch.dtype) -> EnvPolicy:
    """A copy of the policy on `dev` in `dtype` (the normalizer's statistics stay float32)."""
    model: EnvPolicy = copy.deepcopy(handle.model)
    model.to(device=dev.device, dtype=dtype).eval()
    return model


def precision_table(
    handle: PolicyHandle,
    dev: DeviceContext,
    dtypes: list[str],
    obs: Fields,
    min_cosine: float = 0.999,
    max_abs: float = 0.01,
) -> list[PrecisionRow]:
    x = fields_to_torch(handle.as_input(obs))
    reference = policy_outputs(handle, handle.model.float().cpu(), x).double()
    rows = []
    for name in dtypes:
        dtype = DTYPES[name]
        # Frames stay uint8 (the model scales them); float inputs take the dtype under test.
        got = policy_outputs(handle, _on(handle, dev, dtype), _to(x, dev.device, dtype)).cpu().double()
        cos = float(torch.nn.functional.cosine_similarity(got.flatten(), reference.flatten(), dim=0))
        err = float((got - reference).abs().max())
        rows.append(PrecisionRow(name, cos, err, cos >= min_cosine and err <= max_abs))
    return rows


@torch.no_grad()
def fingerprint(
    handle: PolicyHandle, dev: DeviceContext, seed: int = 0, steps: int = 256, batch: int = 8
) -> str:
    """sha256 of stochastic actions over a seeded observation stream (noise from a CPU generator)."""
    gen = torch.Generator().manual_seed(seed)
    model = _on(handle, dev, torch.float32)
    digest = hashlib.sha256()
    for _ in range(steps):
        obs = _to(handle.synthetic_obs(batch, gen), dev.device, torch.float32)
        noise = draw_noise(handle.model.action, batch, gen)
        params, _ = model.policy_step(obs)
        actions = model.sample_actions(params, noise.to(dev.device), obs.get("action_mask")).cpu()
        if handle.continuous:
            actions = torch.round(handle.action_transform(actions) * 1e4).to(torch.int64)
        digest.update(actions.numpy().astype(np.int64).tobytes())
    return digest.hexdigest()


@dataclass
class Latency:
    runtime: str
    batch: int
    cold_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float


def _percentiles(samples: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return q[49], q[94], q[98]


def torch_latency(handle: PolicyHandle, dev: DeviceContext, obs: Fields, runs: int = 200) -> Latency:
    """Latency of the torch policy on `dev` on one batch of input fields [B, ...]."""
    model = _on(handle, dev, torch.float32)
    x = _to(fields_to_torch(obs), dev.device, torch.float32)
    batch = rows_of(obs)

    def call() -> float:
        dev.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            model.policy_step(x)
        dev.synchronize()
        return (time.perf_counter() - t0) * 1e3

    cold = call()
    for _ in range(20):
        call()
    p50, p95, p99 = _percentiles([call() for _ in range(runs)])
    return Latency(f"torch {dev}", batch, cold, p50, p95, p99)


def ort_latency(model_bytes: bytes, obs: Fields, runs: int = 200) -> Latency:
    """Latency of onnxruntime on one batch of input fields [B, ...] (the graph's inputs)."""
    import onnxruntime as ort

    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    x = dict(obs)
    batch = rows_of(obs)

    def call() -> float:
        t0 = time.perf_counter()
        session.run(None, x)
        return (time.perf_counter() - t0) * 1e3

    cold = call()
    for _ in range(20):
        call()
    p50, p95, p99 = _percentiles([call() for _ in range(runs)])
    return Latency("onnxruntime cpu", batch, cold, p50, p95, p99)


@dataclass
class VerifyOptions:
    dtypes: list[str]
    device: str = "auto"
    batch: int = 256
    min_cosine: float = 0.999
    max_abs: float = 0.01
    seed: int = 0
    env: NamedEnv | None = None  # record observations in this env too (named on the command line)


def verification_observations(handle: PolicyHandle, seed: int, env: NamedEnv | None) -> Fields:
    obs = handle.as_input(fields_to_numpy(handle.synthetic_obs(100, torch.Generator().manual_seed(seed))))
    if env is not None:
        obs = concat_fields([obs, recorded_observations(handle, env, 100, seed)])
    return obs


def run_verify(handle: PolicyHandle, opts: VerifyOptions) -> tuple[str, bool]:
    """The full report as text, and whether every requested dtype passed."""
    dev = resolve_device(opts.device)
    obs = verification_observations(handle, opts.seed, opts.env)
    rows = precision_table(handle, dev, opts.dtypes, obs, opts.min_cosine, opts.max_abs)
    lines = [
        f"model: {handle.source}  obs_dim={handle.obs_dim}  device={dev}  observations={rows_of(obs)}",
        "",
        f"precision vs cpu float32 (pass: cosine >= {opts.min_cosine}, max abs <= {opts.max_abs})",
        f"{'dtype':>9} | {'cosine':>10} | {'max abs':>10} | result",
        "-" * 44,
    ]
    lines += [
        f"{r.dtype:>9} | {r.cosine:10.6f} | {r.max_abs:10.2e} | {'pass' if r.passed else 'FAIL'}"
        for r in rows
    ]
    lines += [
        "",
        f"fingerprint (seed {opts.seed}, stochastic, noise on cpu): {fingerprint(handle, dev, opts.seed)}",
    ]
    model_bytes = onnx_bytes(handle)
    lines += [
        "",
        "latency ms (after 20 warm-up calls, 200 timed)",
        f"{'runtime':>16} | {'batch':>5} | {'cold':>8} | {'p50':>8} | {'p95':>8} | {'p99':>8}",
        "-" * 66,
    ]
    for batch in (1, opts.batch):
        # the same inputs for both runtimes
        x = handle.as_input(fields_to_numpy(handle.synthetic_obs(batch, torch.Generator().manual_seed(0))))
        for lat in (torch_latency(handle, dev, x), ort_latency(model_bytes, x)):
            lines.append(
                f"{lat.runtime:>16} | {lat.batch:>5} | {lat.cold_ms:8.3f} | {lat.p50_ms:8.3f} | "
                f"{lat.p95_ms:8.3f} | {lat.p99_ms:8.3f}"
            )
    return "\n".join(lines), all(r.passed for r in rows)
