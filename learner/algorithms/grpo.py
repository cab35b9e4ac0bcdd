"""`learner.algo: grpo`: critic-free, group-relative advantages and a KL penalty to a frozen
reference policy (Shao et al. 2024)."""

from __future__ import annotations

import copy
from typing import Any

from torch import Tensor

from ...contracts.config import LearnerConfig, RelayConfig
from ...contracts.metrics import MetricKeys
from ...learner import losses
from ...learner.algorithms.base import Algorithm, Batch, evaluate_in_chunks, policy_inputs
from ...learner.device import DeviceContext
from ...policy.protocol import EnvPolicy


class GRPO(Algorithm):
    critic = False
    grouped = True
    # a language run's estimators (learner/lm/learner.py) write the same group keys
    metrics = MetricKeys(
        {
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
