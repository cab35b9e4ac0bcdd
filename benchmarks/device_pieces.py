"""Packages too large for one call to a device machine, cut into pieces that travel one call at a
time and are put back together there (a warm machine keeps the ignored folders an earlier call
carried).

    python benchmarks/device_pieces.py pack SITE --out .whl-fleet [--piece-mib 56] [--python 3.12]
    python benchmarks/device_pieces.py unpack .whl-fleet --target /tmp/relay-site-fleet

`pack` writes SITE (an installed tree, as `pip install --target` leaves it) as one xz tarball cut
into pieces of at most --piece-mib MiB: piece i alone in the folder OUT-i/, each folder with the
same manifest (the count, the size and sha256 of every piece and of the whole, and the Python the
tree's compiled modules are for). `unpack` finds the OUT-*/ folders, refuses a tree made for
another Python, checks every piece against the manifest before reading any of it, and extracts the
tarball with tarfile's `data` filter (no absolute paths, no links out of the target, no device
files) into a fresh folder that then takes the target's place. A target already holding this
manifest's tree is kept as it is (a second call to a warm machine unpacks nothing).

Exit 2 with one line on bad arguments; exit 3 with one line naming what is missing or wrong when
pieces are absent or differ from the manifest, and nothing is written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import re
import shutil
import signal
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

MANIFEST = "pieces.json"
STAMP = ".relay-pieces.json"  # in an unpacked target: the manifest it came from
CHUNK = 1 << 20


class PiecesError(Exception):
    """Pieces that cannot be put back together: one line saying what is missing or wrong."""


class _PieceWriter:
    """A write-only stream that cuts what it is given into files of at most `limit` bytes,
    piece i as `<prefix>-i/<name>.part<i>`, hashing each piece and the whole as it goes."""

    def __init__(self, staging: Path, name: str, limit: int) -> None:
        self.staging, self.name, self.limit = staging, name, limit
        self.whole = hashlib.sha256()
        self.pieces: list[dict[str, Any]] = []
        self._file: IO[bytes] | None = None
        self._hash = hashlib.sha256()
        self._size = 0

    def _open_next(self) -> None:
        self._close_current()
        index = len(self.pieces) + 1
        folder = self.staging / str(index)
        folder.mkdir()
        self._file = open(folder / f"{self.name}.part{index}", "xb")  # noqa: SIM115 (open across writes)
        self._hash, self._size = hashlib.sha256(), 0
        self.pieces.append({"file": f"{self.name}.part{index}"})

    def _close_current(self) -> None:
        if self._file is not None:
            self._file.close()
            self.pieces[-1].update(bytes=self._size, sha256=self._hash.hexdigest())
            self._file = None

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            if self._file is None or self._size == self.limit:
                self._open_next()
            assert self._file is not None
            take = view[: self.limit - self._size]
            self._file.write(take)
            self._hash.update(take)
            self.whole.update(take)
            self._size += len(take)
            view = view[len(take) :]
        return len(data)

    def close(self) -> None:
        self._close_current()


def pack(site: Path, out: Path, piece_mib: float, python: str | None = None) -> dict[str, Any]:
    """SITE as an xz tarball in pieces, OUT-1/ ... OUT-K/ (each with the manifest; `python`, as
    "3.12", the interpreter SITE was installed for, None for none in particular). Refuses when
    any OUT-i/ exists: a new pack replaces every piece, so the old ones go first, by hand."""
    if not site.is_dir():
        raise ValueError(f"{site} is not a folder")
    if piece_mib <= 0:
        raise ValueError(f"--piece-mib {piece_mib} must be above 0")
    taken = _numbered(out)
    if taken:
        raise ValueError(f"{taken[0]} exists: remove {out}-*/ first (a new pack replaces every piece)")
    name = f"{out.name.lstrip('.')}.tar.xz"
    out.parent.mkdir(parents=True, exist_ok=True)
    # Named like the pieces' folders, so the ignore rule that hides them hides a staging folder
    # a kill left behind too.
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f"{out.name}-staging-") as tmp:
        writer = _PieceWriter(Path(tmp), name, int(piece_mib * 2**20))
        with lzma.open(writer, "wb", preset=6) as xz, tarfile.open(fileobj=xz, mode="w|") as tar:  # type: ignore[arg-type]
            for path in sorted(site.iterdir()):
                tar.add(path, arcname=path.name)
        writer.close()
        manifest = {
            "name": name,
            "python": python,
            "count": len(writer.pieces),
            "bytes": sum(p["bytes"] for p in writer.pieces),
            "sha256": writer.whole.hexdigest(),
            "pieces": writer.pieces,
        }
        for index in range(1, manifest["count"] + 1):
            folder = Path(tmp) / str(index)
            (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
            folder.rename(out.parent / f"{out.name}-{index}")
    return manifest


def _numbered(out: Path) -> list[Path]:
    """The folders OUT-1/, OUT-2/, ... that exist (a staging folder is not one)."""
    pattern = re.compile(re.escape(out.name) + r"-[0-9]+")
    return sorted(
        (p for p in out.parent.glob(f"{out.name}-*") if pattern.fullmatch(p.name)),
        key=lambda p: int(p.name.rsplit("-", 1)[1]),
    )


def _manifest(folders: list[Path]) -> dict[str, Any]:
    """The one manifest every folder holds (read as JSON data), or PiecesError."""
    seen: dict[str, Any] | None = None
    for folder in folders:
        path = folder / MANIFEST
        if not path.is_file():
            raise PiecesError(f"{folder} holds no {MANIFEST}")
        try:
            manifest = json.loads(path.read_text())
            count, pieces = int(manifest["count"]), manifest["pieces"]
            if count != len(pieces) or not all(isinstance(p, dict) for p in pieces):
                raise ValueError("count and pieces differ")
        except (ValueError, KeyError, TypeError) as err:
            raise PiecesError(f"{path} is not a pieces manifest ({err})") from None
        if seen is not None and manifest != seen:
            raise PiecesError(f"{path} differs from the other folders' manifest: pieces of two packs")
        seen = manifest
    assert seen is not None
    return seen


def _piece_paths(out: Path) -> tuple[dict[str, Any], list[Path]]:
    """The manifest and every piece's path, each checked for its size and sha256."""
    folders = [p for p in _numbered(out) if p.is_dir() and not p.is_symlink()]
    if not folders:
        raise PiecesError(f"no {out}-*/ folders here: make them (benchmarks/device_wheels.sh 3.12 fleet)")
    manifest = _manifest(folders)
    paths, missing = [], []
    for index, piece in enumerate(manifest["pieces"], start=1):
        path = out.parent / f"{out.name}-{index}" / str(piece["file"])
        if not path.is_file() or path.is_symlink():
            missing.append(f"{out.name}-{index}")
            continue
        paths.append(path)
    if missing:
        raise PiecesError(
            f"{len(missing)} of {manifest['count']} pieces missing: {', '.join(missing)} "
            "(carry each, one call at a time, to the same warm machine)"
        )
    for path, piece in zip(paths, manifest["pieces"], strict=True):
        if path.stat().st_size != piece["bytes"] or _sha256(path) != piece["sha256"]:
            raise PiecesError(f"{path} is not the piece its manifest names (size or sha256 differ)")
    return manifest, paths


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


