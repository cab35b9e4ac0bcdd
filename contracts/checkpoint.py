"""The checkpoint schema: learner state, the run's counters, the resolved config, the family of
the run (env or language) and, for an env run, the env spec.

A checkpoint is data. It is read with `torch.load(weights_only=True)` (tensors and plain
containers only) and then checked here field by field. Its config and env spec describe the run;
nothing read from them imports a module, calls a factory or builds an env: `relay export` and
`relay verify` rebuild the policy from the env spec alone, and only a user's explicit command-line
choice ever makes an env.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..contracts.config import ENV_FAMILY, MODEL_FAMILIES, family_of_kind
from ..contracts.rounds import RoundResult, add_faults, add_stats
from ..contracts.spaces import EnvSpec, SpecError

# 1: session 1-2 checkpoints (no env spec, counters without amp_skipped_steps/env_faults).
CHECKPOINT_FORMAT = 2
FAMILY_NAMES = tuple(dict.fromkeys([ENV_FAMILY, *MODEL_FAMILIES.values()]))
RETURN_WINDOW = 20  # finished episodes behind episode_return_mean
STAT_WINDOW = 100  # values behind each episode statistic's mean (a win rate needs more than 20 games)


class CheckpointError(ValueError):
    """A file that is not a relay checkpoint, or one whose fields are malformed (one line)."""


@dataclass
class RunCounters:
    """The run's totals, owned by the driver; checkpointed, so a resumed run continues them.

    returns / lengths: the last RETURN_WINDOW finished episodes; stats: the last STAT_WINDOW
    values of each episode statistic (RoundResult.episode_stats).
    """

    iteration: int = 0
    env_steps: int = 0
    episodes: int = 0
    wall_s: float = 0.0
    worker_restarts: int = 0
    stuck_workers: int = 0
    learner_restarts: int = 0
    lost_segments: int = 0
    rejected_segments: int = 0
    amp_skipped_steps: int = 0
    env_faults: dict[str, int] = field(default_factory=dict)
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    stats: dict[str, list[float]] = field(default_factory=dict)

    def absorb(self, r: RoundResult) -> None:
        """Add one round's deltas."""
        self.env_steps += r.env_steps
        self.episodes += len(r.episode_returns)
        self.returns = (self.returns + list(r.episode_returns))[-RETURN_WINDOW:]
        self.lengths = (self.lengths + list(r.episode_lengths))[-RETURN_WINDOW:]
        self.stats = _stat_windows(add_stats(self.stats, r.episode_stats))
        self.worker_restarts += r.worker_restarts
        self.stuck_workers += r.stuck_workers
        self.lost_segments += r.lost_segments
        self.rejected_segments += r.rejected_segments
        self.amp_skipped_steps += r.amp_skipped_steps
        self.env_faults = add_faults(self.env_faults, r.env_faults)

    @staticmethod
    def from_dict(data: Any) -> RunCounters:
        """Every field checked before anything trusts it: counts are ints (a bool is not one) and
        >= 0, wall_s and returns finite, env faults a mapping of names to counts."""
        if not isinstance(data, dict):
            raise CheckpointError("checkpoint counters are not a mapping")
        known = {f.name for f in fields(RunCounters)}
        c = RunCounters(**{k: v for k, v in data.items() if k in known})
        for f in fields(RunCounters):
            value = getattr(c, f.name)
            if f.type == "int" and not _count(value):
                raise CheckpointError(f"checkpoint counters: {f.name}={value!r} is not a count")
        if not _finite(c.wall_s) or c.wall_s < 0:
            raise CheckpointError(f"checkpoint counters: wall_s={c.wall_s!r} is not a time")
        if not isinstance(c.env_faults, dict) or not all(
            isinstance(k, str) and _count(v) for k, v in c.env_faults.items()
        ):
            raise CheckpointError("checkpoint counters: env_faults is not a mapping of names to counts")
        if not isinstance(c.returns, list) or not all(_finite(x) for x in c.returns):
            raise CheckpointError("checkpoint counters: returns are not a list of finite numbers")
        if not isinstance(c.lengths, list) or not all(_count(x) for x in c.lengths):
            raise CheckpointError("checkpoint counters: lengths are not a list of counts")
        if not isinstance(c.stats, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and all(_finite(x) for x in v)
            for k, v in c.stats.items()
        ):
            raise CheckpointError("checkpoint counters: stats are not a mapping of names to finite numbers")
        c.stats = _stat_windows(add_stats({}, c.stats))
        c.env_faults = add_faults({}, c.env_faults)
        c.returns = [float(x) for x in c.returns][-RETURN_WINDOW:]
        c.lengths = list(c.lengths)[-RETURN_WINDOW:]
        c.wall_s = float(c.wall_s)
        return c


