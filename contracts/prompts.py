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
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .bounded import memory_cap
from .chat_template import MAX_RENDERED_CHARS, TemplateError, render_all

# Arguments every reward receives by these names (rollout_workers/lm/rewards.py): columns may not take them.
RESERVED_COLUMNS = ("prompts", "completions", "completion_ids")

PROMPT = "prompt"
# Budgets for a prompt file, each refused in one line naming the file and the limit: the file on
# disk; one JSON line or one row's values (a 100 MB line once took the process tree past 15 GB);
# the rows (a small Parquet file can declare millions); the bytes a Parquet file decompresses to
# (its metadata says, before anything is read); the memory reading it may take (dictionary-encoded
# values expand in Arrow's native code, past any Python check) and the bytes its rows may hold
# once read; the time loading it may take.
MAX_PROMPT_FILE_BYTES = 1 << 30
MAX_ROW_BYTES = 1 << 20
MAX_ROWS = 1_000_000
MAX_TOTAL_ROW_BYTES = 1 << 30
MAX_PARQUET_UNCOMPRESSED_BYTES = 2 << 30
READ_MEMORY_BYTES = 4 << 30
LOAD_SECONDS = 900.0
PARQUET_BATCH_ROWS = 256


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


class _Budget:
    """The rows and the time a file's load has left; PromptError naming the limit once spent."""

    def __init__(self, label: str, path: Path) -> None:
        self.where = f"{label}={path}"
        self.deadline = time.monotonic() + LOAD_SECONDS
        self.rows = 0
        self.bytes = 0

    def row(self, size: int) -> None:
        """One more row of `size` bytes."""
        self.rows += 1
        self.bytes += size
        if self.rows > MAX_ROWS:
            raise PromptError(f"{self.where}: more than {MAX_ROWS} rows, the most relay reads")
        if size > MAX_ROW_BYTES:
            raise PromptError(f"{self.where}: row {self.rows} is over {MAX_ROW_BYTES >> 20} MiB")
        if self.bytes > MAX_TOTAL_ROW_BYTES:
            raise PromptError(
                f"{self.where}: its rows hold more than {MAX_TOTAL_ROW_BYTES >> 20} MiB (at row {self.rows})"
            )
        if self.rows % 1024 == 0:
            self.clock()

    def clock(self) -> None:
        if time.monotonic() > self.deadline:
            raise PromptError(f"{self.where}: loading ran past {LOAD_SECONDS:g} s (at row {self.rows})")


def _read_jsonl(path: Path, budget: _Budget) -> list[dict[str, Any]]:
    rows = []
    with path.open("rb") as f:
        n = 0
        while line := f.readline(MAX_ROW_BYTES + 1):
            n += 1
            if len(line) > MAX_ROW_BYTES:
                raise PromptError(f"{budget.where}: line {n} is over {MAX_ROW_BYTES >> 20} MiB")
            if not line.strip():
                continue
            try:
                row = json.loads(line.decode("utf-8"))
            except UnicodeDecodeError:
                raise PromptError(f"{budget.where}: not UTF-8 text") from None
            except (json.JSONDecodeError, RecursionError):
                raise PromptError(f"{budget.where}: line {n} is not JSON") from None
            if not isinstance(row, dict):
                raise PromptError(f"{budget.where}: line {n} is not a JSON object")
            budget.row(len(line))
            rows.append(row)
    return rows


