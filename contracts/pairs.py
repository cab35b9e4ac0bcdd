"""Preference pairs (`learner.algo: reward_model`'s `prompts.train` and `prompts.eval`): what a
reward model is trained and checked on, a contract the learner (which scores them) and the
driver's checks (which read them first) share.

A local JSONL or Parquet file, read under the prompt files' budgets (`contracts/prompts.py`);
each row has `chosen` and `rejected` (text, or chat messages), an optional `prompt` before them
(text, or chat messages) and an optional `margin` (a number: how much better `chosen` is, for
a margin in the Bradley–Terry loss); other columns are ignored. A row is read the way a served
reward model reads a completion (`rollout_workers/lm/reward_models.py`): a text prompt and its
reply are one text; a chat prompt and its reply (a text reply becomes the assistant's message)
one conversation rendered by the tokenizer's chat template with nothing appended (in the
budgeted child process of `contracts/chat_template.py`). Tokens are taken without special tokens
added, as the served model takes them. Everything wrong is found before a run starts, in one
line naming the file and the row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .chat_template import MAX_RENDERED_CHARS, TemplateError, render_all
from .prompts import PROMPT, PromptError, _Budget, _is_messages, _read_rows

CHOSEN, REJECTED, MARGIN = "chosen", "rejected", "margin"
# Rows a reward model scores are padded on the right to a bucket (`bucket_width`), trained
# (`learner/lm/reward_model.py`) and served (`rollout_workers/lm/reward_models.py`) alike: a few
# shapes, and the same shapes give the same scores. Short rows take a power of two from
# MIN_BUCKET (a batch of 5-token rows padded to 64 made 8x the work), long ones a multiple of BUCKET.
MIN_BUCKET, BUCKET = 8, 64


def bucket_width(rows: list[list[int]]) -> int:
    """The bucket a batch of rows is padded to: the next power of two from MIN_BUCKET up to
    BUCKET, past it the next multiple of BUCKET."""
    longest = max(len(r) for r in rows)
    if longest > BUCKET:
        return -(-longest // BUCKET) * BUCKET
    width = MIN_BUCKET
    while width < longest:
        width *= 2
    return width


def pad_right(rows: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows padded on the right to their bucket: ids and mask [R, W] int64 (every row's positions
    start at 0, as when it is scored alone)."""
    width = bucket_width(rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for k, r in enumerate(rows):
        ids[k, : len(r)] = r
        mask[k, : len(r)] = 1
    return ids, mask


@dataclass
class PairSet:
    """The rows of a pairs file: each side's token ids, and each row's margin (None without a
    margin column)."""

    chosen_ids: list[list[int]]
    rejected_ids: list[list[int]]
    margins: list[float] | None

    def __len__(self) -> int:
        return len(self.chosen_ids)

    def head(self, n: int) -> PairSet:
        """The first `n` pairs."""
        margins = None if self.margins is None else self.margins[:n]
        return PairSet(self.chosen_ids[:n], self.rejected_ids[:n], margins)


def _conversation(prompt: Any, reply: Any, where: str, n: int, side: str) -> str | list[dict[str, Any]]:
    """One side of row `n` as the reward model reads it: a text, or a conversation to render."""
    if not ((isinstance(reply, str) and reply) or _is_messages(reply)):
        raise PromptError(f"{where}: row {n} has no '{side}' column of text or chat messages")
    joined = _joined(prompt, reply)
    if joined is None:
        raise PromptError(
            f"{where}: row {n}: a text prompt with a chat '{side}'; make both text or both chat"
        )
    return joined


def _joined(prompt: Any, reply: Any) -> str | list[dict[str, Any]] | None:
    """A prompt (None: none) and its reply (text or messages) as one text or one conversation (a
    text reply to a chat prompt becomes the assistant's message); None for a text prompt with a
    chat reply."""
    if prompt is None:
        return reply  # a whole text, or a whole conversation
    if isinstance(prompt, str):
        return prompt + reply if isinstance(reply, str) else None
    if isinstance(reply, str):
        reply = [{"role": "assistant", "content": reply}]
    return [*prompt, *reply]


def scored_texts(tokenizer: Any, prompts: list[Any], replies: list[Any]) -> list[str]:
    """What a reward model reads of each (prompt, reply), as pairs files are read: a text prompt
    and its reply are one text; a chat prompt and its reply (a text reply becomes the assistant's
    message) one conversation, rendered by the reward model's chat template in the budgeted
    child process. ValueError (one line) where a pair mixes text and chat, or a template fails."""
    sides: list[str | list[dict[str, Any]]] = []
    for n, (prompt, reply) in enumerate(zip(prompts, replies, strict=True), 1):
        # an empty reply is scored too (the model ended at once)
        typed = (isinstance(prompt, str) or _is_messages(prompt)) and (
            isinstance(reply, str) or _is_messages(reply)
        )
        joined = _joined(prompt, reply) if typed else None
        if joined is None:
            raise ValueError(f"completion {n}: a text prompt takes a text reply, a chat prompt a chat one")
        sides.append(joined)
    try:
        return _render(tokenizer, sides, "completions")
    except PromptError as err:
        raise ValueError(str(err)) from None


def _margin(row: dict[str, Any], where: str, n: int) -> float:
    if MARGIN not in row:
        raise PromptError(f"{where}: row {n}: '{MARGIN}' must be in every row or in none")
    margin = row[MARGIN]
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not math.isfinite(margin):
        raise PromptError(f"{where}: row {n}: '{MARGIN}' is not a finite number")
    return float(margin)


def load_pairs(path: str | Path, tokenizer: Any, max_tokens: int, label: str = "prompts.train") -> PairSet:
    """Every pair of the file, tokenized; PromptError (one line) on the first thing wrong: a
    row without both sides, a prompt that is neither text nor messages, a margin that is not a
    finite number in every row or in none, a side over `max_tokens` tokens, or a budget spent."""
    budget = _Budget(label, Path(path))
    rows = _read_rows(Path(path), label, budget)
    where = budget.where
    if not rows:
        raise PromptError(f"{label}={path}: no rows")
    with_margin = MARGIN in rows[0]
    sides: list[str | list[dict[str, Any]]] = []
    margins: list[float] = []
    for n, row in enumerate(rows, 1):
        prompt = row.get(PROMPT)
        if prompt is not None and not ((isinstance(prompt, str) and prompt) or _is_messages(prompt)):
            raise PromptError(f"{where}: row {n}: '{PROMPT}' is neither text nor chat messages")
        if with_margin:
            margins.append(_margin(row, where, n))
        elif MARGIN in row:
            raise PromptError(f"{where}: row {n}: '{MARGIN}' must be in every row or in none")
        sides += [_conversation(prompt, row.get(side), where, n, side) for side in (CHOSEN, REJECTED)]
    ids = _tokens(tokenizer, _render(tokenizer, sides, where), max_tokens, budget)
    return PairSet(ids[0::2], ids[1::2], margins if with_margin else None)


def _tokens(tokenizer: Any, texts: list[str], max_tokens: int, budget: _Budget) -> list[list[int]]:
    """Each side's token ids (no special tokens added, as the served model reads it)."""
    ids: list[list[int]] = []
    for k, text in enumerate(texts):
        at = f"{budget.where}: row {k // 2 + 1}: '{(CHOSEN, REJECTED)[k % 2]}'"
        if len(text) > MAX_RENDERED_CHARS:
            raise PromptError(f"{at} is {len(text)} characters, over {MAX_RENDERED_CHARS}")
        tokens = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        if not tokens:
            raise PromptError(f"{at} has no tokens")
        if len(tokens) > max_tokens:
            raise PromptError(f"{at} is {len(tokens)} tokens, over the {max_tokens} it may take")
        ids.append(tokens)
        if k % 1024 == 0:
            budget.clock()
    return ids


def _render(tokenizer: Any, sides: list[str | list[dict[str, Any]]], where: str) -> list[str]:
    """Each side's text: itself, or its conversation through the chat template, whole."""
    chats = [k for k, s in enumerate(sides) if not isinstance(s, str)]
    try:
        rendered = render_all(tokenizer, [sides[k] for k in chats], generation_prompt=False)  # type: ignore[misc]
    except TemplateError as err:
        at, _, why = str(err).partition(": ")
        if at.startswith("row ") and at[4:].isdigit():
            k = chats[int(at[4:]) - 1]
            raise PromptError(f"{where}: row {k // 2 + 1}: {why}") from None
        raise PromptError(f"{where}: {err}") from None
    texts = [s if isinstance(s, str) else "" for s in sides]
    for k, text in zip(chats, rendered, strict=True):
        texts[k] = text
    return texts
