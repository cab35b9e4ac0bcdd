"""Prompt files (`prompts.train`, `prompts.eval`): the language run's environment, a contract the
learner (which generates from them) and the driver's checks (which read them first) share.

A local JSONL or Parquet file; each row has a `prompt` (text, or chat messages
`[{"role": ..., "content": ...}]` that the tokenizer's chat template turns into text) and any
other columns, which reach the rewards by name. Files are data: JSON lines and Parquet tables are
parsed, nothing in them is run. Everything wrong with a file (missing, empty, a row without a
prompt, a prompt over `prompts.max_prompt_tokens`) is found before a run starts, in one line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Arguments every reward receives by these names (rollout_workers/rewards.py): columns may not take them.
RESERVED_COLUMNS = ("prompts", "completions", "completion_ids")

PROMPT = "prompt"
MAX_PROMPT_FILE_BYTES = 8 << 30
MAX_ROWS = 50_000_000


class PromptError(ValueError):
    """A prompt file that cannot be used (one line, exit 2)."""


@dataclass
class PromptSet:
    """The rows of a prompt file: prompts as written (text or messages), their token ids after the
    chat template, and every other column by name (one value per row)."""

    prompts: list[Any]
    token_ids: list[list[int]]
    columns: dict[str, list[Any]]

    def __len__(self) -> int:
        return len(self.prompts)

    def rows(self, idx: list[int]) -> tuple[list[Any], list[list[int]], dict[str, list[Any]]]:
        """(prompts, token ids, columns) of rows `idx`, in that order."""
        return (
            [self.prompts[i] for i in idx],
            [self.token_ids[i] for i in idx],
            {k: [v[i] for i in idx] for k, v in self.columns.items()},
        )


def _read_jsonl(path: Path, label: str) -> list[dict[str, Any]]:
    rows = []
    try:
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except (json.JSONDecodeError, RecursionError):
                    raise PromptError(f"{label}={path}: line {n} is not JSON") from None
                if not isinstance(row, dict):
                    raise PromptError(f"{label}={path}: line {n} is not a JSON object")
                rows.append(row)
                if len(rows) > MAX_ROWS:
                    raise PromptError(f"{label}={path}: more than {MAX_ROWS} rows")
    except UnicodeDecodeError:
        raise PromptError(f"{label}={path}: not UTF-8 text") from None
    return rows


def _read_rows(path: Path, label: str) -> list[dict[str, Any]]:
    if not path.is_file():
        raise PromptError(f"{label}={path}: no such file")
    if path.stat().st_size > MAX_PROMPT_FILE_BYTES:
        raise PromptError(f"{label}={path}: larger than {MAX_PROMPT_FILE_BYTES >> 30} GiB")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return _read_jsonl(path, label)
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as err:  # pyarrow raises its own types for every malformed file
            raise PromptError(f"{label}={path}: not a readable Parquet file ({type(err).__name__})") from None
        return [dict(r) for r in table.to_pylist()]
    raise PromptError(f"{label}={path}: not a .jsonl or .parquet file")


def _is_messages(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) > 0
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value
        )
    )


def prompt_text(tokenizer: Any, prompt: Any) -> str:
    """The text a prompt is generated from: itself, or its messages through the chat template."""
    if isinstance(prompt, str):
        return prompt
    return str(tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True))


def load_prompts(
    path: str | Path, tokenizer: Any, max_tokens: int, label: str = "prompts.train"
) -> PromptSet:
    """Every row of the file, tokenized; PromptError (one line) on the first thing wrong."""
    rows = _read_rows(Path(path), label)
    if not rows:
        raise PromptError(f"{label}={path}: no rows")
    prompts, ids = [], []
    names = [k for k in rows[0] if k != PROMPT]
    taken = [k for k in names if k in RESERVED_COLUMNS]
    if taken:
        raise PromptError(
            f"{label}={path}: column {taken[0]!r} is the name rewards receive completions by; rename it"
        )
    columns: dict[str, list[Any]] = {k: [] for k in names}
    for n, row in enumerate(rows, 1):
        prompt = row.get(PROMPT)
        if not (isinstance(prompt, str) and prompt) and not _is_messages(prompt):
            raise PromptError(
                f"{label}={path}: row {n} has no '{PROMPT}' column of text or chat messages "
                "([{role, content}, ...])"
            )
        if sorted(k for k in row if k != PROMPT) != sorted(names):
            first = sorted([PROMPT, *names])
            raise PromptError(f"{label}={path}: row {n} has columns {sorted(row)}, row 1 has {first}")
        try:
            text = prompt_text(tokenizer, prompt)
        except Exception as err:  # a template that fails on these messages
            raise PromptError(
                f"{label}={path}: row {n}: the chat template failed ({type(err).__name__})"
            ) from None
        # A chat template writes the special tokens itself (a BOS among them): adding them again
        # would start the prompt with two.
        tokens = list(tokenizer(text, add_special_tokens=isinstance(prompt, str))["input_ids"])
        if not tokens:
            raise PromptError(f"{label}={path}: row {n}: the prompt has no tokens")
        if len(tokens) > max_tokens:
            raise PromptError(
                f"{label}={path}: row {n} is {len(tokens)} tokens, "
                f"over prompts.max_prompt_tokens={max_tokens}"
            )
        prompts.append(prompt)
        ids.append(tokens)
        for k in names:
            columns[k].append(row[k])
    return PromptSet(prompts, ids, columns)


def as_completions(prompts: list[Any], texts: list[str]) -> list[Any]:
    """Completion texts as rewards receive them (TRL's convention): the text after a text prompt,
    `[{"role": "assistant", "content": text}]` after chat messages."""
    return [
        t if isinstance(p, str) else [{"role": "assistant", "content": t}]
        for p, t in zip(prompts, texts, strict=True)
    ]


def rewards_input(
    prompts: list[Any],
    columns: dict[str, list[Any]],
    ids_list: list[list[int]],
    texts: list[str],
    ended: list[bool],
    gen_s: float,
    prompt_width: int,
) -> dict[str, Any]:
    """A generated round as the rewards and the round's metrics line take it, whoever sampled
    it: per row (prompts.batch_size x learner.group_size) the prompt, its dataset columns, the
    completion's token ids through its end token and its text, and whether it ended by EOS."""
    lengths = [len(ids) for ids in ids_list]
    return {
        "prompts": prompts,
        "completions": as_completions(prompts, texts),
        "completion_ids": ids_list,
        "columns": columns,
        "lengths": lengths,
        "ended": [bool(e) for e in ended],
        "gen_s": gen_s,
        "gen_tokens": sum(lengths),
        "prompt_width": prompt_width,
    }


class PromptOrder:
    """Which rows each round takes: every row once per epoch, in a seeded random order (or file
    order), `batch` rows at a time; its position is part of the checkpoint."""

    def __init__(self, size: int, batch: int, seed: int, shuffle: bool) -> None:
        self.size, self.batch, self.seed, self.shuffle = size, batch, seed, shuffle
        self.epoch, self.pos = 0, 0

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.size)
        return np.random.default_rng([self.seed, epoch]).permutation(self.size)

    def next(self) -> list[int]:
        out: list[int] = []
        while len(out) < self.batch:
            order = self._order(self.epoch)
            take = min(self.batch - len(out), self.size - self.pos)
            out += [int(i) for i in order[self.pos : self.pos + take]]
            self.pos += take
            if self.pos >= self.size:
                self.epoch, self.pos = self.epoch + 1, 0
        return out

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            yield self.next()

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.pos = int(state.get("epoch", 0)), int(state.get("pos", 0))
        self.pos = self.pos if 0 <= self.pos < self.size else 0


def pad_left(token_ids: list[list[int]], buckets: list[int], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids [B, P], mask [B, P]) with every row left-padded to P, the smallest bucket that holds
    the longest row (the few fixed shapes a compiled generation step sees)."""
    longest = max(len(t) for t in token_ids)
    width = next((b for b in buckets if b >= longest), longest)
    ids = np.full((len(token_ids), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(token_ids), width), dtype=np.int64)
    for i, t in enumerate(token_ids):
        if t:
            ids[i, width - len(t) :] = t
            mask[i, width - len(t) :] = 1
    return ids, mask
