"""What a policy loss of a language run is: per-token losses of a micro-batch from the trained,
old and (for statistics) clip indicators, with the settings and metric keys it brings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from ....contracts.config import EntrySection, LearnerConfig, entry_section
from ....contracts.metrics import MetricKeys


@dataclass(frozen=True)
class TokenBatch:
    """A micro-batch of b completions over C positions. logp [b, C]: the trained policy's
    log-probs (with gradient); old_logp [b, C]: the sampling policy's (detached); advantages [b];
    mask [b, C] float, 1 on completion tokens; clip_ratio: learner.clip_ratio."""

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    mask: Tensor
    clip_ratio: float


# (per-token loss [b, C], clipped below [b, C], clipped above [b, C]: 0/1 floats)
TokenLoss = tuple[Tensor, Tensor, Tensor]


def clipped_surrogate(ratio: Tensor, advantages: Tensor, low: float, high: float) -> TokenLoss:
    """-min(rho A, clip(rho, 1 - low, 1 + high) A) per token for ratios [b, C] and advantages [b],
    with the tokens clipped below (rho < 1 - low where A < 0) and above (rho > 1 + high where
    A > 0): what a clipped loss is once its ratio is chosen (a token's or its sequence's)."""
    adv = advantages.unsqueeze(-1)
    loss = -(ratio * adv).minimum(ratio.clamp(1.0 - low, 1.0 + high) * adv)
    below = (ratio < 1.0 - low) & (adv < 0)
    above = (ratio > 1.0 + high) & (adv > 0)
    return loss, below.float(), above.float()


@dataclass(frozen=True)
class PolicyLoss:
    """One `learner.lm.policy_loss`. `loss(batch, settings)`: per-token losses the update weighs
    by the aggregation's token weights (`tokens.token_weights`) and sums, so micro-batches add
    up to the batch's loss; `settings`: its section `learner.<name>` (None: none)."""

    loss: Callable[[TokenBatch, Any], TokenLoss]
    settings: type[EntrySection] | None = None
    metrics: MetricKeys = field(default_factory=lambda: MetricKeys({}))

    def settings_of(self, cfg: LearnerConfig, name: str) -> Any:
        if self.settings is None:
            return None
        return entry_section(cfg, "learner", name, self.settings)
