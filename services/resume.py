"""Restoring a TrainingLoop from its run's newest valid checkpoint (`relay resume`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from services.checkpoints import load_newest_valid

if TYPE_CHECKING:
    from services.train import TrainingLoop


class NoCheckpointError(Exception):
    pass


def restore(loop: TrainingLoop) -> None:
    """Load learner state and counters; metrics continue where the checkpoint left them."""
    from services.train import Counters

    found = load_newest_valid(loop.run.checkpoints)
    if found is None:
        raise NoCheckpointError(f"no valid checkpoint in {loop.run.checkpoints}")
    path, state = found
    loop.backend.load_state_dict(state["learner"])
    loop.c = Counters(**state["counters"])
    # Workers' RNG states are not checkpointed; a stream per resume point keeps a resumed run
    # reproducible without replaying the envs and noise the run started with.
    loop.backend.reseed_workers(loop.c.iteration)
    loop.returns.clear()
    loop.returns.extend(loop.c.returns)
    loop.lengths.clear()
    loop.lengths.extend(loop.c.lengths)
    _truncate_metrics(loop.run.metrics_path, loop.c.iteration)
    print(
        f"relay: resuming from {path.name} (iteration {loop.c.iteration}, {loop.c.env_steps} env steps)",
        file=sys.stderr,
        flush=True,
    )


def _truncate_metrics(path: Path, iteration: int) -> None:
    """Drop metrics lines past the checkpoint (they will be written again), atomically."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["iteration"] <= iteration:
                kept.append(line)
        except (json.JSONDecodeError, KeyError):
            continue  # a torn line from a kill: dropped
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w") as f:
        f.write("".join(x + "\n" for x in kept))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
