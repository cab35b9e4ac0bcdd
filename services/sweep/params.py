"""Sweep parameters: `learner.lr=loguniform(1e-4,3e-3)` read as data, never evaluated.

    uniform(a, b)       a float drawn uniformly in [a, b]
    loguniform(a, b)    a float whose log is uniform in [log a, log b] (0 < a < b)
    randint(a, b)       an integer in [a, b], both ends included
    choice(v1, v2, ...) one of the values (each read as YAML: 0.1, true, [64, 64], tanh)
    grid(v1, v2, ...)   every value, each in trials of its own (crossed with the other grids)

The expression's name is looked up in a table and its arguments are YAML scalars or flow lists
parsed with the safe loader: nothing in a sweep file or on the command line runs as code.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...contracts.config import ConfigError, parse_yaml

KINDS = ("uniform", "loguniform", "randint", "choice", "grid")
RANGES = ("uniform", "loguniform", "randint")
_EXPR = re.compile(r"^\s*([a-z]+)\s*\((.*)\)\s*$", re.DOTALL)
MAX_VALUES = 1000  # values of one choice/grid (a sweep larger than this is a typo)
# Trials of one planned sweep: a grid is the product of its parameters, so 10 values in 6 grids
# already plan a million trials (each checked up front, each a run folder): a typo, refused.
MAX_TRIALS = 10_000


class SweepError(ValueError):
    """A sweep that cannot start: bad expressions, keys, ranges or options (one line, exit 2)."""


@dataclass(frozen=True)
class Param:
    """One swept config leaf: `key`, the expression's `kind` and its arguments `values`."""

    key: str
    kind: str
    values: tuple[Any, ...]

    def probes(self) -> tuple[Any, ...]:
        """Values that stand for the whole domain when the config checks it: a range's two ends,
        every value of a list."""
        return self.values

    @property
    def finite(self) -> bool:
        return self.kind in ("choice", "grid")

    def sample(self, rng: np.random.Generator) -> Any:
        """One value (grid points are not sampled: see `grid_points`)."""
        lo, hi = (*self.values, None, None)[:2]
        if self.kind == "uniform":
            return float(rng.uniform(lo, hi))
        if self.kind == "loguniform":
            return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))
        if self.kind == "randint":
            return int(rng.integers(lo, hi + 1))
        return self.values[int(rng.integers(len(self.values)))]

    def describe(self) -> str:
        return f"{self.key}={self.kind}({', '.join(_show(v) for v in self.values)})"


def _show(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def split_args(text: str) -> list[str]:
    """Top-level comma-separated arguments: commas inside [...], {...} or quotes stay."""
    args, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(text[start:i])
            start = i + 1
    args.append(text[start:])
    return [a.strip() for a in args]


_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _value(text: str, where: str) -> Any:
    """One argument as YAML data; `1e-4` is a float here too (YAML 1.1 reads it as a string)."""
    value = parse_yaml(text, where)
    return float(value) if isinstance(value, str) and _FLOAT.match(value) else value


def _number(key: str, kind: str, raw: Any, integer: bool) -> float | int:
    ok = isinstance(raw, int | float) and not isinstance(raw, bool) and math.isfinite(raw)
    if not ok or (integer and not isinstance(raw, int)):
        what = "a whole number" if integer else "a finite number"
        raise SweepError(f"{key}={kind}(...): {raw!r} is not {what}")
    return raw


def _range(key: str, kind: str, args: list[Any]) -> tuple[Any, ...]:
    if len(args) != 2:
        raise SweepError(f"{key}={kind}(...) takes 2 values (low, high), not {len(args)}")
    lo, hi = (_number(key, kind, a, integer=kind == "randint") for a in args)
    if kind == "randint" and lo > hi:
        raise SweepError(f"{key}=randint({lo}, {hi}): low must be at most high")
    if kind != "randint" and not lo < hi:
        raise SweepError(f"{key}={kind}({lo}, {hi}): low must be below high")
    if kind == "loguniform" and lo <= 0:
        raise SweepError(f"{key}=loguniform({lo}, {hi}): both ends must be above 0")
    return (lo, hi)


def parse_param(key: str, expression: str) -> Param:
    """`key` and its expression as a Param, or SweepError naming what is wrong."""
    key = key.strip()
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_-]+)+", key):
        raise SweepError(f"--param {key!r}: expected a config leaf such as learner.lr")
    m = _EXPR.match(expression)
    if m is None or m.group(1) not in KINDS:
        kinds = ", ".join(f"{k}(...)" for k in KINDS)
        raise SweepError(f"{key}={expression.strip()!r}: expected one of {kinds}")
    kind, inner = m.group(1), m.group(2)
    if not inner.strip():
        raise SweepError(f"{key}={kind}(): no values")
    pieces = split_args(inner)
    if len(pieces) > MAX_VALUES:
        raise SweepError(f"{key}={kind}(...): more than {MAX_VALUES} values")
    if any(p == "" for p in pieces):
        raise SweepError(f"{key}={kind}(...): an empty value (two commas in a row?)")
    try:
        args = [_value(p, f"{key}={kind}(...)") for p in pieces]
    except ConfigError as err:
        raise SweepError(str(err)) from None
    if kind in RANGES:
        return Param(key, kind, _range(key, kind, args))
    if any(isinstance(a, dict) for a in args):
        raise SweepError(f"{key}={kind}(...): a value is a mapping; set its leaves one by one")
    return Param(key, kind, tuple(args))


def parse_cli_param(item: str) -> tuple[str, str]:
    """`key=expression` from --param."""
    if "=" not in item:
        raise SweepError(f"--param {item!r}: expected key=expression, e.g. learner.lr=loguniform(1e-4,3e-3)")
    key, expression = item.split("=", 1)
    return key.strip(), expression


def grid_points(params: list[Param]) -> list[dict[str, Any]]:
    """Every combination of the grid params' values ([{}] when there are none)."""
    grids = [p for p in params if p.kind == "grid"]
    keys = [p.key for p in grids]
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*[p.values for p in grids])]


def draw_trials(params: list[Param], samples: int, search: str, seed: int) -> list[dict[str, Any]]:
    """The trials' values, in order, for a search relay draws itself (random, grid).

    random: `samples` draws of every non-grid param, each crossed with every grid point (Ray
    Tune's rule); grid: every combination of the (choice or grid) values, `samples` times.
    """
    finite = [Param(p.key, "grid", p.values) for p in params] if search == "grid" else params
    count = samples * math.prod(len(p.values) for p in finite if p.kind == "grid")
    if count > MAX_TRIALS:
        raise SweepError(
            f"the sweep plans {count} trials ({samples} samples x every grid combination); "
            f"at most {MAX_TRIALS}: fewer values or samples"
        )
    if search == "grid":
        return [dict(point) for _ in range(samples) for point in grid_points(finite)]
    rng = np.random.default_rng(seed)
    trials = []
    for _ in range(samples):
        drawn = {p.key: p.sample(rng) for p in params if p.kind != "grid"}
        trials += [{**drawn, **point} for point in grid_points(params)]
    return trials
