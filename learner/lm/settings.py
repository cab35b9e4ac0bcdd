"""`learner.lm`: the settings of a language run's update that every estimator and policy loss
shares (how tokens are weighed, the KL to the reference, micro-batches, importance weights, the
all-equal groups). An estimator's own settings are `learner.<learner.algo>`, a loss's
`learner.<learner.lm.policy_loss>`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from ...contracts.config import EntrySection, RelayConfig, entry_section
from ...learner.device import DeviceContext
from ...learner.lm.estimators import ESTIMATORS
from ...learner.lm.policy_losses import POLICY_LOSSES

SECTION = "lm"


class LmSettings(EntrySection):
    """`learner.lm`: the update of a language run (model.kind=causal_lm)."""

    policy_loss: str = Field(
        "clip",
        description="The per-token policy loss, a name from the registry: clip (PPO's token-level clip, "
        "with clip-higher) or gspo (GSPO's sequence-level ratio).",
    )
    loss_agg: Literal["token_mean", "seq_mean", "dr_grpo"] = Field(
        "token_mean",
        description="token_mean: every completion token of the batch weighs the same (DAPO); seq_mean: "
        "each completion's mean, averaged (the GRPO paper); dr_grpo: the sum over tokens divided by "
        "completions x generation.max_new_tokens (Dr. GRPO's constant normalizer).",
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3", description="Per-token KL estimator to the reference (learner.kl_coef > 0 loads one)."
    )
    drop_equal_groups: bool = Field(
        False,
        description="Leave groups whose rewards are all equal out of the loss and its normalizer "
        "(they carry no signal and would dilute the token mean).",
    )
    refill_rounds: int = Field(
        0,
        ge=0,
        le=64,
        description="With drop_equal_groups: generate up to this many extra rounds to replace groups "
        "whose rewards are all equal (DAPO's dynamic sampling); the batch keeps prompts.batch_size "
        "groups.",
    )
    micro_batch_tokens: int = Field(
        4096,
        ge=1,
        le=2**31,
        description="Tokens (prompt + completion, padding included) per forward/backward micro-batch; "
        "gradients accumulate over the update's batch.",
    )
    logprob_chunk: int = Field(
        128,
        ge=1,
        le=1_000_000,
        description="Completion positions whose [rows, chunk, vocab] logits exist at once: log-probs "
        "and entropy are computed (and recomputed in backward) chunk by chunk.",
    )
    importance_correction: Literal["none", "token", "sequence"] = Field(
        "token",
        description="generation.placement=workers: truncated importance weights between the "
        "generator's and the learner's log-probs, per token or per completion.",
    )
    importance_cap: float = Field(2.0, ge=1, le=1e6, description="Cap of the truncated importance weight.")

    @field_validator("policy_loss")
    @classmethod
    def _registered(cls, name: str) -> str:
        if name not in POLICY_LOSSES:
            raise ValueError(f"{name!r} is not a policy loss: choose {', '.join(POLICY_LOSSES)}")
        return name

    @model_validator(mode="after")
    def _refill_needs_drop(self) -> LmSettings:
        if self.refill_rounds and not self.drop_equal_groups:
            raise ValueError("refill_rounds replaces dropped groups: set drop_equal_groups=true")
        return self


def sharded_checkpoints(cfg: RelayConfig) -> bool:
    """Whether a language run's checkpoints are folders of every learner rank's shards
    (`checkpoint.format`; auto: where the model is sharded, over learner.num_learners > 1)."""
    fmt = cfg.checkpoint.format
    return fmt == "sharded" or (fmt == "auto" and cfg.learner.num_learners > 1)


def lm_settings(cfg: RelayConfig) -> LmSettings:
    """A language run's `learner.lm`, validated, its defaults filled."""
    return entry_section(cfg.learner, "learner", SECTION, LmSettings)


def learner_sections() -> dict[str, type[EntrySection]]:
    """The `learner.<name>` sections a language run may hold: `learner.lm`, then each estimator's
    and each policy loss's that declares one (read at call time: a registry may grow)."""
    out: dict[str, type[EntrySection]] = {SECTION: LmSettings}
    for registry in (ESTIMATORS, POLICY_LOSSES):
        for name, entry in registry.items():
            if entry.settings is not None:
                assert name not in out, f"learner.{name} is declared twice"
                out[name] = entry.settings
    return out


def chosen_sections(cfg: RelayConfig) -> list[str]:
    """The sections a language run reads, added with their defaults where absent: the update's,
    its estimator's and its policy loss's."""
    lm = cfg.learner.entry_data(SECTION) or {}
    loss = lm.get("policy_loss", LmSettings.model_fields["policy_loss"].default)
    return [SECTION, cfg.learner.algo, loss if isinstance(loss, str) else ""]


def amp_of(use_amp: bool | str, amp_dtype: str, dev: DeviceContext) -> tuple[bool, str]:
    """(autocast on, its dtype) of a language model's learner (a policy's or a reward model's):
    `auto` is bf16 where the device computes it in hardware."""
    if use_amp == "auto":
        return dev.bf16_units() is not None, "bfloat16"
    return bool(use_amp), amp_dtype
