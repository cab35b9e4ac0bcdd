"""CPU acting for rollout workers: a numpy fast path for MLP policies, tied to the torch policy
by a test, and the torch policy itself for the others (the token transformer).

Rollout workers act on batches of 8-64 observations, where torch's per-op dispatch (~5 us) costs
more than the arithmetic; numpy does the same few matmuls in about a microsecond each. The torch
ActorCritic stays the reference (the learner trains it and computes log-probs from it); this
class only mirrors its forward pass from the same weights. Noise still comes from the caller.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from learner.models import ActionSpec, ActorCritic
from learner.normalizer import CLIP
from services.config import ModelConfig


def _activation(name: str):  # type: ignore[no-untyped-def]
    if name == "tanh":
        return np.tanh
    if name == "relu":
        return lambda x: np.maximum(x, 0.0)
    return lambda x: x / (1.0 + np.exp(-x))  # silu


class NumpyPolicy:
    """The ActorCritic forward in float32 numpy (MLP trunks only)."""

    def __init__(self, action: ActionSpec, activation: str, shared_trunk: bool, normalize_obs: bool) -> None:
        self.action = action
        self.act_fn = _activation(activation)
        self.shared_trunk = shared_trunk
        self.normalize_obs = normalize_obs
        self.layers: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}

    def load(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy weights (transposed for x @ W) from the torch policy's state dict."""
        arr = {k: v.detach().cpu().float().numpy() for k, v in state.items()}
        for trunk in ("pi_trunk", "v_trunk"):
            idx = sorted(
                int(k.split(".")[2]) for k in arr if k.startswith(f"{trunk}.net.") and k.endswith(".weight")
            )
            self.layers[trunk] = [
                (arr[f"{trunk}.net.{i}.weight"].T.copy(), arr[f"{trunk}.net.{i}.bias"]) for i in idx
            ]
        self.pi_head = (arr["pi_head.weight"].T.copy(), arr["pi_head.bias"])
        self.v_head = (arr["v_head.weight"].T.copy(), arr["v_head.bias"]) if "v_head.weight" in arr else None
        self.log_std = arr.get("log_std")
        self.mean = arr["normalizer.mean"]
        self.scale = np.sqrt(arr["normalizer.var_sum"] / arr["normalizer.steps"])

    def _trunk(self, name: str, x: np.ndarray) -> np.ndarray:
        for w, b in self.layers[name]:
            x = self.act_fn(x @ w + b)
        return x

    def _features(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = obs.reshape(obs.shape[0], -1).astype(np.float32, copy=False)
        if self.normalize_obs:
            x = np.clip((x - self.mean) / self.scale, -CLIP, CLIP)
        pi = self._trunk("pi_trunk", x)
        if self.v_head is None:
            return pi, np.zeros(obs.shape[0], dtype=np.float32)
        v_feat = pi if self.shared_trunk or not self.layers.get("v_trunk") else self._trunk("v_trunk", x)
        return pi, (v_feat @ self.v_head[0] + self.v_head[1])[:, 0]

    def act(self, obs: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(actions [B, *act], logp [B], value [B]) with caller noise, as ActorCritic.act."""
        feat, value = self._features(obs)
        params = feat @ self.pi_head[0] + self.pi_head[1]
        if self.action.kind == "discrete":
            z = params - params.max(axis=-1, keepdims=True)
            log_probs = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
            cdf = np.cumsum(np.exp(log_probs), axis=-1)
            actions = np.minimum((cdf < noise[:, None]).sum(axis=-1), self.action.size - 1)
            return actions.astype(np.int64), log_probs[np.arange(len(actions)), actions], value
        std = np.exp(self.log_std)
        actions = (params + std * noise).astype(np.float32)
        logp = (-0.5 * noise**2 - self.log_std - 0.5 * np.log(2 * np.pi)).sum(axis=-1)
        return actions, logp.astype(np.float32), value

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self._features(obs)[1]


class TorchCpuPolicy:
    """The torch policy itself behind NumpyPolicy's interface (numpy in, numpy out)."""

    def __init__(self, policy: ActorCritic) -> None:
        self.policy = policy.eval()

    def load(self, state: Mapping[str, torch.Tensor]) -> None:
        self.policy.load_state_dict(state)

    def act(self, obs: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        actions, logp, value = self.policy.act(torch.from_numpy(obs), torch.from_numpy(noise))
        return actions.numpy(), logp.numpy(), value.numpy()

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self.policy.value(torch.from_numpy(obs)).numpy()


def cpu_policy(model: ModelConfig, policy: ActorCritic) -> NumpyPolicy | TorchCpuPolicy:
    """What a rollout worker acts with: the numpy mirror for MLPs, else the torch policy."""
    if model.kind != "mlp":
        return TorchCpuPolicy(policy)
    fast = NumpyPolicy(policy.action, model.activation, model.shared_trunk, model.normalize_obs)
    fast.load(policy.state_dict())
    return fast
