"""What answers `POST /act`: a policy handle run by torch or by onnxruntime, on a device.

Both take the policy's input fields (observation leaves, the action mask and, for a recurrent
policy, the state "h_in"; each [B, ...]), a
per-row `deterministic` flag and caller noise (`ActionSpec.noise_shape`, drawn on the CPU from each
request's seed, as `relay verify`'s fingerprint does), and return the env's actions [B, *env
action shape]. Deterministic rows get the greedy action (the most likely allowed choice, bits with
p > 0.5, or the Gaussian mean after the source's action transform); the others are sampled with
their noise, so a request with a seed is answered bit for bit the same on every call. A recurrent
policy's state after the step comes back beside the actions ([B, S]; None for the others).

The onnxruntime runtime runs relay's export of the handle (`services/tools/export.py`): the
handle was checked against its original file when it was loaded, and the export against the
handle when it is built.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from ...contracts.segment import Fields
from ...learner.device import DeviceContext, DeviceError, resolve_device
from ...policy.actor_critic import fields_to_numpy, fields_to_torch
from ...services.tools.export import TOLERANCE, max_abs_error, onnx_bytes
from ...services.tools.handle import PolicyHandle
from ...services.tools.onnx_check import cpu_session

ORT_PROVIDERS = {
    "cuda": "CUDAExecutionProvider",
    "npu": "CANNExecutionProvider",
    "cpu": "CPUExecutionProvider",
}


class TorchRuntime:
    """The torch policy on `device` (cpu, cuda or npu through the device layer)."""

    name = "torch"

    def __init__(self, handle: PolicyHandle, device: str = "auto") -> None:
        self.handle = handle
        self.dev: DeviceContext = resolve_device(device)
        self.model = copy.deepcopy(handle.model).to(self.dev.device).eval()
        self.device = str(self.dev)

    @torch.no_grad()
    def act(
        self, obs: Fields, deterministic: np.ndarray, noise: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray | None]:
        x = {k: v.to(self.dev.device) for k, v in fields_to_torch(self.handle.as_input(obs)).items()}
        mask = x.get("action_mask")
        params, state = self.model.policy_step(x)
        sampled = self.model.sample_actions(params, torch.from_numpy(noise).to(self.dev.device), mask)
        greedy = self.model.dist.deterministic(self.model.action, params, mask)
        rows = torch.from_numpy(deterministic).to(self.dev.device).reshape(-1, *[1] * (sampled.dim() - 1))
        chosen = torch.where(rows, greedy.to(sampled.dtype), sampled)
        if self.handle.continuous:
            chosen = self.handle.action_transform(chosen)
        after = None if state is None else state.float().cpu().numpy()
        return self.handle.env.action.to_env(chosen.cpu().numpy()), after


def ort_providers(device: str) -> list[str]:
    """onnxruntime's execution providers for a device spec (the CPU one last, as a fallback).

    npu runs on onnxruntime-cann's CANN provider (`pip install "relay-rl[npu-serve]"` on an
    Ascend host), cuda on onnxruntime-gpu's CUDA provider; a provider this onnxruntime lacks is
    a DeviceError in one line.
    """
    import onnxruntime as ort

    kind = device.split(":")[0]
    if kind == "auto":
        kind = next((k for k in ("npu", "cuda") if ORT_PROVIDERS[k] in ort.get_available_providers()), "cpu")
    provider = ORT_PROVIDERS.get(kind)
    if provider is None:
        raise DeviceError(f"--device {device!r}: expected auto, cpu, cuda[:i] or npu[:i]")
    if provider not in ort.get_available_providers():
        package = "onnxruntime-cann" if kind == "npu" else "onnxruntime-gpu"
        raise DeviceError(f"--device {device} --runtime onnxruntime needs {provider} (install {package})")
    return [provider] if kind == "cpu" else [provider, "CPUExecutionProvider"]


class OrtRuntime:
    """onnxruntime on relay's export of the handle."""

    name = "onnxruntime"

    def __init__(self, handle: PolicyHandle, device: str = "auto") -> None:
        import onnxruntime as ort

        self.handle = handle
        data = onnx_bytes(handle)
        obs = fields_to_numpy(handle.synthetic_obs(256, torch.Generator().manual_seed(0)))
        check = cpu_session(data)
        err = max_abs_error(handle, check, obs)
        if not err <= TOLERANCE:
            raise RuntimeError(f"the ONNX export differs from the policy by {err:.3g}; not serving it")
        providers = ort_providers(device)
        cpu_only = providers == ["CPUExecutionProvider"]
        self.session = check if cpu_only else ort.InferenceSession(data, providers=providers)
        self.device = providers[0].removesuffix("ExecutionProvider").lower()
        self.outputs = [o.name for o in self.session.get_outputs()]

    def act(
        self, obs: Fields, deterministic: np.ndarray, noise: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray | None]:
        x = self.handle.as_input(obs)
        got = dict(zip(self.outputs, self.session.run(None, x), strict=True))
        spec = self.handle.env.action
        if self.handle.continuous:
            sampled = got["mean"] + got["std"] * noise
            sampled = self.handle.action_transform(torch.from_numpy(sampled.astype(np.float32))).numpy()
        else:
            # The distribution's numpy sampling (the acting mirror's): inverse-CDF per component.
            dist = self.handle.model.dist
            sampled = dist.np_act(spec, got["logits"].astype(np.float32), noise, x.get("action_mask"), None)[
                0
            ]
        sampled = spec.to_env(sampled)
        rows = deterministic.reshape(-1, *[1] * (sampled.ndim - 1))
        return np.where(rows, got["action"], sampled), got.get("h_out")


RUNTIMES: dict[str, Any] = {"torch": TorchRuntime, "onnxruntime": OrtRuntime}