class _Joined:
    """The pieces read one after another as one stream (read-only, forward only)."""

    def __init__(self, paths: list[Path]) -> None:
        self._files: Iterator[Path] = iter(paths)
        self._current: IO[bytes] | None = None

    def read(self, size: int = -1) -> bytes:
        while True:
            if self._current is None:
                path = next(self._files, None)
                if path is None:
                    return b""
                self._current = open(path, "rb")  # noqa: SIM115 (open across reads, closed at its end)
            data = self._current.read(size)
            if data:
                return data
            self._current.close()
            self._current = None


def unpack(out: Path, target: Path) -> tuple[dict[str, Any], bool]:
    """Put the pieces OUT-*/ back together into `target`; returns (manifest, whether it extracted
    anything: False where `target` already holds this manifest's tree)."""
    manifest, paths = _piece_paths(out)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if manifest.get("python") not in (None, here):
        # Its compiled modules would fail to import, or worse, shadow this Python's own.
        raise PiecesError(
            f"{out}-*/ were made for Python {manifest['python']}, this is {here} "
            f"(make them with benchmarks/device_wheels.sh {here} fleet)"
        )
    stamp = target / STAMP
    if stamp.is_file() and not target.is_symlink():
        try:
            if json.loads(stamp.read_text()).get("sha256") == manifest["sha256"]:
                return manifest, False
        except ValueError:
            pass
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise PiecesError(f"{target} is a link or a file: name a folder of its own")
    if target.exists() and not stamp.is_file():
        # Only a tree an earlier unpack made is ever replaced.
        raise PiecesError(f"{target} exists and is no unpacked pieces tree: name another --target")
    target.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-unpacking-"))
    fresh.chmod(0o755)  # mkdtemp's 0700 would hide the packages from another user's process
    try:
        try:
            with lzma.open(_Joined(paths), "rb") as xz, tarfile.open(fileobj=xz, mode="r|") as tar:  # type: ignore[arg-type]
                tar.extractall(fresh, filter="data")
        except (tarfile.TarError, lzma.LZMAError, EOFError) as err:
            # tarfile's data filter refuses a member that leaves the target, a link out, a device.
            raise PiecesError(f"the pieces of {out}-*/ are no tarball to unpack ({err})") from None
        stamped = {"sha256": manifest["sha256"], "name": manifest["name"]}
        (fresh / STAMP).write_text(json.dumps(stamped) + "\n")
        if target.exists():
            shutil.rmtree(target)  # an earlier pack's tree (its stamp was checked above)
        fresh.rename(target)
    finally:
        if fresh.exists():
            shutil.rmtree(fresh)
    return manifest, True


def _exit_on(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds: the staging or unpacking folder is removed


def main(argv: list[str] | None = None) -> int:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("pack", help="SITE as pieces in OUT-1/ ... OUT-K/")
    p.add_argument("site", type=Path)
    p.add_argument("--out", type=Path, required=True, help="the pieces' folder prefix, e.g. .whl-fleet")
    p.add_argument("--piece-mib", type=float, default=56.0, help="the most MiB one piece holds")
    p.add_argument("--python", help="the Python SITE was installed for, e.g. 3.12 (unpack refuses others)")
    u = sub.add_parser("unpack", help="OUT-*/ back together into --target")
    u.add_argument("out", type=Path, help="the pieces' folder prefix, e.g. .whl-fleet")
    u.add_argument("--target", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.verb == "pack":
            m = pack(args.site, args.out, args.piece_mib, args.python)
            sizes = ", ".join(f"{p['bytes'] / 2**20:.1f}" for p in m["pieces"])
            print(f"{m['count']} pieces of {args.out}-*/ ({sizes} MiB), sha256 {m['sha256'][:12]}")
        else:
            m, fresh = unpack(args.out, args.target)
            done = "unpacked into" if fresh else "already unpacked in"
            print(f"{m['count']} pieces of {args.out}-*/ checked, {done} {args.target}")
    except ValueError as err:
        print(f"device_pieces: {err}", file=sys.stderr)
        return 2
    except PiecesError as err:
        print(f"device_pieces: {err}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