def _size(value: Any) -> int:
    """Roughly the bytes a row's value holds (its text and numbers), for MAX_ROW_BYTES."""
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, dict):
        return sum(len(str(k)) + _size(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(_size(v) for v in value) + len(value)
    return 8


def _read_parquet(path: Path, budget: _Budget) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
        meta = file.metadata
        declared = meta.num_rows
        unpacked = sum(
            meta.row_group(g).column(c).total_uncompressed_size
            for g in range(meta.num_row_groups)
            for c in range(meta.num_columns)
        )
    except Exception as err:  # pyarrow raises its own types for every malformed file
        raise PromptError(f"{budget.where}: not a readable Parquet file ({type(err).__name__})") from None
    if declared > MAX_ROWS:
        raise PromptError(f"{budget.where}: declares {declared} rows, over the {MAX_ROWS} relay reads")
    if unpacked > MAX_PARQUET_UNCOMPRESSED_BYTES:
        raise PromptError(
            f"{budget.where}: decompresses to {unpacked >> 20} MiB, over the "
            f"{MAX_PARQUET_UNCOMPRESSED_BYTES >> 20} MiB relay reads"
        )
    rows: list[dict[str, Any]] = []
    try:
        with memory_cap(READ_MEMORY_BYTES):
            for batch in file.iter_batches(batch_size=PARQUET_BATCH_ROWS):
                for row in batch.to_pylist():
                    budget.row(_size(row))
                    rows.append(row)
                budget.clock()
    except (MemoryError, pa.ArrowMemoryError):
        rows.clear()
        raise PromptError(
            f"{budget.where}: reading it needed more than {READ_MEMORY_BYTES >> 20} MiB of memory "
            f"(at row {budget.rows}: values that expand past what the file holds)"
        ) from None
    except PromptError:
        raise
    except Exception as err:
        raise PromptError(f"{budget.where}: not a readable Parquet file ({type(err).__name__})") from None
    return rows


def _read_rows(path: Path, label: str, budget: _Budget) -> list[dict[str, Any]]:
    if not path.is_file():
        raise PromptError(f"{label}={path}: no such file")
    if path.stat().st_size > MAX_PROMPT_FILE_BYTES:
        raise PromptError(f"{label}={path}: larger than {MAX_PROMPT_FILE_BYTES >> 30} GiB")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return _read_jsonl(path, budget)
    if suffix == ".parquet":
        return _read_parquet(path, budget)
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


def _columns(rows: list[dict[str, Any]], where: str) -> list[str]:
    """The columns beside the prompt, once every row is known to have a prompt and the same ones."""
    names = [k for k in rows[0] if k != PROMPT]
    taken = [k for k in names if k in RESERVED_COLUMNS]
    if taken:
        raise PromptError(
            f"{where}: column {taken[0]!r} is the name rewards receive completions by; rename it"
        )
    for n, row in enumerate(rows, 1):
        prompt = row.get(PROMPT)
        if not (isinstance(prompt, str) and prompt) and not _is_messages(prompt):
            raise PromptError(
                f"{where}: row {n} has no '{PROMPT}' column of text or chat messages "
                "([{role, content}, ...])"
            )
        if sorted(k for k in row if k != PROMPT) != sorted(names):
            first = sorted([PROMPT, *names])
            raise PromptError(f"{where}: row {n} has columns {sorted(row)}, row 1 has {first}")
    return names


def _texts(tokenizer: Any, prompts: list[Any], where: str) -> list[str]:
    """The text each prompt is generated from: itself, or its messages through the chat template
    (rendered under a budget in a child process, contracts/chat_template.py)."""
    chats = [n for n, prompt in enumerate(prompts) if not isinstance(prompt, str)]
    try:
        rendered = render_all(tokenizer, [prompts[n] for n in chats])
    except TemplateError as err:
        at, _, why = str(err).partition(": ")
        if at.startswith("row ") and at[4:].isdigit():  # its row counts among the chat rows
            raise PromptError(f"{where}: row {chats[int(at[4:]) - 1] + 1}: {why}") from None
        raise PromptError(f"{where}: {err}") from None
    texts = list(prompts)
    for n, text in zip(chats, rendered, strict=True):
        texts[n] = text
    return texts


def load_prompts(
    path: str | Path, tokenizer: Any, max_tokens: int, label: str = "prompts.train"
) -> PromptSet:
    """Every row of the file, tokenized; PromptError (one line) on the first thing wrong, or on
    the first budget a row, the file or its chat template runs past."""
    budget = _Budget(label, Path(path))
    rows = _read_rows(Path(path), label, budget)
    if not rows:
        raise PromptError(f"{label}={path}: no rows")
    names = _columns(rows, budget.where)
    prompts = [row[PROMPT] for row in rows]
    ids = []
    for n, (prompt, text) in enumerate(
        zip(prompts, _texts(tokenizer, prompts, budget.where), strict=True), 1
    ):
        if len(text) > MAX_RENDERED_CHARS:
            raise PromptError(f"{budget.where}: row {n} is {len(text)} characters, over {MAX_RENDERED_CHARS}")
        # A chat template writes the special tokens itself (a BOS among them): adding them again
        # would start the prompt with two.
        tokens = list(tokenizer(text, add_special_tokens=isinstance(prompt, str))["input_ids"])
        if not tokens:
            raise PromptError(f"{budget.where}: row {n}: the prompt has no tokens")
        if len(tokens) > max_tokens:
            raise PromptError(
                f"{budget.where}: row {n} is {len(tokens)} tokens, "
                f"over prompts.max_prompt_tokens={max_tokens}"
            )
        ids.append(tokens)
        if n % 1024 == 0:
            budget.clock()
    return PromptSet(prompts, ids, {k: [row[k] for row in rows] for k in names})


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


def merged_rounds(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One round from the `rewards_input` of each learner rank's share, in rank order (each rank
    sampled whole groups of the round's rows). Its generation seconds are the slowest share's."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    return {
        **{
            k: [x for p in parts for x in p[k]]
            for k in ("prompts", "completions", "completion_ids", "lengths", "ended")
        },
        "columns": {c: [x for p in parts for x in p["columns"][c]] for c in first["columns"]},
        "gen_s": max(float(p["gen_s"]) for p in parts),
        "gen_tokens": sum(int(p["gen_tokens"]) for p in parts),
        "prompt_width": first["prompt_width"],
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
