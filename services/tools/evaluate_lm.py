"""`relay eval RUN` of a language run: its trained model's completions of the eval prompts (the
run's prompts.eval, else prompts.train, or --prompts), one per prompt, greedy unless
--stochastic, scored by the run's rewards; the episode return is the completion's reward.

The checkpoint and its config are data: a stored `module:fn` reward imports code, so it runs only
when the user names it again with --reward (as `relay resume` asks for code settings).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...contracts.checkpoint import Checkpoint
from ...contracts.config import is_code_reward
from ...contracts.prompts import PromptError, as_completions, load_prompts
from ...policy.causal_lm import complete
from ...rollout_workers.lm.rewards import resolve_rewards, score_batch
from ...rollout_workers.user_code import add_finder
from .export_hf import trained_policy


class LanguageEvalError(ValueError):
    """A language evaluation that cannot run as asked (one line, exit 2)."""


@dataclass
class LanguageEval:
    """The scores of a language evaluation."""

    rewards: list[float]
    unscored: int
    lengths: list[int]
    seconds: float

    def summary(self) -> dict[str, Any]:
        r = np.asarray(self.rewards if self.rewards else [np.nan])
        return {
            "episodes": len(self.rewards),
            "return_mean": float(r.mean()),
            "return_std": float(r.std()),
            "return_min": float(r.min()),
            "return_max": float(r.max()),
            "len_mean": float(np.mean(self.lengths)) if self.lengths else 0.0,
            "unscored": self.unscored,
            "seconds": self.seconds,
        }


def _rewards(saved: list[str], named: list[str]) -> list[str]:
    if named:
        for spec in named:
            if is_code_reward(spec):
                add_finder(spec.partition(":")[0].split(".")[0], os.getcwd())
        return named
    code = [s for s in saved if is_code_reward(s)]
    if code:
        again = " ".join(f"--reward {s}" for s in saved)
        raise LanguageEvalError(
            f"the run's prompts.rewards names {', '.join(code)}, which imports and runs code; name its "
            f"rewards yourself: relay eval ... {again}"
        )
    return saved


def evaluate_language(
    file: Path, ckpt: Checkpoint, episodes: int, stochastic: bool, prompts: str | None, rewards: list[str]
) -> LanguageEval:
    """Completions of the first `episodes` prompts by the checkpoint's model, scored."""
    cfg = ckpt.config
    prompt_cfg = cfg.get("prompts") or {}
    gen_cfg = cfg.get("generation") or {}
    policy, tokenizer = trained_policy(file, ckpt)
    policy.eval()
    source = prompts or prompt_cfg.get("eval") or prompt_cfg.get("train")
    max_tokens = int(prompt_cfg.get("max_prompt_tokens", 256))
    try:
        rows = load_prompts(str(source), tokenizer, max_tokens, "--prompts" if prompts else "prompts.eval")
        fns = resolve_rewards(_rewards(list(prompt_cfg.get("rewards") or []), rewards))
    except (PromptError, ValueError) as err:
        raise LanguageEvalError(str(err)) from None
    weights = prompt_cfg.get("reward_weights") if not rewards else None
    weights = weights or [1.0] * len(fns)
    take = list(range(min(episodes, len(rows))))
    texts, token_ids, columns = rows.rows(take)
    new, temperature = int(gen_cfg.get("max_new_tokens", 64)), float(gen_cfg.get("temperature", 1.0))
    t0 = time.perf_counter()
    seed = prompt_cfg.get("seed")  # the run's seed (prompts.seed, else env.seed: language_seed)
    seed = seed if seed is not None else (cfg.get("env") or {}).get("seed", 0)
    g = torch.Generator().manual_seed(int(seed))
    top_k = 0 if stochastic else 1
    tokens = complete(
        lambda ids, mask: policy.generate(ids, mask, new, temperature, top_k, g),
        token_ids,
        [max_tokens],
        policy.pad_id,
        32,
    )
    completions = as_completions(texts, tokenizer.batch_decode(tokens, skip_special_tokens=True))
    scored = score_batch(fns, weights, texts, completions, columns, tokens).rewards
    got = [r for r in scored if r is not None]
    return LanguageEval(got, len(scored) - len(got), [len(t) for t in tokens], time.perf_counter() - t0)
