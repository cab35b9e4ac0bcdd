"""The run directory: config.yaml, append-only metrics.jsonl, checkpoints/, events/, error.log.

Nothing already written is ever lost: `claim` refuses a directory that holds a run (continue one
with `relay resume`), creates a new one exclusively (two runs started in the same second get
different names), and every file replaced in place is written to a temporary file, fsynced, renamed
over the old one, and the directory fsynced after the rename.

One process per run: `train` and `resume` hold an exclusive lock on the directory itself (flock on
its descriptor, so taking it creates no file) for their whole life; a second one is refused naming
the holder. The kernel drops the lock when its holder dies, so a crashed run never blocks the next.
Nothing in a run is written through a symbolic link: a run whose files or folders are links is
refused before anything is written or pruned.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

from ...contracts.config import RelayConfig, dump_config
from ...policy.models import model_kind
from ...services.runs.checkpoints import BEST_NAME, list_checkpoints
from ...services.runs.files import NOFOLLOW, atomic_write, fsync_dir, open_no_follow

RUN_FILES = ("config.yaml", "metrics.jsonl", "checkpoints", "events", "error.log", "samples.jsonl")
# A sample's prompt or completion is cut to this many characters in samples.jsonl.
SAMPLE_CHARS = 2000
# Who holds the run's lock (pid, host, command, since): written by the holder, read by the refused.
HOLDER_FILE = ".relay-lock"


class RunDirError(ValueError):
    """The run directory cannot be used (one line, exit 2); nothing was created."""


def default_run_name(cfg: RelayConfig) -> str:
    # What was trained on: the env, or a language run's model folder (the model kind says).
    source = model_kind(cfg.model.kind).run_source(cfg)
    env = re.sub(r"[^A-Za-z0-9._-]", "_", source).lstrip("._-") or "model"
    # The random suffix keeps runs started in the same second apart.
    return f"{env}-{cfg.learner.algo}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def _link_refusal(path: Path) -> str:
    return (
        f"{path} is a symbolic link; relay never writes through links in a run directory "
        "(name the folder itself)"
    )


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
        self.samples_path = root / "samples.jsonl"

        self._lock_fd: int | None = None

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
        if path.is_symlink():
            raise RunDirError(_link_refusal(path))
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
        """Create the run, locked: the directory (new or empty), config.yaml written exclusively,
        checkpoints/ and events/. Raises RunDirError if another run got there first."""
        RunDir.check_new(path)
        text = dump_config(cfg)  # before any file exists: a config that cannot be written leaves none
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise _mkdir_error(path, err) from None
        run = RunDir(path)
        run.lock()
        try:
            # O_EXCL: of two runs racing for one directory, exactly one gets it.
            fd = os.open(path / "config.yaml", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            run.unlock()
            raise RunDirError(f"{path} already holds a run; continue it with `relay resume {path}`") from None
        except OSError as err:
            run.unlock()
            raise _mkdir_error(path, err) from None
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        run.checkpoints.mkdir(exist_ok=True)
        run.events.mkdir(exist_ok=True)
        fsync_dir(path)
        return run

    # ---- one process per run ---------------------------------------------------------------------
    def lock(self) -> None:
        """Take the run's exclusive lock for this process's life (until `unlock`), or RunDirError
        naming the process that holds it. Records this process as the holder."""
        if self.root.is_symlink():
            raise RunDirError(_link_refusal(self.root))
        try:
            # O_NOFOLLOW: a link swapped in after the check above is refused too (ELOOP).
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
        except OSError as err:
            raise RunDirError(f"{self.root} cannot be opened as a run folder ({err.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunDirError(f"{self.root} is in use by {self._holder()}; one process per run") from None
        self._lock_fd = fd
        try:
            self.check_links()
        except RunDirError:
            self.unlock()
            raise
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": " ".join(sys.argv[:2]) or "relay",
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        atomic_write(self.root / HOLDER_FILE, json.dumps(holder).encode())

    def _holder(self) -> str:
        try:
            info = json.loads((self.root / HOLDER_FILE).read_bytes()[:4096])
            return f"pid {int(info['pid'])} on {str(info['host'])[:100]} (since {str(info['since'])[:40]})"
        except (OSError, ValueError, KeyError, TypeError):
            return "another relay process"

    def unlock(self) -> None:
        """Release the lock (the kernel releases it too when the process dies)."""
        if self._lock_fd is None:
            return
        with contextlib.suppress(OSError):
            (self.root / HOLDER_FILE).unlink()
        os.close(self._lock_fd)
        self._lock_fd = None

    def check_links(self) -> None:
        """Refuse a run whose files or folders are symbolic links (writing or pruning through one
        would change files outside the run), and run folders that are not folders."""
        names = [self.root / n for n in (*RUN_FILES, HOLDER_FILE)]
        for folder in (self.checkpoints, self.events):
            if folder.is_dir() and not folder.is_symlink():
                names += list(folder.iterdir())
        for p in names:
            if p.is_symlink():
                raise RunDirError(
                    f"{p} is a symbolic link; relay never writes through links in a run directory "
                    "(put the file or folder itself there)"
                )
        for folder in (self.checkpoints, self.events):
            if folder.exists() and not folder.is_dir():
                raise RunDirError(f"{folder} is not a folder")
        # A FIFO or a device where a file belongs would hang or feed a reader without end.
        for file in (self.config_path, self.metrics_path, self.error_log, self.samples_path):
            if file.exists() and not file.is_file():
                raise RunDirError(f"{file} is not a regular file")

    def artifacts(self) -> list[tuple[Path, str]]:
        """(file, folder) of what a tracker keeps of the run: config.yaml, the newest checkpoint,
        best.pt, ONNX exports beside the checkpoints, evaluation videos. Regular files only."""
        files = [(self.config_path, "")]
        files += [(p, "checkpoints") for p in list_checkpoints(self.checkpoints)[-1:]]
        files += [(self.checkpoints / BEST_NAME, "checkpoints")]
        files += [(p, "checkpoints") for p in sorted(self.checkpoints.glob("*.onnx"))]
        files += [(p, "videos") for p in sorted((self.root / "videos").glob("*.mp4"))]
        return [(p, folder) for p, folder in files if p.is_file() and not p.is_symlink()]

    def append_samples(self, iteration: int, samples: list[dict[str, Any]]) -> None:
        """One line per sample (a language run's prompts, completions and rewards) to samples.jsonl,
        appended, never through a link; texts cut to SAMPLE_CHARS."""
        if not samples:
            return

        def text(v: Any) -> str:
            return (v if isinstance(v, str) else json.dumps(v, ensure_ascii=False))[:SAMPLE_CHARS]

        lines = [
            json.dumps(
                {"iteration": iteration, **{k: text(v) if k != "reward" else v for k, v in s.items()}},
                ensure_ascii=False,
                allow_nan=False,
            )
            for s in samples
        ]
        fd = open_no_follow(self.samples_path)
        try:
            os.write(fd, ("\n".join(lines) + "\n").encode("utf-8", "replace"))
        finally:
            os.close(fd)

    def write_error_log(self, text: str) -> None:
        """error.log, replaced (never written through a link)."""
        atomic_write(self.error_log, text.encode("utf-8", "replace"))

    def write_config(self, cfg: RelayConfig) -> None:
        """Replace config.yaml atomically (a resumed run's merged config, once it has started)."""
        atomic_write(self.config_path, dump_config(cfg).encode("utf-8"))

    def clean_stale_tmp(self) -> list[Path]:
        """Remove `*.tmp` files and the `ckpt-*.tmp-*` folders of sharded checkpoints a killed
        writer left behind; returns what was removed (unlink removes a link itself, never what it
        points to; a folder is removed only when it is one, not a link to one)."""
        stale = [
            p for folder in (self.root, self.checkpoints) if folder.is_dir() for p in folder.glob("*.tmp")
        ]
        if self.checkpoints.is_dir():
            stale += list(self.checkpoints.glob("ckpt-*.tmp-*"))
        for p in stale:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
        return stale
