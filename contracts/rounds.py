"""The round result: what one round of segments did. The learner writes it (one part per
data-parallel replica); `RoundResult.merge` assembles the round the driver sees from the parts,
the weights the learner actor published and the driver's own watchdog count, so no layer edits
another's result. Every count in it is this round's alone (a delta); the driver owns the run's
totals (`contracts.checkpoint.RunCounters`), so no counter has two owners.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from ..contracts.segment import ENV_FAULT_KINDS

MAX_STAT_NAMES = 256  # episode statistics a run keeps (a multi-agent env's agents each have one)


def add_stats(total: dict[str, list[float]], more: Any) -> dict[str, list[float]]:
    """Episode statistics by name, each name's values in order: `total`'s, then `more`'s. What
    `more` holds that is not a short name with finite numbers is left out (it came from a worker)."""
    out = {k: list(v) for k, v in total.items()}
    if not isinstance(more, dict):
        return out
    for k, v in more.items():
        if not (isinstance(k, str) and 0 < len(k) <= 120 and isinstance(v, list | tuple)):
            continue
        if k not in out and len(out) >= MAX_STAT_NAMES:
            continue
        values = [float(x) for x in v if isinstance(x, int | float) and math.isfinite(x)]
        out.setdefault(k, []).extend(values)
    return out


def add_faults(total: dict[str, int], more: dict[str, int]) -> dict[str, int]:
    """Env-fault counts by kind, summed (kinds outside ENV_FAULT_KINDS are ignored)."""
    return {k: int(total.get(k, 0)) + int(more.get(k, 0)) for k in ENV_FAULT_KINDS}


@dataclass(frozen=True)
class Publication:
    """Weights the learner actor published: their version, [object ref] (inside a list so Ray
    hands callers the reference, never the tensors) and the seconds the learner took to copy them
    out. The learner sends it with no ref; the driver adds its ref to the call's second return
    value, which holds the weights (`carrying`)."""

    version: int
    refs: list[Any]
    seconds: float = 0.0

    def carrying(self, ref: Any) -> Publication:
        """This publication with the object ref of its weights."""
        return replace(self, refs=[ref])


@dataclass
class RoundResult:
    """One round: episodes that finished, valid env steps, segments rejected or lost, worker
    restarts, env faults and AMP-skipped optimizer steps, and the update's metrics (None when no
    update ran)."""

    env_steps: int = 0
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    # Other values of finished episodes by name (Segment.episode_stats), in arrival order.
    episode_stats: dict[str, list[float]] = field(default_factory=dict)
    rejected_segments: int = 0
    reject_reason: str | None = None
    lost_segments: int = 0
    worker_restarts: int = 0
    # Rollout workers the stuck-worker watchdog killed (the driver's count, given to `merge`).
    stuck_workers: int = 0
    env_faults: dict[str, int] = field(default_factory=dict)
    amp_skipped_steps: int = 0
    metrics: dict[str, Any] | None = None
    # Seconds by phase in this round (wait_s, ingest_s, update_s, publish_s; contracts/metrics.py).
    phases: dict[str, float] = field(default_factory=dict)
    # The weights this round's update published (rank 0's; given to `merge`).
    published: Publication | None = None
    # A language run's samples people read: {"prompt", "completion", "reward"} (RUN/samples.jsonl).
    samples: list[dict[str, Any]] = field(default_factory=list)

    @staticmethod
    def merge(
        parts: list[RoundResult], published: Publication | None = None, stuck_workers: int = 0
    ) -> RoundResult:
        """One round from every data-parallel learner's share, the weights rank 0 published and
        the rollout workers the driver's watchdog killed: counts add up, rank 0 (the first)
        reports the update's metrics."""
        first = parts[0]
        # Replicas step in lockstep on averaged gradients, so they skip the same steps: rank 0's count.
        out = RoundResult(
            metrics=first.metrics,
            published=published,
            amp_skipped_steps=first.amp_skipped_steps,
            stuck_workers=stuck_workers,
        )
        # Phases: the slowest replica's (they run in parallel and wait for each other).
        out.phases = {k: max(p.phases.get(k, 0.0) for p in parts) for k in first.phases}
        if published is not None:
            out.phases["publish_s"] = published.seconds
        for part in parts:
            out.env_steps += part.env_steps
            out.episode_returns += part.episode_returns
            out.episode_lengths += part.episode_lengths
            out.episode_stats = add_stats(out.episode_stats, part.episode_stats)
            out.rejected_segments += part.rejected_segments
            out.reject_reason = out.reject_reason or part.reject_reason
            out.lost_segments += part.lost_segments
            out.worker_restarts += part.worker_restarts
            out.stuck_workers += part.stuck_workers
            out.env_faults = add_faults(out.env_faults, part.env_faults)
        return out
