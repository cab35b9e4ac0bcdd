"""`model.kind: reward_model`: a Hugging Face model folder (`model.path`) read as a scalar scorer,
trained on preference pairs (`learner/lm/reward_model.py`). A causal LM's folder gains a fresh
score head; a sequence classifier's keeps its own. Its runs are the preference family's
(`contracts/config.py` MODEL_FAMILIES): pairs in, no env, no completions.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ...contracts.config import PREFERENCE_FAMILY, RelayConfig
from ...contracts.metrics import MetricKeys
from ...contracts.spaces import EnvSpec
from ...policy.trunk import ModelKind, TrunkModule

# What a reward model's run adds to the metrics line: an episode is a pair, its return 1 where the
# chosen side scored above the rejected one (so episode_return_mean is the pair accuracy), an env
# step a trained token.
PREFERENCE_METRICS = MetricKeys(
    {
        "loss": "the Bradley–Terry loss of the iteration's pairs (its margin column's margins in it)",
        "pair_accuracy": "fraction of the iteration's pairs whose chosen side scored above the rejected",
        "reward_margin": "mean score of the chosen side less the rejected, over the iteration's pairs",
        "score_mean": "mean score of both sides of the iteration's pairs",
        "score_std": "std of the scores of both sides of the iteration's pairs",
        "pairs": "preference pairs trained on so far",
        "pair_width": "the bucket (tokens) the iteration's sides were padded to",
    },
    (
        {
            "id": "rm_accuracy",
            "title": "Pair accuracy: the iteration's pairs, and the held-out ones (prompts.eval: the "
            "evaluation's return)",
            "keys": ["pair_accuracy", "eval_return_mean"],
            "optional": True,
        },
        {"id": "rm_loss", "title": "Bradley–Terry loss", "keys": ["loss"], "optional": True},
        {
            "id": "rm_scores",
            "title": "Scores: the margin chosen - rejected, their mean and std",
            "keys": ["reward_margin", "score_mean", "score_std"],
            "optional": True,
        },
    ),
)
# The preference family's dashboard (services/driver/families/preference.py), x the iteration.
PREFERENCE_PANELS = ("rm_accuracy", "rm_loss", "rm_scores", "grad", "tokens", "memory", "host_memory")


class RewardModelKind(ModelKind):
    family = PREFERENCE_FAMILY
    exact_weights = False
    metrics = PREFERENCE_METRICS

    def run_source(self, cfg: RelayConfig) -> str:
        """The model folder's name."""
        return Path(cfg.model.path).name if cfg.model.path else "reward-model"

    def env_problem(self, cfg: RelayConfig, env: EnvSpec) -> str | None:
        return "model.kind=reward_model trains on preference pairs (prompts.train), not on an env"

    def trunk_factory(self, cfg: RelayConfig, env: EnvSpec, in_dim: int) -> Callable[[], TrunkModule]:
        raise ValueError("model.kind=reward_model is a whole scorer, not a trunk under relay's heads")
