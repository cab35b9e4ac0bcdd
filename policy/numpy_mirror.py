"""CPU acting for rollout workers: a numpy fast path for MLP policies (and their recurrent cores),
tied to the torch policy by tests, and the torch policy itself for the others (the token transformer).

Rollout workers act on batches of 8-64 observations, where torch's per-op dispatch (~5 us) costs
more than the arithmetic; numpy does the same few matmuls in about a microsecond each. The torch
ActorCritic stays the reference (the learner trains it and computes log-probs from it); this
class only mirrors its forward pass from the same weights. Noise still comes from the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch

from ..contracts.config import ModelConfig
from ..contracts.segment import Fields, as_fields
from ..contracts.spaces import ActionSpec
from ..policy.actor_critic import STATE, fields_to_torch, mirror_parts
from ..policy.cores import RecurrentCore, core_class
from ..policy.distributions import distribution
from ..policy.encoders import EncoderPlan, flat_obs, np_encode_others
from ..policy.models import ActorCritic, model_kind
from ..policy.models.mlp import Trunk as MlpTrunk
from ..policy.normalizer import CLIP

# actions [B, *act], logp [B], value [B], and the recurrent state after the step [B, S] (None
# without a core)
Acted = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]


def _activation(name: str) -> Callable[[np.ndarray], np.ndarray]:
    if name == "tanh":
        return np.tanh
    if name == "relu":
        return lambda x: np.maximum(x, 0.0)
    return lambda x: x / (1.0 + np.exp(-x))  # silu


def _as_float32(value: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=np.float32)


def _block_diag(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.zeros((a.shape[0] + b.shape[0], a.shape[1] + b.shape[1]), dtype=np.float32)
    out[: a.shape[0], : a.shape[1]] = a
    out[a.shape[0] :, a.shape[1] :] = b
    return out


class NumpyPolicy:
    """The ActorCritic forward in float32 numpy (MLP trunks over a plain observation, or over a
    tree's encoders where every one has a numpy mirror), then the action distribution's numpy
    sampling (`policy/distributions/`).

    The policy and value trunks run fused, one matmul per layer: the first layers side by side,
    the deeper ones block-diagonal, and one head producing [logits or mean | value]. For a batch
    of 8 observations a matmul costs its call overhead, so fewer, wider ones are faster.
    """

    def __init__(
        self,
        action: ActionSpec,
        activation: str,
        shared_trunk: bool,
        normalize_obs: bool,
        plan: EncoderPlan | None = None,
        core: type[RecurrentCore] | None = None,
    ) -> None:
        self.action = action
        self.core = core
        # (prepared cell, its state width) for the policy core, then the value core if any
        self.cores: list[tuple[object, int]] = []
        self.pi_width = 0  # features of the policy trunk; the value trunk's follow them
        self.dist = distribution(action.kind)
        self.plan = plan
        self.act_fn = _activation(activation)
        self.shared_trunk = shared_trunk
        self.normalize_obs = normalize_obs
        self.layers: list[tuple[np.ndarray, np.ndarray]] = []
        self.has_value = False
        self.global_stats: tuple[np.ndarray, np.ndarray] | None = None  # a centralized critic's

    def load(self, state: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        """Copy weights (transposed for x @ W, fused) from the torch policy's state dict, each
        part as the component that owns it reads it (`actor_critic.mirror_parts`)."""
        parts = mirror_parts({k: _as_float32(v) for k, v in state.items()}, MlpTrunk.np_layers)
        pi, v = list(parts.pi_layers), parts.v_layers
        head_w, head_b = parts.pi_head
        self.has_value = parts.v_head is not None
        self.global_stats = parts.global_stats
        if parts.global_stats is not None:  # a centralized critic: [x | state] in, zero rows for pi
            rows = parts.global_stats[0].shape[0]
            pi[0] = (np.vstack([pi[0][0], np.zeros((rows, pi[0][0].shape[1]), np.float32)]), pi[0][1])
        if parts.v_head is not None and v:  # separate trunks, fused side by side
            layers = [(np.hstack([pi[0][0], v[0][0]]), np.concatenate([pi[0][1], v[0][1]]))]
            layers += [
                (_block_diag(wp, wv), np.concatenate([bp, bv]))
                for (wp, bp), (wv, bv) in zip(pi[1:], v[1:], strict=True)
            ]
            head_w = _block_diag(head_w, parts.v_head[0])
        else:
            layers = pi
            if parts.v_head is not None:  # shared trunk: one head matmul for both outputs
                head_w = np.hstack([head_w, parts.v_head[0]])
        if parts.v_head is not None:
            head_b = np.concatenate([head_b, parts.v_head[1]])
        self.layers = [(np.ascontiguousarray(w), b.copy()) for w, b in layers]
        self.pi_width = pi[-1][0].shape[1] if pi else 0
        self.cores = []
        if self.core is not None:
            self.cores = [(self.core.np_prepare(cell), self.core.np_width(cell)) for cell in parts.cores]
        self.head = (np.ascontiguousarray(head_w), head_b.copy())
        self.log_std = parts.log_std if self.dist.learned_log_std else None
        self.mean, self.inv_scale = parts.normalizer

    def _normalize(self, x: np.ndarray, stats: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """x normalized by the observation's statistics, or `stats` (mean, 1 / std)."""
        if not self.normalize_obs:
            return x
        mean, inv_scale = stats if stats is not None else (self.mean, self.inv_scale)
        # minimum/maximum: two ufunc calls, cheaper than np.clip's wrapper on tiny batches
        return np.minimum(np.maximum((x - mean) * inv_scale, -CLIP), CLIP)

    def _input(self, fields: Fields) -> np.ndarray:
        """The fused first layer's input: the trunk's [B, D] (the normalized observation, or a
        tree's encoded features), with a centralized critic's normalized global state after it
        [B, D + S]."""
        x = self._trunk_input(fields)
        if self.global_stats is None:
            return x
        state = self._normalize(fields["global_state"].astype(np.float32, copy=False), self.global_stats)
        return np.concatenate([x, state], axis=-1)

    def _trunk_input(self, fields: Fields) -> np.ndarray:
        if self.plan is None:
            obs = fields["obs"]
            return self._normalize(obs.reshape(obs.shape[0], -1).astype(np.float32, copy=False))
        batch = next(iter(fields.values())).shape[0]
        flat = flat_obs(self.plan, fields, batch)
        parts = [] if flat is None else [self._normalize(flat)]
        parts += np_encode_others(self.plan, fields, batch)
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-1)

    def _forward(self, inputs: Fields | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(distribution params [B, param_size], value [B], the state after the step or None)."""
        fields = as_fields(inputs)
        x = self._input(fields)
        for w, b in self.layers:
            x = self.act_fn(x @ w + b)
        state = None
        if self.cores:
            x, state = self._through_cores(x, fields[STATE])
        out = x @ self.head[0] + self.head[1]
        n = self.action.param_size
        value = out[:, n] if self.has_value else np.zeros(x.shape[0], dtype=np.float32)
        return out[:, :n], value, state

    def _through_cores(self, x: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Trunk features [B, pi (| v)] through the policy core (and the value core, on the value
        trunk's features) from `state` [B, S]: (features for the fused head, next state)."""
        parts = [x] if len(self.cores) == 1 else [x[:, : self.pi_width], x[:, self.pi_width :]]
        outs, states, offset = [], [], 0
        assert self.core is not None
        for (prepared, size), feat in zip(self.cores, parts, strict=True):
            width = size * self.core.state_per_unit
            out, after = self.core.np_step(prepared, feat, state[:, offset : offset + width])
            offset += width
            outs.append(out)
            states.append(after)
        features = outs[0] if len(outs) == 1 else np.concatenate(outs, axis=1)
        return features, np.concatenate(states, axis=1).astype(np.float32, copy=False)

    def act(self, inputs: Fields | np.ndarray, noise: np.ndarray) -> Acted:
        """(actions [B, *act], logp [B], value [B], state) with caller noise, as
        ActorCritic.act_with_state."""
        params, value, state = self._forward(inputs)
        mask = as_fields(inputs).get("action_mask")
        actions, logp = self.dist.np_act(self.action, params, noise, mask, self.log_std)
        return actions, logp, value, state

    def value(self, inputs: Fields | np.ndarray) -> np.ndarray:
        return self._forward(inputs)[1]


class TorchCpuPolicy:
    """The torch policy itself behind NumpyPolicy's interface (numpy in, numpy out)."""

    def __init__(self, policy: ActorCritic) -> None:
        self.policy = policy.eval()

    def load(self, state: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        # torch.tensor copies: arrays from Ray's object store are read-only
        self.policy.load_state_dict(
            {k: v if torch.is_tensor(v) else torch.tensor(v) for k, v in state.items()}
        )

    def act(self, inputs: Fields | np.ndarray, noise: np.ndarray) -> Acted:
        fields = fields_to_torch(as_fields(inputs))
        actions, logp, value, state = self.policy.act_with_state(fields, torch.from_numpy(noise))
        return actions.numpy(), logp.numpy(), value.numpy(), None if state is None else state.numpy()

    def value(self, inputs: Fields | np.ndarray) -> np.ndarray:
        return self.policy.value(fields_to_torch(as_fields(inputs))).numpy()


def cpu_policy(model: ModelConfig, policy: ActorCritic) -> NumpyPolicy | TorchCpuPolicy:
    """What a rollout worker acts with: the numpy mirror where the model kind has one (MLPs, with
    or without a recurrent core), else the torch policy."""
    plan = policy.encoder.plan if policy.encoder is not None else None
    if not model_kind(model.kind).numpy_mirror or (plan is not None and not plan.numpy_mirror):
        return TorchCpuPolicy(policy)
    fast = NumpyPolicy(
        policy.action,
        model.activation,
        model.shared_trunk,
        policy.normalizer.enabled,
        plan,
        core=core_class(model.recurrent),
    )
    fast.load(policy.state_dict())
    return fast
