"""The policy: normalizer (or, for a tree observation, the encoders of `policy/encoders/`) ->
trunk(s) -> an action head for the action space's distribution (`policy/distributions/`) (+ a
value head unless the algorithm is critic-free). Trunks come from the model registry
(`policy/models/__init__.py`).

Inputs are the Segment's policy fields: "obs" (or "obs/<path>" per leaf) and, where the env has
masks, "action_mask" [B, param_size] bool; a bare tensor means {"obs": tensor}. A centralized critic
(multi_agent.central_critic) also reads "global_state" [B, S]: its value trunk takes the
normalized state beside the observation's features, and the acting path never reads it.

With a recurrent core (`policy/cores/`, between the trunk and the heads) the inputs also carry
"h_in" [k, state_size], the state entering each of k sequences, and optionally "starts" [B] bool
(an episode starts at the row: its state is zeroed first). The B = k * T rows are k sequences one
after another, each T steps in time order (T = 1 when acting: one step per env).

Exploration noise always comes from the caller (`act(obs, noise)`), drawn on the CPU from a seeded
generator, so sampling is bit-identical whatever device runs the network.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from ..contracts.segment import Fields
from ..contracts.spaces import ActionSpec
from ..policy.cores import RecurrentCore
from ..policy.distributions import distribution
from ..policy.encoders import EncoderPlan, ObsEncoder
from ..policy.normalizer import ObsNormalizer
from ..policy.trunk import TrunkModule

Inputs = Tensor | Mapping[str, Tensor]  # a plain observation [B, *obs], or the input fields


def draw_noise(action: ActionSpec, batch: int, generator: torch.Generator) -> Tensor:
    """Exploration noise on the CPU from a seeded generator (the same bits on any device), shaped
    as `action.noise_shape(batch)`: uniforms for choices and bits, standard normals for Box."""
    return distribution(action.kind).draw_noise(action, batch, generator)


def as_fields(x: Inputs) -> Mapping[str, Tensor]:
    """Input fields of a plain observation tensor ({"obs": x}) or the fields themselves."""
    return {"obs": x} if isinstance(x, Tensor) else x


def fields_to_torch(fields: Mapping[str, np.ndarray]) -> dict[str, Tensor]:
    """Input fields as CPU tensors (contiguous copies only where numpy's are not)."""
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in fields.items()}


def fields_to_numpy(fields: Mapping[str, Tensor]) -> Fields:
    return {k: v.numpy() for k, v in fields.items()}


def batch_size(x: Inputs) -> int:
    return next(iter(as_fields(x).values())).shape[0]


def init_linear(module: nn.Module, gain: float) -> None:
    """Orthogonal weights with `gain`, zero biases, for every Linear in `module`."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)


# Input fields a recurrent policy reads besides the observation: per sequence, and per row.
# (STATE is also the input's name in exported graphs, whose output "h_out" is the next state.)
STATE, STARTS = "h_in", "starts"


@dataclass
class PolicyOutput:
    """What the learner needs per step: log-prob [B], entropy [B], value [B] (None without a critic)."""

    logp: Tensor
    entropy: Tensor
    value: Tensor | None


Layers = list[tuple[np.ndarray, np.ndarray]]  # (W [in, out], b [out]) float32, in order


def child_state(state: Mapping[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    """The state dict of submodule `name` out of its parent's (the prefix "name." removed)."""
    prefix = f"{name}."
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


@dataclass(frozen=True)
class MirrorParts:
    """An ActorCritic's weights as its numpy mirror needs them (policy/numpy_mirror.py), each part
    read by the component that owns it: trunks' layers by the trunk, statistics by the
    normalizer, cells by the core. v_layers is empty for a shared trunk, v_head None without a
    critic, global_stats None without a centralized critic, cores the policy core's cell and then
    the value core's (none without a core)."""

    pi_layers: Layers
    v_layers: Layers
    pi_head: tuple[np.ndarray, np.ndarray]
    v_head: tuple[np.ndarray, np.ndarray] | None
    normalizer: tuple[np.ndarray, np.ndarray]  # mean, 1 / std
    global_stats: tuple[np.ndarray, np.ndarray] | None
    log_std: np.ndarray | None
    cores: list[dict[str, np.ndarray]]


