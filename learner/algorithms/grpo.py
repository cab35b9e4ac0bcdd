"""`learner.algo: grpo`: critic-free, group-relative advantages and a KL penalty to a frozen
reference policy (Shao et al. 2024)."""

from __future__ import annotations

import copy
from typing import Any, Literal, cast

from pydantic import Field, model_validator
from torch import Tensor

from ...contracts.config import EntrySection, LearnerConfig, RelayConfig
from ...contracts.metrics import MetricKeys
from ...learner import losses
from ...learner.algorithms.base import Algorithm, Batch, evaluate_in_chunks, policy_inputs
from ...learner.device import DeviceContext
from ...policy.protocol import EnvPolicy


class GrpoSettings(EntrySection):
    """`learner.grpo`: the GRPO objective on a language model's completion tokens (model.kind=causal_lm)."""

    clip_ratio_high: float | None = Field(
        None, gt=0, le=10, description="Upper ratio clip (DAPO's clip-higher); null: learner.clip_ratio."
    )
    loss_agg: Literal["token_mean", "seq_mean", "dr_grpo"] = Field(
        "token_mean",
        description="token_mean: every completion token of the batch weighs the same (DAPO); seq_mean: "
        "each completion's mean, averaged (the GRPO paper); dr_grpo: the sum over tokens divided by "
        "completions x generation.max_new_tokens (Dr. GRPO's constant normalizer).",
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="Divide advantages by the group's reward std, the batch's, or not at all."
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

    @model_validator(mode="after")
    def _refill_needs_drop(self) -> GrpoSettings:
        if self.refill_rounds and not self.drop_equal_groups:
            raise ValueError("refill_rounds replaces dropped groups: set drop_equal_groups=true")
        return self


def grpo_settings(cfg: RelayConfig) -> GrpoSettings:
    """A GRPO run's `learner.grpo`, validated, its defaults filled."""
    return cast(GrpoSettings, GRPO.settings_of(cfg.learner))


class GRPO(Algorithm):
    critic = False
    grouped = True
    settings = GrpoSettings
    # a language run's GRPO (learner/lm_learner.py) writes the same keys
    metrics = MetricKeys(
        {
            "kl_ref": "KL to the frozen reference policy (GRPO)",
            "group_reward_std": "mean within-group std of episodic returns (GRPO)",
            "group_reward_mean": "mean episodic return over groups (GRPO)",
            "zero_std_group_fraction": "groups whose members all scored the same (GRPO)",
        },
        (
            {
                "id": "grpo",
                "title": "GRPO: KL to reference, group reward std",
                "keys": ["kl_ref", "group_reward_std"],
                "optional": True,
            },
        ),
    )

    @staticmethod
    def config_problems(cfg: RelayConfig) -> list[str]:
        problems = []
        if cfg.learner.group_size < 2:
            problems.append(f"learner.algo=grpo needs learner.group_size >= 2 (got {cfg.learner.group_size})")
        if cfg.learner.off_policy_correction != "none":
            problems.append(
                "learner.algo=grpo has no critic for V-trace: set learner.off_policy_correction=none"
            )
        if cfg.env.normalize_reward:
            problems.append(
                "learner.algo=grpo compares whole episodes' returns: set env.normalize_reward=false"
            )
        return problems

    def __init__(self, cfg: LearnerConfig, model: EnvPolicy, dev: DeviceContext) -> None:
        super().__init__(cfg, model, dev)
        self.reference = copy.deepcopy(model).eval().requires_grad_(False)

    def batch(self, data: dict[str, Tensor]) -> tuple[Batch, dict[str, float]]:
        """Group-relative advantages from each member's outcome, given to every valid step of it."""
        lc = self.cfg
        outcome = data["outcome"].view(-1, lc.group_size)  # [groups, G]; groups never span segments
        mask = data["mask"]
        # A member with no valid step was dropped by a fault: its outcome is no episode's return.
        valid = (mask.sum(dim=0) > 0).view(-1, lc.group_size)
        adv, std = losses.group_relative_advantages(outcome, lc.group_eps, valid)
        inputs = policy_inputs(data)
        batch = {
            **inputs,
            "actions": data["actions"].flatten(0, 1),
            "logp": data["logp"].flatten(),
            "advantages": (adv.reshape(1, -1) * mask).flatten(),
            "mask": mask.flatten(),
        }
        # The frozen reference's log-probs, once per update rather than once per epoch.
        batch["ref_logp"] = evaluate_in_chunks(self.reference, inputs, batch["actions"], lc, self.dev)[0]
        stats = {
            "group_reward_std": float(std.mean()),
            "zero_std_group_fraction": float((std == 0).float().mean()),
            "group_reward_mean": float((outcome * valid).sum() / valid.sum().clamp(min=1)),
        }
        return batch, stats

    def loss(self, model: EnvPolicy, b: Batch) -> tuple[Tensor, dict[str, Tensor]]:
        """Clipped surrogate on group-relative advantages + kl_coef * KL(policy || reference) - entropy."""
        cfg = self.cfg
        out = model.evaluate(b, b["actions"])
        mask = b["mask"]
        pg = losses.clipped_surrogate(out.logp, b["logp"], b["advantages"], cfg.clip_ratio, mask)
        kl = losses.kl_to_reference(out.logp, b["ref_logp"], mask)
        ent = losses.masked_mean(out.entropy, mask)
        loss = pg + cfg.kl_coef * kl - cfg.entropy_coef * ent
        stats = losses.policy_stats(out.logp, b["logp"], mask, pg, ent, cfg.clip_ratio)
        return loss, {**stats, "kl_ref": kl.detach()}

    def after_update(self, model: EnvPolicy, updates: int) -> None:
        interval = self.cfg.ref_update_interval
        if interval and updates % interval == 0:
            self.reference.load_state_dict(model.state_dict())

    def extra_tensors(self) -> list[Tensor]:
        return list(self.reference.parameters())

    def state_dict(self) -> dict[str, Any]:
        return {"reference": self.reference.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("reference") is not None:
            self.reference.load_state_dict(state["reference"])