def _stat_windows(stats: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each episode statistic's last STAT_WINDOW values."""
    return {k: v[-STAT_WINDOW:] for k, v in stats.items()}


def _family(family: Any) -> str:
    """A recorded family, checked ("": none recorded, the config's model kind tells)."""
    if not isinstance(family, str) or (family and family not in FAMILY_NAMES):
        raise CheckpointError(f"checkpoint family {family!r} is not one of {', '.join(FAMILY_NAMES)}")
    return family


def _count(x: Any) -> bool:
    """A whole number >= 0 (True is not a count, nor is 20.5)."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class Checkpoint:
    """learner: `Learner.state_dict()` (tensors); counters: the run's totals; config: the resolved
    config as plain data; env: the env spec the policy was built for (None in format-1 files and
    in a language run's, which has no env); family: the run's family (`contracts/config.py`
    MODEL_FAMILIES; files written before it was recorded: their config's model.kind's)."""

    learner: dict[str, Any]
    counters: RunCounters
    config: dict[str, Any]
    env: EnvSpec | None
    format: int = CHECKPOINT_FORMAT
    family: str = ""

    def __post_init__(self) -> None:
        # none given (a file of before families were recorded): its config's model kind's
        model = self.config.get("model")
        self.family = self.family or family_of_kind(model.get("kind") if isinstance(model, dict) else None)

    def to_dict(self) -> dict[str, Any]:
        """What is written: tensors and plain containers only (loadable with weights_only=True)."""
        return {
            "format": self.format,
            "family": self.family,
            "learner": self.learner,
            "counters": asdict(self.counters),
            "config": self.config,
            "env": None if self.env is None else self.env.to_dict(),
        }

    @staticmethod
    def from_dict(raw: Any) -> Checkpoint:
        """Checked field by field; raises CheckpointError with one line."""
        if not isinstance(raw, dict):
            raise CheckpointError("not a relay checkpoint (not a mapping)")
        missing = [k for k in ("learner", "counters", "config") if k not in raw]
        if missing:
            raise CheckpointError(f"not a relay checkpoint (no {missing[0]!r})")
        learner, config = raw["learner"], raw["config"]
        if not isinstance(learner, dict) or not isinstance(learner.get("model"), dict):
            raise CheckpointError("checkpoint learner state has no model weights")
        if not isinstance(config, dict):
            raise CheckpointError("checkpoint config is not a mapping")
        try:
            env = None if raw.get("env") is None else EnvSpec.from_dict(raw["env"])
        except SpecError as err:
            raise CheckpointError(f"checkpoint env spec: {err}") from None
        counters = RunCounters.from_dict(raw["counters"])
        family = _family(raw.get("family", ""))
        fmt = raw.get("format", 1)
        if fmt not in (1, CHECKPOINT_FORMAT) or isinstance(fmt, bool):
            raise CheckpointError(f"checkpoint format {fmt!r} is not one this relay reads (1 or 2)")
        if not all(_count(learner.get(k, 0)) for k in ("version", "updates")):
            raise CheckpointError("checkpoint learner state: version and updates must be counts")
        if fmt == 1:  # these counters lived in the learner state then
            old = {k: learner.get(k, 0) for k in ("amp_skipped_steps", "rejected_segments")}
            if not all(_count(v) for v in old.values()):
                raise CheckpointError("checkpoint learner state: its counters are not counts")
            counters.amp_skipped_steps = old["amp_skipped_steps"]
            counters.rejected_segments = max(counters.rejected_segments, old["rejected_segments"])
        return Checkpoint(learner, counters, config, env, fmt, family)
