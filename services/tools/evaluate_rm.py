"""`relay eval RUN` of a reward model's run: its trained scorer on preference pairs (the run's
prompts.eval, else prompts.train, or --prompts), the first --episodes of them; an episode is a
pair, its return 1 where the chosen side scored above the rejected one (the mean is the pair
accuracy). The checkpoint, its config and the pairs file are data.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from ...contracts.checkpoint import Checkpoint
from ...contracts.pairs import PairSet, load_pairs
from ...contracts.prompts import PromptError
from ...learner.lm.reward_model import PreferenceSettings, bradley_terry, score_rows
from .export_hf import trained_scorer

BATCH = 16  # rows per forward pass


class PairEvalError(ValueError):
    """A reward model's evaluation that cannot run as asked (one line, exit 2)."""


def evaluate_pairs(file: Path, ckpt: Checkpoint, episodes: int, pairs: str | None) -> dict[str, Any]:
    """The checkpoint's scorer on the first `episodes` pairs: the summary of `relay eval` (its
    return the pair accuracy) with the Bradley–Terry loss and the mean margin beside it."""
    cfg = ckpt.config
    prompts = cfg.get("prompts") or {}
    learner = cfg.get("learner") or {}
    section = learner.get(str(learner.get("algo"))) or {}
    limit = section.get("max_tokens", PreferenceSettings().max_tokens)
    source = pairs or prompts.get("eval") or prompts.get("train")
    model, tokenizer = trained_scorer(file, ckpt)
    try:
        found = load_pairs(str(source), tokenizer, int(limit), "--prompts" if pairs else "prompts.eval")
    except PromptError as err:
        raise PairEvalError(str(err)) from None
    n = min(episodes, len(found))
    held = PairSet(
        found.chosen_ids[:n], found.rejected_ids[:n], None if found.margins is None else found.margins[:n]
    )
    t0 = time.perf_counter()
    pad = int(tokenizer.pad_token_id)
    chosen = torch.cat([score_rows(model, held.chosen_ids[s : s + BATCH], pad) for s in range(0, n, BATCH)])
    rejected = torch.cat(
        [score_rows(model, held.rejected_ids[s : s + BATCH], pad) for s in range(0, n, BATCH)]
    )
    margin = None if held.margins is None else torch.tensor(held.margins)
    loss, stats = bradley_terry(chosen, rejected, margin)
    correct = (chosen > rejected).double()
    tokens = [len(a) + len(b) for a, b in zip(held.chosen_ids, held.rejected_ids, strict=True)]
    return {
        "episodes": n,
        "return_mean": float(correct.mean()),
        "return_std": float(correct.std(unbiased=False)),
        "return_min": float(correct.min()),
        "return_max": float(correct.max()),
        "len_mean": sum(tokens) / n,
        "loss": float(loss),
        "reward_margin": float(stats["reward_margin"]),
        "seconds": time.perf_counter() - t0,
    }
