"""Atomic checkpoints: write to a temporary file, fsync, rename; the newest loadable one wins.

Loading uses torch.load(weights_only=True): a checkpoint never executes code.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)
_NAME = re.compile(r"^ckpt-(\d+)\.pt$")


def checkpoint_path(folder: Path, iteration: int) -> Path:
    return folder / f"ckpt-{iteration:08d}.pt"


def list_checkpoints(folder: Path) -> list[Path]:
    """Finished checkpoints, oldest first (temporary files are ignored)."""
    found = [(int(m.group(1)), p) for p in folder.glob("ckpt-*.pt") if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def save_checkpoint(folder: Path, iteration: int, state: dict[str, Any], keep: int) -> Path:
    """Write atomically, then prune to the newest `keep`."""
    folder.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(folder, iteration)
    tmp = final.with_suffix(".pt.tmp")
    with tmp.open("wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    for old in list_checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    return final


def load_checkpoint(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def load_newest_valid(folder: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads; a corrupt or truncated one is reported and skipped."""
    for path in reversed(list_checkpoints(folder)):
        try:
            return path, load_checkpoint(path)
        except Exception as err:
            log.warning("checkpoint %s is unreadable (%s); trying the previous one", path.name, err)
    return None
