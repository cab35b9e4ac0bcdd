"""Policy networks: the model registry (`model.kind`) and `build_policy`.

A new kind is one module with a `ModelKind` subclass plus one line in MODEL_KINDS.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ...contracts.config import ENV_FAMILY, MODEL_FAMILIES, RelayConfig
from ...contracts.spaces import ActionSpec, EnvSpec
from ...policy.actor_critic import ActorCritic
from ...policy.cores import core_class
from ...policy.encoders import encoder_plan
from ...policy.models.causal_lm import CausalLMKind
from ...policy.models.cnn import CnnKind
from ...policy.models.mlp import MlpKind
from ...policy.models.reward_model import RewardModelKind
from ...policy.models.transformer import TransformerKind
from ...policy.trunk import ModelKind

MODEL_KINDS: dict[str, ModelKind] = {
    "mlp": MlpKind(),
    "transformer": TransformerKind(),
    "cnn": CnnKind(),
    "causal_lm": CausalLMKind(),
    "reward_model": RewardModelKind(),
}
# The contract's table of families and the kinds' own word agree.
assert {k: v.family for k, v in MODEL_KINDS.items() if v.family != ENV_FAMILY} == MODEL_FAMILIES


def model_kind(name: str) -> ModelKind:
    """The registered kind; ValueError naming the known ones otherwise."""
    if name not in MODEL_KINDS:
        raise ValueError(f"model.kind={name!r} is not a model kind: choose {', '.join(MODEL_KINDS)}")
    return MODEL_KINDS[name]


def build_policy(cfg: RelayConfig, env: EnvSpec, critic: bool) -> ActorCritic:
    """The policy network the config describes, for `env`; `critic=False` builds no value network.
    A tree observation gets an encoder per leaf (`policy/encoders/`); ValueError (one line) where
    the config's encoders cannot read the env's leaves."""
    plan = encoder_plan(env, cfg.model.encoders) if env.structured else None
    in_dim = plan.out_dim if plan is not None else env.obs_dim
    core = core_class(cfg.model.recurrent)
    size, post = cfg.model.recurrent_size, cfg.model.post_core_size
    kind = model_kind(cfg.model.kind)
    global_state = env.global_state if critic else 0
    problem = global_state_problem(cfg, env) if critic else None
    if problem:
        raise ValueError(problem)
    return ActorCritic(
        obs_dim=in_dim,
        action=env.action,
        make_trunk=kind.trunk_factory(cfg, env, in_dim),
        global_state=global_state,
        make_value_trunk=kind.value_trunk_factory(cfg, env, in_dim) if global_state else None,
        plan=plan,
        shared_trunk=cfg.model.shared_trunk,
        critic=critic,
        init_log_std=cfg.model.init_log_std,
        normalize_obs=cfg.model.normalize_obs,
        normalize_reward=cfg.env.normalize_reward,
        make_core=None if core is None else (lambda features: core(features, size, post)),
        burn_in=cfg.model.burn_in,
    )


def global_state_problem(cfg: RelayConfig, env: EnvSpec) -> str | None:
    """Why the configured model kind cannot read `env`'s global state (a centralized critic), or
    None when it can or there is none."""
    if not env.global_state or model_kind(cfg.model.kind).reads_global_state:
        return None
    readers = ", ".join(name for name, k in MODEL_KINDS.items() if k.reads_global_state)
    return (
        f"multi_agent.central_critic: model.kind={cfg.model.kind}'s value trunk cannot read the global "
        f"state beside its input; use model.kind={readers}"
    )


def infer_env_spec(weights: Mapping[str, torch.Tensor]) -> EnvSpec:
    """The env spec a policy's weights imply: a flat float observation of the normalizer's size, and
    the action head's outputs (Gaussian where there is a log-std). For checkpoints written before
    they stored their env spec."""
    obs_dim = int(weights["normalizer.mean"].numel())
    size = int(weights["pi_head.weight"].shape[0])
    action = ActionSpec("continuous", size) if "log_std" in weights else ActionSpec("discrete", size)
    return EnvSpec((obs_dim,), action)


def has_critic_weights(weights: Mapping[str, object]) -> bool:
    """Whether saved policy weights include a value network."""
    return "v_head.weight" in weights


def action_outputs(weights: Mapping[str, torch.Tensor]) -> int | None:
    """How many numbers the action head of saved policy weights outputs (logits or means), or
    None when they hold no action head."""
    head = weights.get("pi_head.weight")
    return None if head is None else int(head.shape[0])


def acting_optional(model: ActorCritic) -> tuple[str, ...]:
    """Prefixes of the model's state-dict keys that an exported (acting-only) graph may lack: the
    reward statistics, and a normalizer the policy does not use."""
    return ("return_stats.",) + (() if model.normalizer.enabled else ("normalizer.",))


def weights_mismatch(
    want: Mapping[str, torch.Tensor],
    have: Mapping[str, object],
    optional: tuple[str, ...] = (),
    allow_extra: bool = False,
) -> str | None:
    """The first reason saved weights `have` do not load into a state dict `want`, or None.

    Keys of `want` starting with an `optional` prefix may be absent; keys of `have` that `want`
    lacks are a mismatch unless `allow_extra` (a graph holds more than a policy's weights).
    """
    missing = [k for k in want if k not in have and not (optional and k.startswith(optional))]
    if missing:
        return f"{missing[0]} is missing"
    extra = [k for k in have if k not in want]
    if extra and not allow_extra:
        return f"{extra[0]} is not in the model"
    for k, t in want.items():
        saved = have.get(k)
        if saved is None:
            continue
        shape = tuple(saved.shape) if isinstance(saved, torch.Tensor) else None
        if shape != tuple(t.shape):
            return (
                f"{k}: saved {shape if shape is not None else type(saved).__name__}, model {tuple(t.shape)}"
            )
    return None


__all__ = [
    "MODEL_KINDS",
    "ActorCritic",
    "ModelKind",
    "acting_optional",
    "action_outputs",
    "build_policy",
    "has_critic_weights",
    "infer_env_spec",
    "model_kind",
    "weights_mismatch",
]
