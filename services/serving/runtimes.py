"""What answers `POST /act`: a policy handle run by torch or by onnxruntime, on a device.

Both take observations [B, *obs_shape], a per-row `deterministic` flag and caller noise [B] or
[B, A] (drawn on the CPU from each request's seed, as `relay verify`'s fingerprint does), and
return actions [B, *act]. Deterministic rows get the greedy action (argmax, or the Gaussian mean
after the source's action transform); the others are sampled with their noise, so a request with a
seed is answered bit for bit the same on every call.

The onnxruntime runtime runs relay's export of the handle (`services/tools/export.py`): the
handle was checked against its original file when it was loaded, and the export against the
handle when it is built.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from learner.device import DeviceContext, DeviceError, resolve_device
from services.tools.export import TOLERANCE, max_abs_error, onnx_bytes
from services.tools.handle import PolicyHandle

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
    def act(self, obs: np.ndarray, deterministic: np.ndarray, noise: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(self.handle.as_input(obs)).to(self.dev.device)
        params, _ = self.model.distribution_params(x)
        if self.handle.continuous:
            greedy = params.float()
            sampled = self.model.sample_actions(params, torch.from_numpy(noise).to(self.dev.device))
            rows = torch.from_numpy(deterministic).to(self.dev.device).unsqueeze(-1)
            return self.handle.action_transform(torch.where(rows, greedy, sampled)).cpu().numpy()
        sampled = self.model.sample_actions(params, torch.from_numpy(noise).to(self.dev.device))
        rows = torch.from_numpy(deterministic).to(self.dev.device)
        return torch.where(rows, params.argmax(-1), sampled).cpu().numpy()


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
        obs = handle.synthetic_obs(256, torch.Generator().manual_seed(0)).numpy()
        err = max_abs_error(handle, data, obs)
        if not err <= TOLERANCE:
            raise RuntimeError(f"the ONNX export differs from the policy by {err:.3g}; not serving it")
        providers = ort_providers(device)
        self.session = ort.InferenceSession(data, providers=providers)
        self.device = providers[0].removesuffix("ExecutionProvider").lower()
        self.outputs = [o.name for o in self.session.get_outputs()]

    def act(self, obs: np.ndarray, deterministic: np.ndarray, noise: np.ndarray) -> np.ndarray:
        got = dict(zip(self.outputs, self.session.run(None, {"obs": self.handle.as_input(obs)}), strict=True))
        if self.handle.continuous:
            sampled = got["mean"] + got["std"] * noise
            sampled = self.handle.action_transform(torch.from_numpy(sampled.astype(np.float32))).numpy()
            return np.where(deterministic[:, None], got["action"], sampled)
        logits = got["logits"].astype(np.float64)
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        # Inverse-CDF sampling, as the torch policy's: the count of CDF entries below u.
        sampled = np.minimum((np.cumsum(probs, axis=-1) < noise[:, None]).sum(axis=-1), probs.shape[-1] - 1)
        return np.where(deterministic, got["action"], sampled)


RUNTIMES: dict[str, Any] = {"torch": TorchRuntime, "onnxruntime": OrtRuntime}
