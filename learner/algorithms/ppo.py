"""`learner.algo: ppo`: actor-critic PPO (Schulman et al. 2017) on GAE advantages. For segments
acted by weights a few versions old (async), `learner.off_policy_correction`:

- `vtrace`: V-trace targets and advantages computed from the current policy and critic (IMPALA's
  correction under PPO's clipped surrogate, as APPO);
- `decoupled`: decoupled PPO (Hilton et al. 2022): the clip is centred on the proximal policy (the
  weights this update starts from) instead of the behaviour policy, and each sample's term is
  weighted by pi_prox / pi_behaviour. Plain PPO on stale segments clips around a policy the
  learner has already left, so fewer samples teach it anything (Hopper at lag 1: clip fraction
  0.2 against 0.1 in sync).
"""

from __future__ import annotations

from torch import Tensor

from ...contracts.metrics import MetricKeys
from ...learner import losses
from ...learner.algorithms.base import Algorithm, Batch, evaluate_in_chunks, policy_inputs
from ...learner.gae import EpisodeEnds, compute_gae
from ...learner.vtrace import Clipping, compute_vtrace
from ...policy.protocol import EnvPolicy

REWARD_CLIP = 10.0
MAX_IS_WEIGHT = 2.0  # decoupled PPO: pi_prox / pi_behaviour, capped (lag-1 weights sit near 1)


class PPO(Algorithm):
    critic = True
    grouped = False
    metrics = MetricKeys(
        {
            "value_loss": "value loss (PPO)",
            "explained_variance": "1 - Var[returns - values] / Var[returns] (PPO)",
        },
        (
            {"id": "value_loss", "title": "Value loss", "keys": ["value_loss"]},
            {"id": "ev", "title": "Explained variance", "keys": ["explained_variance"]},
        ),
    )

    def batch(self, data: dict[str, Tensor]) -> tuple[Batch, dict[str, float]]:
        """Advantages and returns over the round's [T, K*N] steps, flattened: the policy's input
        fields (obs leaves, action_mask), actions, logp, values, advantages, returns, mask, each
        [B = T*K*N, ...]."""
        lc = self.cfg
        rewards = self._learning_rewards(data["rewards"])
        ends = EpisodeEnds.of(data)
        batch = {**policy_inputs(data), "actions": data["actions"].flatten(0, 1)}
        inputs = policy_inputs(data)
        values = data["values"]
        if lc.off_policy_correction == "vtrace":
            target_logp, target_values = evaluate_in_chunks(
                self.model, inputs, batch["actions"], lc, self.dev
            )
            assert target_values is not None
            shape = data["values"].shape
            values = target_values.view(shape)  # the current critic: V-trace's V
            clip = Clipping(lc.gae_lambda, lc.vtrace_rho_bar, lc.vtrace_c_bar)
            ret, adv = compute_vtrace(
                target_logp.view(shape), data["logp"], rewards, values, ends, gamma=lc.gamma, clip=clip
            )
        else:
            adv, ret = compute_gae(rewards, values, ends, gamma=lc.gamma, lam=lc.gae_lambda)
        logp = data["logp"].flatten()
        if lc.off_policy_correction == "decoupled":
            prox_logp, _ = evaluate_in_chunks(self.model, inputs, batch["actions"], lc, self.dev)
            batch["is_weight"] = (prox_logp - logp).exp().clamp(max=MAX_IS_WEIGHT)
            logp = prox_logp  # the clip's centre
        batch.update(
            logp=logp,
            values=values.flatten(),
            advantages=adv.flatten(),
            returns=ret.flatten(),
            mask=data["mask"].flatten(),
        )
        # Of the values against the returns, before the update changes the critic.
        ev = losses.explained_variance(batch["values"], batch["returns"], batch["mask"])
        return batch, {"explained_variance": float(ev)}

    def _learning_rewards(self, rewards: Tensor) -> Tensor:
        """Rewards scaled by the running std of the discounted return (env.normalize_reward),
        clipped to [-10, 10] as CleanRL's continuous PPO does; as they are otherwise."""
        stats = self.model.return_stats
        if stats is None:
            return rewards
        return (rewards / stats.std()).clamp(-REWARD_CLIP, REWARD_CLIP)

    def loss(self, model: EnvPolicy, b: Batch) -> tuple[Tensor, dict[str, Tensor]]:
        """Clipped surrogate + value_coef * value loss - entropy_coef * entropy."""
        cfg = self.cfg
        out = model.evaluate(b, b["actions"])
        mask = b["mask"]
        adv = (
            losses.normalize_advantages(b["advantages"], mask)
            if cfg.normalize_advantages
            else b["advantages"]
        )
        pg = losses.clipped_surrogate(out.logp, b["logp"], adv, cfg.clip_ratio, mask, b.get("is_weight"))
        assert out.value is not None, "PPO needs a critic"
        vf = losses.value_loss(out.value, b["values"], b["returns"], mask, cfg.value_clip)
        ent = losses.masked_mean(out.entropy, mask)
        loss = pg + cfg.value_coef * vf - cfg.entropy_coef * ent
        stats = losses.policy_stats(out.logp, b["logp"], mask, pg, ent, cfg.clip_ratio)
        return loss, {**stats, "value_loss": vf.detach()}
