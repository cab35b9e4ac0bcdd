"""Writing files so that nothing already written is lost by a mistake, a crash or a link.

Every replaced file goes through a temporary file that is created exclusively (never through a link
someone left at its name), fsynced, then renamed; the directory is fsynced after. Nothing here
follows a symbolic link when it writes, and nothing reads a FIFO or a device as if it were a file.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class OutputError(ValueError):
    """An output path that relay will not write (one line, exit 2); nothing was written."""


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new file in `folder` durable (the directory entry itself)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_tmp(path: Path, write: Callable[[BinaryIO], object]) -> Path:
    """What `write` writes to a new `path.tmp`, fsynced. A stale tmp (a killed writer's, or a
    planted link) is removed first: unlink removes a link itself, never its target."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to path.tmp, fsync it, rename it over `path`, fsync the directory.

    A rename replaces a link at `path` by the file, never the link's target."""
    atomic_write_with(path, lambda f: f.write(data))


def atomic_write_with(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """As `atomic_write`, with `write` streaming the contents into the temporary file (a
    checkpoint is written by torch.save as it goes, never held twice in memory)."""
    os.replace(_write_tmp(path, write), path)
    fsync_dir(path.parent)


def write_new(path: Path, data: bytes, replace: bool) -> None:
    """As `atomic_write`, but with `replace` False the file is only ever created: a file that
    appeared at `path` meanwhile is kept (OutputError), never overwritten."""
    tmp = _write_tmp(path, lambda f: f.write(data))
    try:
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails if path exists: the check and the write are one step
    except FileExistsError:
        raise OutputError(f"{path} appeared while it was being written; it was left as it is") from None
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def write_numbered(folder: Path, stem: str, suffix: str, data: bytes) -> Path:
    """Write `data` as a new file `stem + suffix` in `folder` (created as needed), or as
    `stem-2 + suffix`, `-3`... when that name is taken: never over an existing file."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise OutputError(f"{folder} is not a folder relay may write into")
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        path = folder / f"{stem}{'' if n == 1 else f'-{n}'}{suffix}"
        if path.exists() or path.is_symlink():
            continue
        try:
            write_new(path, data, replace=False)
            return path
        except OutputError:
            continue  # taken meanwhile: the next number
    raise OutputError(f"{folder}: no free name for {stem}{suffix}")


def open_no_follow(path: Path, append: bool = True) -> int:
    """A descriptor for writing (and reading back) a run's own file, appending or truncating,
    refused with OSError when `path` is a link or anything but a regular file."""
    flags = os.O_RDWR | os.O_CREAT | NOFOLLOW | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags | os.O_NONBLOCK, 0o644)  # O_NONBLOCK: a FIFO must not block the open
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def read_regular(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of a regular file; OSError for a link, a FIFO, a device or a folder
    (each of which could hang a reader or feed it without end)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        os.set_blocking(fd, True)
        chunks, left = [], limit
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def check_output(out: Path, inputs: Iterable[Path], force: bool, flag: str = "--out") -> None:
    """Refuse, writing nothing, an output path that would lose data: one of the inputs (by name, link
    or hard link), a link, anything but a regular file (a FIFO, a device, a folder), an existing file
    unless `force`, or a path in a folder that is not writable."""
    for src in inputs:
        if out.resolve() == src.resolve() or (out.exists() and os.path.samefile(out, src)):
            raise OutputError(f"{flag} {out} is the input file itself; choose another path")
    if out.is_symlink():
        raise OutputError(f"{flag} {out} is a symbolic link; relay never writes through one")
    if out.exists() and not out.is_file():
        raise OutputError(f"{flag} {out} exists and is not a regular file; choose another path")
    if out.exists() and not force:
        raise OutputError(f"{flag} {out} exists; add --force to replace it")
    parent = out.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{flag} {out}: {parent} is not a writable folder")
