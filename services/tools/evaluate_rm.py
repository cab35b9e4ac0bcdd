"""`relay eval RUN` of a reward model's run: its trained scorer on preference pairs (the run's
prompts.eval, else prompts.train, or --prompts), the first --episodes of them; an episode is a
pair, its return 1 where the chosen side scored above the rejected one (the mean is the pair
accuracy). The checkpoint, its config and the pairs file are data.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ...contracts.checkpoint import Checkpoint
from ...contracts.pairs import load_pairs
from ...contracts.prompts import PromptError
from ...learner.lm.reward_model import (
    PreferenceSettings,
    pair_summary,
    preference_loss,
    score_pairs,
    score_rows,
)
from .export_hf import trained_scorer

BATCH = 16  # rows per forward pass


class PairEvalError(ValueError):
    """A reward model's evaluation that cannot run as asked (one line, exit 2)."""


def evaluate_pairs(file: Path, ckpt: Checkpoint, episodes: int, pairs: str | None) -> dict[str, Any]:
    """The checkpoint's scorer on the first `episodes` pairs: the summary of `relay eval` (its
    return the pair accuracy) with the run's loss (learner.algo's) and the mean margin beside it."""
    cfg = ckpt.config
    prompts = cfg.get("prompts") or {}
    learner = cfg.get("learner") or {}
    try:
        loss = preference_loss(str(learner.get("algo"))).loss
    except ValueError as err:
        raise PairEvalError(f"{file}: {err}") from None
    section = learner.get(str(learner.get("algo"))) or {}
    limit = section.get("max_tokens", PreferenceSettings().max_tokens)
    source = pairs or prompts.get("eval") or prompts.get("train")
    model, tokenizer = trained_scorer(file, ckpt)
    try:
        found = load_pairs(str(source), tokenizer, int(limit), "--prompts" if pairs else "prompts.eval")
    except PromptError as err:
        raise PairEvalError(str(err)) from None
    held = found.head(episodes)
    t0 = time.perf_counter()
    pad = int(tokenizer.pad_token_id)
    out = score_pairs(lambda rows: score_rows(model, rows, pad), held, loss, BATCH)
    return {
        **pair_summary(out["correct"], out["tokens"], time.perf_counter() - t0),
        "loss": out["loss"],
        "reward_margin": out["reward_margin"],
    }