def mirror_parts(
    state: Mapping[str, np.ndarray], trunk_layers: Callable[[dict[str, np.ndarray]], Layers]
) -> MirrorParts:
    """The parts of an ActorCritic's float32 state dict (its attribute names are its own: they
    are read here, beside the class that names them); `trunk_layers` reads a trunk's state."""

    def head(name: str) -> tuple[np.ndarray, np.ndarray] | None:
        linear = child_state(state, name)
        return (linear["weight"].T, linear["bias"]) if linear else None

    pi_head = head("pi_head")
    assert pi_head is not None
    glob = child_state(state, "global_normalizer")
    return MirrorParts(
        pi_layers=trunk_layers(child_state(state, "pi_trunk")),
        v_layers=trunk_layers(child_state(state, "v_trunk")),
        pi_head=pi_head,
        v_head=head("v_head"),
        normalizer=ObsNormalizer.np_stats(child_state(state, "normalizer")),
        global_stats=ObsNormalizer.np_stats(glob) if glob else None,
        log_std=state.get("log_std"),
        cores=[cell for name in ("pi_core", "v_core") if (cell := child_state(state, name))],
    )


class ActorCritic(nn.Module):
    """Normalizer -> trunk(s) -> categorical logits or Gaussian mean (+ state-independent log-std).

    With `critic=False` no value network is built (GRPO), saving its parameters and memory.
    `make_trunk` builds each trunk: any module mapping observations [B, *obs_shape] (normalized,
    float32 or the weights' dtype) to features [B, out_dim], with `out_dim` and `checkpointing`
    attributes.
    """

    log_std: nn.Parameter  # [A], continuous actions only

    def __init__(
        self,
        obs_dim: int,
        action: ActionSpec,
        make_trunk: Callable[[], TrunkModule],
        *,
        shared_trunk: bool = False,
        critic: bool = True,
        init_log_std: float = 0.0,
        normalize_obs: bool = True,
        normalize_reward: bool = False,
        plan: EncoderPlan | None = None,
        make_core: Callable[[int], RecurrentCore] | None = None,
        burn_in: int = 0,
        global_state: int = 0,
        make_value_trunk: Callable[[], TrunkModule] | None = None,
    ) -> None:
        """`global_state`: floats of the env's global state the value trunk reads beside the
        trunk input (`make_value_trunk` builds that trunk, reading in_dim + global_state), or
        alone (a trunk that `reads_state_only`)."""
        super().__init__()
        if global_state and (shared_trunk or not critic):
            raise ValueError("a centralized critic needs a value trunk of its own (model.shared_trunk=false)")
        self.action = action
        self.dist = distribution(action.kind)
        # A tree observation is encoded leaf by leaf (`plan`); the normalizer then covers its flat
        # leaves only, and the trunk reads the encoder's features (obs_dim must be its out_dim).
        self.encoder: ObsEncoder | None = ObsEncoder(plan) if plan is not None else None
        norm_dim = plan.flat_dim if plan is not None else obs_dim
        self.normalizer = ObsNormalizer((max(norm_dim, 1),), enabled=normalize_obs and norm_dim > 0)
        # Running statistics of the discounted return (reward scaling), shipped with the weights;
        # only present when used, so other policies' state dicts stay as they were.
        self.return_stats: ObsNormalizer | None = ObsNormalizer((1,)) if normalize_reward else None
        # The global state's own float32 statistics (a centralized critic's), shipped likewise.
        self.global_normalizer: ObsNormalizer | None = (
            ObsNormalizer((global_state,), enabled=normalize_obs) if global_state else None
        )
        self.pi_trunk = make_trunk()
        self.v_trunk: TrunkModule | None = None
        if critic and not shared_trunk:
            self.v_trunk = (make_value_trunk or make_trunk)()
        self.shared_trunk = shared_trunk
        out_dim = self.pi_trunk.out_dim
        # A value trunk of its own may be of another width (one over the global state alone).
        v_dim = out_dim if self.v_trunk is None else self.v_trunk.out_dim
        # The core sits after the trunk; a value trunk of its own gets a core of its own.
        self.pi_core: RecurrentCore | None = None
        self.v_core: RecurrentCore | None = None
        if make_core is not None:
            self.pi_core = make_core(out_dim)
            out_dim = self.pi_core.out_dim
            if self.v_trunk is not None:
                self.v_core = make_core(v_dim)
            v_dim = out_dim if self.v_core is None else self.v_core.out_dim
        self.burn_in = burn_in
        self.pi_head = nn.Linear(out_dim, action.param_size)
        init_linear(self.pi_head, 0.01)
        self.v_head: nn.Linear | None = nn.Linear(v_dim, 1) if critic else None
        if self.v_head is not None:
            init_linear(self.v_head, 1.0)
        if distribution(action.kind).learned_log_std:
            self.log_std = nn.Parameter(torch.full((action.size,), float(init_log_std)))

    def synthetic_obs(self, batch: int, obs_shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
        """[batch, *obs_shape] observations this policy accepts, for checks without an env."""
        return self.pi_trunk.synthetic_input(batch, obs_shape, generator)

    @property
    def has_critic(self) -> bool:
        return self.v_head is not None

    @property
    def recurrent(self) -> bool:
        return self.pi_core is not None

    @property
    def state_size(self) -> int:
        """Floats of state per env: the policy core's, then the value core's (0 without a core)."""
        return sum(c.state_size for c in (self.pi_core, self.v_core) if c is not None)

    @property
    def acting_state_size(self) -> int:
        """Floats of state acting alone carries (`policy_step`): the policy core's."""
        return 0 if self.pi_core is None else self.pi_core.state_size

    def initial_state(self, batch: int) -> Tensor | None:
        """The state [batch, S] each env's episode starts from (zeros), or None without a core."""
        if not self.state_size:
            return None
        return torch.zeros(batch, self.state_size, device=next(self.parameters()).device)

    def acting_weights(self) -> dict[str, Tensor]:
        """Every weight the acting side reads (normalizer statistics included), as contiguous CPU
        tensors whatever the learner's layout (channels-last kernels)."""
        return {
            k: v.detach().to("cpu", copy=True, memory_format=torch.contiguous_format)
            for k, v in self.state_dict().items()
        }

    def set_checkpointing(self, enabled: bool) -> None:
        for trunk in (self.pi_trunk, self.v_trunk):
            if trunk is not None:
                trunk.checkpointing = enabled

    def _trunk_input(self, fields: Mapping[str, Tensor]) -> Tensor:
        if self.encoder is not None:
            return self.encoder(fields, self.normalizer).to(self.pi_head.weight.dtype)
        return self._plain_input(fields["obs"])

    def policy_step(self, inputs: Inputs) -> tuple[Tensor, Tensor | None]:
        """The acting path alone (no value network): action params [B, param_size] and, for a
        recurrent policy, the policy core's state after the step [B, acting_state_size] (the
        inputs' "h_in" holds at least that state's columns). What exported graphs, serving and
        `relay verify` run."""
        fields = as_fields(inputs)
        pi = self.pi_trunk(self._trunk_input(fields))
        state = None
        if self.pi_core is not None:
            pi, _, state = self._through_cores(fields, pi, None, final_state=True)
        return self.pi_head(pi), state

    def _features(
        self, inputs: Inputs, final_state: bool = False
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(policy features [B, F], value [B] or None, the state after each sequence [k, S]: None
        without a core, or unless `final_state` (an update's replay does without it and takes
        the fused path)."""
        fields = as_fields(inputs)
        x = self._trunk_input(fields)
        pi = self.pi_trunk(x)
        v_feat = (
            None
            if self.v_head is None
            else (pi if self.v_trunk is None else self.v_trunk(self._value_input(x, fields)))
        )
        state = None
        if self.pi_core is not None:
            pi, v_shared, state = self._through_cores(
                fields, pi, v_feat if self.v_core is not None else None, final_state
            )
            v_feat = v_shared if self.v_core is not None else (pi if v_feat is not None else None)
        if self.v_head is None or v_feat is None:
            return pi, None, state
        return pi, self.v_head(v_feat).squeeze(-1).float(), state

    def _value_input(self, x: Tensor, fields: Mapping[str, Tensor]) -> Tensor:
        """The value trunk's input: the trunk input x [B, D], with a centralized critic's
        normalized global state beside it [B, D + S], or that state alone [B, S] for a trunk that
        `reads_state_only`."""
        if self.global_normalizer is None:
            return x
        state = self.global_normalizer(fields["global_state"].float())
        if self.v_trunk is not None and self.v_trunk.reads_state_only:
            return state
        return torch.cat([x.reshape(x.shape[0], -1), state.to(x.dtype)], dim=-1)

    def _through_cores(
        self, fields: Mapping[str, Tensor], pi: Tensor, v: Tensor | None, final_state: bool
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Trunk features [B = k * T, F] through the core(s) from fields["h_in"] [k, S]:
        (policy features [B, H], value features [B, H] or None, states after step T-1 [k, S] or
        None unless `final_state`)."""
        assert self.pi_core is not None
        state = fields[STATE]
        k = state.shape[0]
        steps = pi.shape[0] // k
        starts = fields.get(STARTS)
        starts_tk = (
            torch.zeros(steps, k, dtype=torch.bool, device=pi.device)
            if starts is None
            else starts.reshape(k, steps).transpose(0, 1).bool()
        )
        outs, states = [], []
        offset = 0
        for core, feat in ((self.pi_core, pi), (self.v_core, v)):
            if core is None or feat is None:
                continue
            s0 = state[:, offset : offset + core.state_size].to(feat.dtype)
            offset += core.state_size
            seq = feat.reshape(k, steps, -1).transpose(0, 1)  # [T, k, F]
            burn_in = self.burn_in if steps > 1 else 0
            out, last = core.sequence(seq, s0, starts_tk, burn_in, final_state)
            outs.append(out.transpose(0, 1).reshape(k * steps, -1))
            if last is not None:
                states.append(last.float())
        return outs[0], (outs[1] if len(outs) > 1 else None), (torch.cat(states, dim=-1) if states else None)

    def _plain_input(self, obs: Tensor) -> Tensor:
        if self.normalizer.enabled:
            # The normalizer computes in float32 whatever the model dtype; its output takes the weights'.
            x = self.normalizer(obs.reshape(obs.shape[0], -1).float()).to(self.pi_head.weight.dtype)
        else:
            # Raw observations reach the trunk in their own shape: floats in the weights' dtype,
            # integers (token ids) as they are, for the trunk to read its own way.
            x = obs.to(self.pi_head.weight.dtype) if obs.is_floating_point() else obs
        return x

    def distribution_params(self, inputs: Inputs) -> tuple[Tensor, Tensor | None]:
        """Action params [B, param_size] (logits, bit logits or means) and the value [B] or None."""
        feat, value, _ = self._features(inputs)
        return self.pi_head(feat), value

    @property
    def _log_std(self) -> Tensor | None:
        return self.log_std if distribution(self.action.kind).learned_log_std else None

    def log_prob_entropy(self, params: Tensor, actions: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """Log-probs and entropies [B], float32 even under autocast."""
        return self.dist.log_prob_entropy(self.action, params, actions, mask, self._log_std)

    def evaluate(self, inputs: Inputs, actions: Tensor) -> PolicyOutput:
        """Log-prob, entropy and value of given actions: inputs [B, ...], actions [B, *act]."""
        params, value = self.distribution_params(inputs)
        logp, entropy = self.log_prob_entropy(params, actions, as_fields(inputs).get("action_mask"))
        return PolicyOutput(logp, entropy, value)

    def action_summary(self, inputs: Inputs) -> Tensor:
        """What precision checks compare, float32 [B, param_size] (the distribution's `summary`):
        the probabilities of every choice (0 where masked) or bit, or the Gaussian's mean."""
        params, _ = self.policy_step(inputs)
        return self.dist.summary(self.action, params, as_fields(inputs).get("action_mask"))

    def sample_actions(self, params: Tensor, noise: Tensor, mask: Tensor | None = None) -> Tensor:
        """Actions from distribution params and caller noise (`ActionSpec.noise_shape`)."""
        return self.dist.sample(self.action, params, noise, mask, self._log_std)

    @torch.no_grad()
    def act(self, inputs: Inputs, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Sample with caller noise: inputs [B, ...] -> (actions [B, *act], logp [B], value [B]).

        value is zeros for a critic-free policy.
        """
        return self.act_with_state(inputs, noise)[:3]

    @torch.no_grad()
    def act_with_state(self, inputs: Inputs, noise: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """`act`, plus the recurrent state after the step [B, S] (None without a core)."""
        feat, value, state = self._features(inputs, final_state=True)
        params = self.pi_head(feat)
        mask = as_fields(inputs).get("action_mask")
        actions = self.sample_actions(params, noise, mask)
        logp, _ = self.log_prob_entropy(params, actions, mask)
        if value is None:
            value = torch.zeros(params.shape[0], device=params.device)
        return actions, logp, value, state

    @torch.no_grad()
    def value(self, inputs: Inputs) -> Tensor:
        """V(obs) [B]; zeros without a critic."""
        _, value, _ = self._features(inputs)
        return torch.zeros(batch_size(inputs), device=self.pi_head.weight.device) if value is None else value

    @torch.no_grad()
    def deterministic(self, inputs: Inputs) -> Tensor:
        """Greedy action (the most likely allowed choice per component, bits with p > 0.5, or the
        Gaussian mean) [B, *act]."""
        return self.choose(inputs)[0]

    @torch.no_grad()
    def choose(self, inputs: Inputs, noise: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """The acting path's actions [B, *act]: greedy without `noise`, sampled with it; and the
        recurrent state after the step [B, S] (None without a core)."""
        params, state = self.policy_step(inputs)
        mask = as_fields(inputs).get("action_mask")
        if noise is None:
            return self.dist.deterministic(self.action, params, mask), state
        return self.sample_actions(params, noise, mask), state
