"""`model.kind: causal_lm`: a Hugging Face causal language model from a local folder (`model.path`).

Not a trunk under relay's heads: the language model, its own head and its KV cache are the policy
(`policy/causal_lm.py`, a `LanguagePolicy`). A language run takes prompts instead of an env
(its family, `contracts/config.py` MODEL_FAMILIES); this entry says so to the env-side checks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ...contracts.config import LANGUAGE_FAMILY, RelayConfig
from ...contracts.metrics import MAX_REWARDS, REWARD_FAULT_KINDS, MetricKeys
from ...contracts.spaces import EnvSpec
from ...policy.trunk import ModelKind, TrunkModule

# What a language run adds to the metrics line: an episode is a completion, an env step a
# completion token (the learner, the generators and the reward actors write these).
LANGUAGE_METRICS = MetricKeys(
    {
        "reward_mean": "mean reward of the iteration's completions (those the rewards scored)",
        "reward_std": "std of the iteration's completions' rewards",
        **{
            f"reward_{i}_mean": f"mean of the iteration's values of prompts.rewards[{i}] (before its weight)"
            for i in range(MAX_REWARDS)
        },
        "completions": "completions generated so far",
        "refill_rounds": "extra generations the iteration took to replace all-equal groups "
        "(learner.grpo.refill_rounds)",
        "completion_len_mean": "mean tokens of the iteration's completions (their end token included)",
        "truncated_fraction": "fraction of the iteration's completions cut at generation.max_new_tokens",
        "prompt_width": "the prompt bucket (tokens) the iteration's prompts were padded to",
        "gen_s": "seconds the iteration's completions took to generate",
        "reward_s": "seconds the rewards took to score them",
        "logprob_s": "seconds the learner spent on the old policy's log-probs before the update",
        "reference_s": "seconds the learner spent on the reference's log-probs (learner.kl_coef > 0)",
        "weight_sync_s": "seconds to send the new weights to the generators (generation.placement=workers)",
        "weight_sync_bytes": "bytes of the new weights the generators received, all of them together "
        "(generation.placement=workers)",
        "weight_sync_retries": "generators' loads of the weights refused (another version's, or not "
        "loading) and sent again, over the run (generation.placement=workers)",
        "gen_tokens_per_s": "completion tokens generated per second of generation",
        "reward_norm_mean": "the running mean of the rewards the update normalizes by "
        "(prompts.reward_norm=running)",
        "reward_norm_std": "the running standard deviation of the rewards the update normalizes by "
        "(prompts.reward_norm=running)",
        "trained_tokens_per_s": "completion tokens the update trained on per second of update",
        "tokens_per_s_per_device": "trained tokens / update seconds / learner devices (NeMo-RL's throughput "
        "per device)",
        "learner_param_bytes": "parameter bytes one learner rank holds (its shards where "
        "learner.parallel=fsdp)",
        "model_param_bytes": "parameter bytes of the whole model",
        "gen_logp_gap": "mean |learner log-prob - generator log-prob| over completion tokens "
        "(generation.placement=workers: precision, numerics and staleness show)",
        "is_weight_mean": "mean truncated importance weight learner / generator "
        "(learner.grpo.importance_correction)",
        "clip_low_fraction": "fraction of completion tokens clipped at 1 - learner.clip_ratio",
        "clip_high_fraction": "fraction of completion tokens clipped at 1 + the upper clip (clip-higher)",
        "reward_faults": "completions left without a reward: a reward raised, hung, or returned NaN or the "
        "wrong length",
        **{f"reward_faults_{k}": f"reward faults of kind {k}" for k in REWARD_FAULT_KINDS},
        "update_compiles": "graphs compiled for a language run's update (learner.compile): one per prompt "
        "bucket and micro-batch size met (more under gradient checkpointing, whose transformers blocks "
        "break the graph); it stops growing once each has been seen",
    },
    (
        {
            "id": "lm_reward",
            "title": "Reward: the mean, and each reward's own mean (before its weight)",
            "keys": ["reward_mean", *(f"reward_{i}_mean" for i in range(MAX_REWARDS))],
            "optional": True,
        },
        {
            "id": "lm_length",
            "title": "Completion length (tokens, the end token included)",
            "keys": ["completion_len_mean"],
            "optional": True,
        },
        {
            "id": "lm_truncated",
            "title": "Completions cut at generation.max_new_tokens (fraction)",
            "keys": ["truncated_fraction"],
            "optional": True,
        },
        {
            "id": "lm_kl_clip",
            "title": "KL to the reference and to the sampling policy; tokens clipped low and high",
            "keys": ["kl_ref", "approx_kl", "clip_low_fraction", "clip_high_fraction"],
            "optional": True,
        },
        {
            "id": "tokens",
            "title": "Language run: generated and trained tokens/s",
            "keys": ["gen_tokens_per_s", "trained_tokens_per_s"],
            "optional": True,
        },
        {
            "id": "lm_phases",
            "title": "Seconds by phase: generation, rewards, old and reference log-probs, update, sync",
            "keys": ["gen_s", "reward_s", "logprob_s", "reference_s", "update_s", "weight_sync_s"],
            "optional": True,
        },
        {
            "id": "lm_reward_faults",
            "title": "Reward faults (raised, timed out, non-finite, wrong length)",
            "keys": ["reward_faults", *(f"reward_faults_{k}" for k in REWARD_FAULT_KINDS)],
            "optional": True,
        },
    ),
)
# The language family's dashboard (services/driver/families/language.py): its charts first, in
# this order, then the run-wide ones that mean something to it; x is the iteration.
LANGUAGE_PANELS = (
    "lm_reward",
    "eval",
    "lm_length",
    "lm_truncated",
    "lm_kl_clip",
    "loss",
    "entropy",
    "grad",
    "lr",
    "tokens",
    "lm_phases",
    "lag",
    "memory",
    "host_memory",
    "lm_reward_faults",
)


class CausalLMKind(ModelKind):
    family = LANGUAGE_FAMILY
    # Generators compute in bf16 anyway: half the bytes per version, one buffer.
    default_wire = "packed_bf16"
    exact_weights = False
    metrics = LANGUAGE_METRICS

    def run_source(self, cfg: RelayConfig) -> str:
        """The model folder's name."""
        return Path(cfg.model.path).name if cfg.model.path else "model"

    def env_problem(self, cfg: RelayConfig, env: EnvSpec) -> str | None:
        return "model.kind=causal_lm trains on prompts (prompts.train), not on an env"

    def trunk_factory(self, cfg: RelayConfig, env: EnvSpec, in_dim: int) -> Callable[[], TrunkModule]:
        raise ValueError("model.kind=causal_lm is a whole policy, not a trunk under relay's heads")
