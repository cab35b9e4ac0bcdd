"""The run directory: config.yaml, append-only metrics.jsonl, checkpoints/, events/, error.log.

Nothing already written is ever lost: `claim` refuses a directory that holds a run (continue one
with `relay resume`), creates a new one exclusively (two runs started in the same second get
different names), and every file replaced in place is written to a temporary file, fsynced, renamed
over the old one, and the directory fsynced after the rename.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from contracts.config import RelayConfig, dump_config

RUN_FILES = ("config.yaml", "metrics.jsonl", "checkpoints", "events", "error.log")


class RunDirError(ValueError):
    """The run directory cannot be used (one line, exit 2); nothing was created."""


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new file in `folder` durable (the directory entry itself)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to path.tmp, fsync it, rename it over `path`, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def default_run_name(cfg: RelayConfig) -> str:
    env = cfg.env.id.replace(":", "_").replace("/", "_")
    # The random suffix keeps runs started in the same second apart.
    return f"{env}-{cfg.learner.algo}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def _mkdir_error(path: Path, err: OSError) -> RunDirError:
    return RunDirError(f"run directory {path} cannot be created ({err.strerror or type(err).__name__})")


class RunDir:
    """Names the paths of one run."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.checkpoints = root / "checkpoints"
        self.events = root / "events"
        self.config_path = root / "config.yaml"
        self.metrics_path = root / "metrics.jsonl"
        self.error_log = root / "error.log"

    def holds_run(self) -> bool:
        return any((self.root / name).exists() for name in RUN_FILES)

    @staticmethod
    def target(cfg: RelayConfig, run_dir: str | None) -> Path:
        """Where `relay train` would put the run (the default name is fresh each call)."""
        if run_dir:
            return Path(run_dir)
        return Path(cfg.metrics.runs_dir) / (cfg.metrics.run_name or default_run_name(cfg))

    @staticmethod
    def check_new(path: Path) -> None:
        """Refuse, creating nothing, a path that cannot become a new run's directory."""
        if path.exists() and not path.is_dir():
            raise RunDirError(f"--run-dir {path} is a file, not a directory")
        if RunDir(path).holds_run():
            raise RunDirError(
                f"{path} already holds a run; continue it with `relay resume {path}` "
                "or choose another --run-dir"
            )
        parent = next((p for p in [path, *path.parents] if p.exists()), Path("."))
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise RunDirError(
                f"run directory {path} cannot be created ({parent} is not a writable directory)"
            )

    @staticmethod
    def claim(path: Path, cfg: RelayConfig) -> RunDir:
        """Create the run: the directory (new or empty), config.yaml written exclusively, checkpoints/
        and events/. Raises RunDirError if another run got there first."""
        RunDir.check_new(path)
        try:
            path.mkdir(parents=True, exist_ok=True)
            # O_EXCL: of two runs racing for one directory, exactly one gets it.
            fd = os.open(path / "config.yaml", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise RunDirError(f"{path} already holds a run; continue it with `relay resume {path}`") from None
        except OSError as err:
            raise _mkdir_error(path, err) from None
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(dump_config(cfg))
            f.flush()
            os.fsync(f.fileno())
        run = RunDir(path)
        run.checkpoints.mkdir(exist_ok=True)
        run.events.mkdir(exist_ok=True)
        fsync_dir(path)
        return run

    def write_config(self, cfg: RelayConfig) -> None:
        """Replace config.yaml atomically (a resumed run's merged config, once it has started)."""
        atomic_write(self.config_path, dump_config(cfg).encode("utf-8"))

    def clean_stale_tmp(self) -> list[Path]:
        """Remove `*.tmp` files a killed writer left behind; returns what was removed."""
        stale = [
            p for folder in (self.root, self.checkpoints) if folder.is_dir() for p in folder.glob("*.tmp")
        ]
        for p in stale:
            p.unlink(missing_ok=True)
        return stale
