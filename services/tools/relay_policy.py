"""A relay policy rebuilt from data: its run's config (model settings only), its env spec and its
weights, checked against each other before anything loads."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import ValidationError

from ...contracts.config import RelayConfig
from ...contracts.spaces import EnvSpec
from ...policy.models import acting_optional, build_policy, has_critic_weights, model_kind, weights_mismatch
from ...services.tools.handle import PolicyHandle, PolicyLoadError


def relay_policy(
    cfg_data: Any, env: EnvSpec, weights: dict[str, Any], source: str, acting_only: bool = False
) -> PolicyHandle:
    """A relay policy rebuilt from its run's config (model settings only) and env spec, weights
    checked against the model before they load. `acting_only`: the weights are an exported graph's
    (no value network, no normalizer when it was off, other initializers beside them)."""
    try:
        cfg = RelayConfig.model_validate(cfg_data)
        model_kind(cfg.model.kind)
    except (ValidationError, ValueError, TypeError) as err:
        first = " ".join(str(err).split())[:200]
        raise PolicyLoadError(f"{source}: unreadable relay config ({first})") from None
    critic = has_critic_weights(weights)
    try:
        # Shapes first, on the meta device (nothing allocated): a spec read from a file may name
        # sizes its weights do not back (obs_shape [4194304] in a 24 KB file), refused right here.
        with torch.device("meta"):
            meta_model = build_policy(cfg, env, critic=critic)
            shapes = meta_model.state_dict()
    except (ValueError, RuntimeError, NotImplementedError) as err:
        raise PolicyLoadError(f"{source}: its config and env spec do not make a policy ({err})") from None
    # An exported graph holds what acting reads: no reward statistics, no unused normalizer.
    optional = acting_optional(meta_model) if acting_only else ()
    problem = weights_mismatch(shapes, weights, optional, allow_extra=acting_only)
    if problem:
        raise PolicyLoadError(f"{source}: its weights do not fit its config ({problem})")
    model = build_policy(cfg, env, critic=critic)
    model.load_state_dict(
        {k: torch.as_tensor(v) for k, v in weights.items() if k in model.state_dict()}, strict=False
    )
    return PolicyHandle(model.eval(), source, env, cfg)
