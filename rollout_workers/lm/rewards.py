"""Rewards of a language run (`prompts.rewards`): the registry, the user's `module:fn` functions and
the checks every score passes.

A reward function has TRL's signature, `fn(prompts, completions, **columns) -> list[float]`, called
as TRL calls it, by keyword (`prompts=`, `completions=`, `completion_ids=`, then the columns), so
TRL reward functions work unchanged: `completions` are strings for text prompts and
`[{"role": "assistant", "content": text}]` for chat prompts; every column of the prompt file
but `prompt` comes by name. A value of None means "does not apply" (TRL's rule: that function is
left out of the completion's weighted sum). What is counted as a fault, and leaves the completion
with no advantage, never a silent 0: a function that raises (`raised`), runs past
`prompts.reward_timeout_s` (`timeout`, counted by the caller), returns NaN/inf or a non-number
(`nonfinite`), or a list of the wrong length (`length`).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable
from typing import Any, NamedTuple

from ...contracts.config import REWARDS_WITH_ARGUMENT, is_code_reward
from ...contracts.metrics import REWARD_FAULT_KINDS
from ..user_code import UserCodeError, import_callable, one_line
from .reward_models import reward_model

RewardFn = Callable[..., list[Any]]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def completion_text(completion: Any) -> str:
    """The text of a completion as reward functions receive it (a string or assistant messages)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def final_number(text: str) -> float | None:
    """The answer a GSM8K-style text ends with: after '####' where there is one, else its last
    number (thousands separators dropped); None when it has no number."""
    tail = text.rsplit("####", 1)[-1] if "####" in text else text
    found = _NUMBER.findall(tail)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def exact_match(prompts: list[Any], completions: list[Any], answer: list[Any], **_: Any) -> list[float]:
    """1 where the completion, stripped, is the `answer` column's text, else 0."""
    return [
        float(completion_text(c).strip() == str(a).strip()) for c, a in zip(completions, answer, strict=True)
    ]


def numeric_match(prompts: list[Any], completions: list[Any], answer: list[Any], **_: Any) -> list[float]:
    """1 where the completion's final number equals the `answer` column's (GSM8K: after '####')."""
    out = []
    for c, a in zip(completions, answer, strict=True):
        want = a if isinstance(a, int | float) else final_number(str(a))
        got = final_number(completion_text(c))
        out.append(
            float(want is not None and got is not None and math.isclose(got, float(want), abs_tol=1e-6))
        )
    return out


def regex(pattern: str) -> RewardFn:
    """1 where the pattern is found in the completion (re.search, DOTALL), else 0: a format reward."""
    try:
        compiled = re.compile(pattern, re.DOTALL)
    except re.error as err:
        raise ValueError(f"prompts.rewards: regex:{pattern} is not a regular expression ({err})") from None

    def reward(prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        return [float(compiled.search(completion_text(c)) is not None) for c in completions]

    return reward


def length_at_most(limit: str) -> RewardFn:
    """1 where the completion has at most `limit` characters, else 0."""
    if not limit.isdigit():
        raise ValueError(f"prompts.rewards: length_at_most:{limit} needs a whole number of characters")
    n = int(limit)

    def reward(prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        return [float(len(completion_text(c)) <= n) for c in completions]

    return reward


REWARDS: dict[str, RewardFn] = {"exact_match": exact_match, "numeric_match": numeric_match}
REWARD_FACTORIES: dict[str, Callable[[str], RewardFn]] = {
    "regex": regex,
    "length_at_most": length_at_most,
    "model": reward_model,
}
assert tuple(REWARD_FACTORIES) == REWARDS_WITH_ARGUMENT


def resolve_reward(spec: str) -> RewardFn:
    """The function a prompts.rewards entry names; ValueError (one line) when it names none."""
    if spec in REWARDS:
        return REWARDS[spec]
    name, _, arg = spec.partition(":")
    if name in REWARD_FACTORIES and arg:
        return REWARD_FACTORIES[name](arg)
    if is_code_reward(spec):
        try:
            return import_callable(spec, "prompts.rewards")
        except UserCodeError as err:
            raise ValueError(str(err)) from None
    known = ", ".join([*REWARDS, *(f"{k}:<arg>" for k in REWARD_FACTORIES)])
    raise ValueError(f"prompts.rewards: {spec!r} is not a reward: choose {known}, or module:fn")


def resolve_rewards(specs: list[str]) -> list[RewardFn]:
    return [resolve_reward(s) for s in specs]


class Scored(NamedTuple):
    """A batch's scores: the weighted reward of each completion, or None where it has none; fault
    counts by kind; one line per fault (for a warning); each function's own values by completion
    (None where it did not apply or faulted)."""

    rewards: list[float | None]
    faults: dict[str, int]
    notes: list[str]
    per_reward: list[list[float | None]]

    @staticmethod
    def concat(parts: list[Scored], kinds: tuple[str, ...] = REWARD_FAULT_KINDS) -> Scored:
        """The scores of consecutive slices of a batch, as one."""
        faults = {k: sum(p.faults.get(k, 0) for p in parts) for k in kinds}
        n_fns = max((len(p.per_reward) for p in parts), default=0)
        per = [
            [
                v
                for p in parts
                for v in (p.per_reward[i] if i < len(p.per_reward) else [None] * len(p.rewards))
            ]
            for i in range(n_fns)
        ]
        return Scored([r for p in parts for r in p.rewards], faults, [x for p in parts for x in p.notes], per)


def faulted(n: int, kind: str, note: str, n_fns: int) -> Scored:
    """Scores of n completions that all got no reward, by a fault of `kind`."""
    faults = dict.fromkeys(REWARD_FAULT_KINDS, 0)
    faults[kind] = n
    return Scored([None] * n, faults, [note], [[None] * n for _ in range(n_fns)])


def score_batch(
    fns: list[RewardFn],
    weights: list[float],
    prompts: list[Any],
    completions: list[Any],
    columns: dict[str, list[Any]],
    completion_ids: list[list[int]] | None = None,
) -> Scored:
    """The batch's scores (`Scored`). A function's fault leaves the completions it should have
    scored with no reward."""
    n = len(completions)
    total: list[float | None] = [0.0] * n
    applied = [False] * n
    faults = dict.fromkeys(REWARD_FAULT_KINDS, 0)
    notes: list[str] = []
    per_reward: list[list[float | None]] = []
    for fn, w in zip(fns, weights, strict=True):
        own: list[float | None] = [None] * n
        per_reward.append(own)
        name = getattr(fn, "__name__", "reward")
        try:
            values = fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
        except Exception as err:  # the user's code: any exception is a fault of this batch
            faults["raised"] += n
            notes.append(f"reward {name} raised {one_line(err)}")
            total = [None] * n
            continue
        if not isinstance(values, list | tuple) or len(values) != n:
            faults["length"] += n
            got = len(values) if isinstance(values, list | tuple) else type(values).__name__
            notes.append(f"reward {name} returned {got} values for {n} completions")
            total = [None] * n
            continue
        for i, v in enumerate(values):
            if v is None:
                continue
            if not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
                faults["nonfinite"] += 1
                notes.append(f"reward {name} returned {v!r}")
                total[i] = None
                continue
            own[i] = float(v)
            if total[i] is not None:
                total[i] = float(total[i]) + w * float(v)  # type: ignore[arg-type]
                applied[i] = True
    return Scored([t if a else None for t, a in zip(total, applied, strict=True)], faults, notes, per_reward)
