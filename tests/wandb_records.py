"""Reading back what W&B wrote in offline mode (for the tracking tests).

wandb >= 0.19 no longer ships a Python reader for its `.wandb` run file; the file is a LevelDB-style
log (after a 7-byte W&B header, 32 KiB blocks of records each with a 7-byte header: CRC, length,
kind; a record may span blocks as FIRST/MIDDLE/LAST pieces) of wandb's own protobuf `Record`s,
which wandb does ship.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEADER, BLOCK, PIECE = 7, 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class WandbRun:
    folder: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None


def records(raw: bytes) -> list[bytes]:
    out, pending, pos = [], b"", HEADER
    while pos + PIECE <= len(raw):
        left = BLOCK - pos % BLOCK
        if left < PIECE:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + PIECE])
        if length == 0 and kind == 0:  # a block's zero padding
            pos += left
            continue
        data, pos = raw[pos + PIECE : pos + PIECE + length], pos + PIECE + length
        if kind == FULL:
            out.append(data)
        elif kind == FIRST:
            pending = data
        elif kind == MIDDLE:
            pending += data
        elif kind == LAST:
            out.append(pending + data)
    return out


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)  # wandb 0.31 writes nested_key


def read_wandb_run(wandb_dir: Path) -> WandbRun:
    """The one offline run under `wandb_dir`: its history rows, config and exit code."""
    from wandb.proto import wandb_internal_pb2 as pb

    (folder,) = [p for p in wandb_dir.glob("offline-run-*") if p.is_dir()]
    (path,) = folder.glob("run-*.wandb")
    run = WandbRun(folder)
    for data in records(path.read_bytes()):
        rec = pb.Record()
        rec.ParseFromString(data)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            run.history.append({_key(i): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "run":
            run.config.update({_key(i): json.loads(i.value_json) for i in rec.run.config.update})
        elif kind == "exit":
            run.exit_code = rec.exit.exit_code
    return run
