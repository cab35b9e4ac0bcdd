"""`learner.algo: ppo`: actor-critic PPO on GAE advantages (Schulman et al. 2017)."""

from __future__ import annotations

from torch import Tensor

from learner import losses
from learner.algorithms.base import Algorithm, Batch
from learner.gae import compute_gae
from learner.models.policy import ActorCritic


class PPO(Algorithm):
    critic = True
    grouped = False

    def batch(self, data: dict[str, Tensor]) -> tuple[Batch, dict[str, float]]:
        """GAE over the round's [T, K*N] steps, flattened: obs, actions, logp, values, advantages,
        returns, mask, each [B = T*K*N, ...]."""
        lc = self.cfg
        adv, ret = compute_gae(
            data["rewards"],
            data["values"],
            data["terminated"],
            data["truncated"],
            data["bootstrap_value"],
            data["last_value"],
            data["mask"],
            lc.gamma,
            lc.gae_lambda,
        )
        batch = {
            "obs": data["obs"].flatten(0, 1),
            "actions": data["actions"].flatten(0, 1),
            "logp": data["logp"].flatten(),
            "values": data["values"].flatten(),
            "advantages": adv.flatten(),
            "returns": ret.flatten(),
            "mask": data["mask"].flatten(),
        }
        # Of the behaviour values against the returns, before the update changes the critic.
        ev = losses.explained_variance(batch["values"], batch["returns"], batch["mask"])
        return batch, {"explained_variance": float(ev)}

    def loss(self, model: ActorCritic, b: Batch) -> tuple[Tensor, dict[str, Tensor]]:
        """Clipped surrogate + value_coef * value loss - entropy_coef * entropy."""
        cfg = self.cfg
        out = model.evaluate(b["obs"], b["actions"])
        mask = b["mask"]
        adv = (
            losses.normalize_advantages(b["advantages"], mask)
            if cfg.normalize_advantages
            else b["advantages"]
        )
        pg = losses.clipped_surrogate(out.logp, b["logp"], adv, cfg.clip_ratio, mask)
        assert out.value is not None, "PPO needs a critic"
        vf = losses.value_loss(out.value, b["values"], b["returns"], mask, cfg.value_clip)
        ent = losses.masked_mean(out.entropy, mask)
        loss = pg + cfg.value_coef * vf - cfg.entropy_coef * ent
        stats = losses.policy_stats(out.logp, b["logp"], mask, pg, ent, cfg.clip_ratio)
        return loss, {**stats, "value_loss": vf.detach()}
