"""Sharded checkpoints: each learner rank writes its own shards with torch.distributed.checkpoint
(DCP), and any number of ranks (or one process with no process group) reads them back, resharded
by DCP to the reader's layout.

DCP's own reader runs code from the files it reads: it unpickles `.metadata` with `pickle.load`,
and loads non-tensor entries with `torch.load(weights_only=False)`. relay reads with `SafeReader`,
whose unpickler admits DCP's metadata classes (dataclasses of sizes, offsets and dtypes) and
nothing else, and whose tensor slices pass the zip check of `contracts/torch_files.py` before torch
reads them; `TensorsOnlyPlanner` refuses a non-tensor entry. What relay writes through DCP is
tensors only: the small rest of a learner's state lives in the checkpoint's own torch file.

A state here is {part: {name: tensor or {name: tensor}}} ("model", "optimizer" (per parameter),
"reference"); DCP flattens it to dotted keys. No Ray here; `save` and `load` are collectives when
a process group is up.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter, _StorageInfo
from torch.distributed.checkpoint.planner import ReadItem

from ...contracts.torch_files import zip_entries_problem

METADATA = ".metadata"  # DCP's own name for its index, written last by the coordinating rank
METADATA_LIMIT = 256 << 20  # an index past this is no relay checkpoint's (a 70B model's is a few MB)

# (module, name) of every global DCP's index may name: its metadata dataclasses, torch's Size,
# dtypes and layouts, and the path it records.
_DCP_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "StorageMeta",
        "MetadataIndex",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
}


class ShardError(ValueError):
    """Sharded checkpoint files that relay will not read (one line)."""


class _IndexUnpickler(pickle.Unpickler):
    """Python's unpickler restricted to DCP's index classes (the pickle module's own recipe for
    unpickling data that must not run code): anything else named in the file is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _DCP_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise ShardError(f"{METADATA} names {module}.{name[:60]}, which a checkpoint index never holds")


def read_metadata(folder: Path) -> dcp_metadata.Metadata:
    """A shards folder's DCP index, read as data; ShardError (one line) where it is missing, too
    large, not an index, or names anything but DCP's own classes."""
    path = folder / METADATA
    if not path.is_file() or path.is_symlink():
        raise ShardError(f"{folder.name}/{METADATA} is missing (a save that did not finish)")
    if path.stat().st_size > METADATA_LIMIT:
        raise ShardError(f"{folder.name}/{METADATA} is over {METADATA_LIMIT >> 20} MB")
    try:
        with path.open("rb") as f:
            found = _IndexUnpickler(f).load()
    except ShardError:
        raise
    except Exception as err:  # a truncated or garbled index
        raise ShardError(f"{folder.name}/{METADATA} cannot be read ({type(err).__name__})") from None
    if not isinstance(found, dcp_metadata.Metadata) or not isinstance(found.storage_data, dict):
        raise ShardError(f"{folder.name}/{METADATA} is not a checkpoint index")
    return found


def problem(folder: Path) -> str | None:
    """Why the shards in `folder` are not a whole checkpoint, or None: the index reads as data,
    holds tensors only, and every byte range it names lies within a file of the folder."""
    try:
        md = read_metadata(folder)
    except ShardError as err:
        return str(err)
    for key, entry in md.state_dict_metadata.items():
        if not isinstance(entry, dcp_metadata.TensorStorageMetadata):
            return f"{key[:80]} is not a tensor (relay's shards hold tensors only)"
    ends: dict[str, int] = {}
    for info in md.storage_data.values():
        if not isinstance(info, _StorageInfo) or not isinstance(info.relative_path, str):
            return f"{METADATA} holds a malformed storage entry"
        name = info.relative_path
        if Path(name).name != name or name.startswith("."):
            return f"{METADATA} names a file outside its folder: {name[:80]!r}"
        ends[name] = max(ends.get(name, 0), int(info.offset) + int(info.length))
    for name, end in sorted(ends.items()):
        path = folder / name
        if not path.is_file() or path.is_symlink():
            return f"shard {name} is missing"
        if path.stat().st_size < end:
            return f"shard {name} is cut short ({path.stat().st_size} of {end} bytes)"
    return None


def shapes(folder: Path, part: str) -> dict[str, torch.Tensor]:
    """`part`'s tensors as empty meta tensors of their saved shapes and dtypes (what a config's
    model is checked against before anything loads; no shard is read)."""
    md = read_metadata(folder)
    prefix = f"{part}."
    return {
        key[len(prefix) :]: torch.empty(tuple(entry.size), dtype=entry.properties.dtype, device="meta")
        for key, entry in md.state_dict_metadata.items()
        if key.startswith(prefix) and isinstance(entry, dcp_metadata.TensorStorageMetadata)
    }


def _no_dist() -> bool:
    return not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def _quiet(no_dist: bool) -> Iterator[None]:
    """DCP warns on every call in one process that it assumes one process: so it does."""
    with warnings.catch_warnings():
        if no_dist:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save(state: Mapping[str, Any], folder: Path) -> None:
    """Every rank's shards of `state` into `folder` (a collective where a process group is up: each
    rank writes its own file, rank 0 the index, last). Files are fsynced; the caller makes the
    folder valid (`services/runs/checkpoints.py`)."""
    _tensors_only(state, "")
    writer = FileSystemWriter(str(folder), sync_files=True, overwrite=False)
    alone = _no_dist()
    with _quiet(alone), _unwrapped(RuntimeError):
        dcp.save(cast(dict[str, Any], dict(state)), storage_writer=writer, no_dist=alone)


@contextlib.contextmanager
def _unwrapped(kind: type[Exception]) -> Iterator[None]:
    """DCP's CheckpointException (a BaseException holding each failed rank's exception and
    traceback) as one line: relay's own refusal as it was raised, anything else as `kind`."""
    try:
        yield
    except CheckpointException as err:
        for exc, _ in (err.failures[r] for r in sorted(err.failures)):
            if isinstance(exc, ShardError):
                raise exc from None
        rank, (exc, _) = min(err.failures.items())
        line = next((ln for ln in str(exc).splitlines() if ln.strip()), "")[:200]
        raise kind(f"rank {rank}: {type(exc).__name__}: {line}") from None


def _tensors_only(tree: Mapping[str, Any], where: str) -> None:
    for key, value in tree.items():
        if isinstance(value, Mapping):
            _tensors_only(value, f"{where}{key}.")
        elif not isinstance(value, torch.Tensor):
            raise TypeError(f"{where}{key} is a {type(value).__name__}: shards hold tensors only")


def load(state: dict[str, Any], folder: Path) -> None:
    """Fill `state`'s tensors in place from the shards in `folder`, resharded to their layout (plain
    tensors take the whole; DTensors their shard). A collective where a process group is up."""
    alone = _no_dist()
    with _quiet(alone), _unwrapped(ShardError):
        dcp.load(
            state,
            storage_reader=SafeReader(str(folder)),
            planner=TensorsOnlyPlanner(),
            no_dist=alone,
        )


class SafeReader(FileSystemReader):
    """DCP's file reader with the index read as data and each tensor slice zip-checked first."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        if kwargs.get("rank") is not None:
            raise ShardError("per-rank indexes are not part of relay's checkpoints")
        md = read_metadata(Path(self.path))
        if md.storage_meta is None:
            md.storage_meta = dcp_metadata.StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md

    def _slice_file(self, file: Any, sinfo: _StorageInfo) -> IO[bytes]:
        window = cast(IO[bytes], _Window(file, int(sinfo.offset), int(sinfo.length)))
        trouble = zip_entries_problem(window, int(sinfo.length))
        if trouble:
            raise ShardError(f"shard {sinfo.relative_path}: {trouble}")
        return super()._slice_file(file, sinfo)


class _Window(io.RawIOBase):
    """Bytes [offset, offset + length) of a seekable file as a file of their own (zipfile seeks
    from the end, which DCP's own view turns the wrong way)."""

    def __init__(self, base: Any, offset: int, length: int) -> None:
        super().__init__()
        self.base, self.offset, self.length, self.pos = base, offset, length, 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        start = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = max(0, start + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b: Any) -> int:
        want = max(0, min(len(b), self.length - self.pos))
        self.base.seek(self.offset + self.pos)
        data = self.base.read(want)
        b[: len(data)] = data
        self.pos += len(data)
        return len(data)


class TensorsOnlyPlanner(DefaultLoadPlanner):
    """DCP's load planner, refusing the non-tensor entries its default would unpickle."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        raise ShardError(
            f"{read_item.dest_index.fqn[:80]} is not a tensor (relay's shards hold tensors only)"
        )
