"""benchmarks/device_pieces.py: a package tree too large for one call to a device machine, cut
into pieces that each fit one call and put back together there. Round trips byte for byte (modes
and links inside the tree included), and every way the pieces can be wrong (one missing, one
changed, two packs mixed, a member that leaves the target) is one line, with nothing written."""

import io
import json
import lzma
import os
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import benchmark_module

pieces = benchmark_module("device_pieces")


def _site(root):
    """A small installed tree: a package, an executable, a link inside it, random bytes that xz
    cannot shrink (so a small piece size gives several pieces)."""
    pkg = root / "site" / "pkg"
    (pkg / "bin").mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 7\n")
    (pkg / "blob.bin").write_bytes(os.urandom(300_000))
    tool = pkg / "bin" / "raylet"
    tool.write_bytes(b"#!/bin/sh\necho up\n")
    tool.chmod(0o755)
    (pkg / "alias.py").symlink_to("__init__.py")
    return root / "site"


def _tree(root):
    return {
        p.relative_to(root).as_posix(): (p.is_symlink(), os.readlink(p) if p.is_symlink() else p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file() or p.is_symlink()
        if p.name != pieces.STAMP
    }


def test_a_tree_round_trips_through_its_pieces(tmp_path):
    site = _site(tmp_path)
    out = tmp_path / "carry" / ".whl-fleet"
    manifest = pieces.pack(site, out, piece_mib=0.1)
    assert manifest["count"] == 3  # 300 kB of noise in pieces of 104,857 bytes
    for index, piece in enumerate(manifest["pieces"], start=1):
        folder = tmp_path / "carry" / f".whl-fleet-{index}"
        assert sorted(p.name for p in folder.iterdir()) == sorted([pieces.MANIFEST, piece["file"]])
        assert json.loads((folder / pieces.MANIFEST).read_text()) == manifest
        assert piece["bytes"] <= 0.1 * 2**20
    assert [p["bytes"] for p in manifest["pieces"][:-1]] == [int(0.1 * 2**20)] * 2
    assert not list((tmp_path / "carry").glob(".*staging*"))  # the staging folder is gone

    target = tmp_path / "device" / "site"
    assert pieces.unpack(out, target) == (manifest, True)
    assert _tree(target) == _tree(site)
    assert os.access(target / "pkg" / "bin" / "raylet", os.X_OK)
    assert (target / "pkg" / "alias.py").is_symlink()
    assert oct(target.stat().st_mode & 0o777) == "0o755"
    # A second call to the warm machine finds the tree there and leaves it.
    (target / "pkg" / "marker").write_text("kept")
    assert pieces.unpack(out, target) == (manifest, False)
    assert (target / "pkg" / "marker").read_text() == "kept"


def test_a_missing_piece_is_named_and_nothing_is_unpacked(tmp_path):
    out = tmp_path / ".whl-fleet"
    pieces.pack(_site(tmp_path), out, piece_mib=0.1)
    (tmp_path / ".whl-fleet-2").rename(tmp_path / "elsewhere")
    target = tmp_path / "target"
    with pytest.raises(pieces.PiecesError, match=r"1 of 3 pieces missing: \.whl-fleet-2 \(carry each"):
        pieces.unpack(out, target)
    assert not target.exists() and not list(tmp_path.glob(".target-unpacking-*"))


def test_a_changed_piece_is_refused_before_anything_is_read(tmp_path):
    out = tmp_path / ".whl-fleet"
    manifest = pieces.pack(_site(tmp_path), out, piece_mib=0.1)
    part = tmp_path / ".whl-fleet-3" / manifest["pieces"][2]["file"]
    data = bytearray(part.read_bytes())
    data[10] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(pieces.PiecesError, match=r"\.part3 is not the piece its manifest names"):
        pieces.unpack(out, tmp_path / "target")
    assert not (tmp_path / "target").exists()


def test_pieces_of_two_packs_are_refused(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    pieces.pack(_site(first), first / ".whl-fleet", piece_mib=0.1)
    pieces.pack(_site(second), second / ".whl-fleet", piece_mib=0.1)
    (first / ".whl-fleet-2").rename(first / "old-2")
    (second / ".whl-fleet-2").rename(first / ".whl-fleet-2")
    with pytest.raises(pieces.PiecesError, match="differs from the other folders' manifest: pieces of two"):
        pieces.unpack(first / ".whl-fleet", tmp_path / "target")


def test_a_member_that_leaves_the_target_is_refused(tmp_path):
    """Pieces are data: a tarball naming ../ is refused by tarfile's data filter, nothing lands
    outside the target and the target is not made."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("../escaped.py")
        body = b"print('ran')\n"
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    blob = lzma.compress(raw.getvalue())
    folder = tmp_path / "carry" / ".whl-fleet-1"
    folder.mkdir(parents=True)
    (folder / "fleet.tar.xz.part1").write_bytes(blob)
    import hashlib

    digest = hashlib.sha256(blob).hexdigest()
    manifest = {
        "name": "fleet.tar.xz",
        "count": 1,
        "bytes": len(blob),
        "sha256": digest,
        "pieces": [{"file": "fleet.tar.xz.part1", "bytes": len(blob), "sha256": digest}],
    }
    (folder / pieces.MANIFEST).write_text(json.dumps(manifest))
    target = tmp_path / "device" / "site"
    with pytest.raises(pieces.PiecesError, match="are no tarball to unpack"):
        pieces.unpack(tmp_path / "carry" / ".whl-fleet", target)
    assert not target.exists() and not (tmp_path / "device" / "escaped.py").exists()
    assert [p.name for p in (tmp_path / "device").iterdir()] == []


def test_a_pack_never_replaces_pieces_and_an_unpack_never_replaces_a_folder_of_yours(tmp_path):
    out = tmp_path / ".whl-fleet"
    first = pieces.pack(_site(tmp_path), out, piece_mib=0.1)
    before = (tmp_path / ".whl-fleet-1" / first["pieces"][0]["file"]).read_bytes()
    with pytest.raises(ValueError, match=r"\.whl-fleet-1 exists: remove .*\.whl-fleet-\*/ first"):
        pieces.pack(_site(tmp_path / "other"), out, piece_mib=0.1)
    assert (tmp_path / ".whl-fleet-1" / first["pieces"][0]["file"]).read_bytes() == before
    yours = tmp_path / "yours"
    yours.mkdir()
    (yours / "notes.txt").write_text("mine")
    with pytest.raises(pieces.PiecesError, match="exists and is no unpacked pieces tree"):
        pieces.unpack(out, yours)
    assert [p.name for p in yours.iterdir()] == ["notes.txt"]


def test_the_command_line_says_one_line_and_exits_2_or_3(tmp_path, capsys):
    assert pieces.main(["pack", str(tmp_path / "absent"), "--out", str(tmp_path / ".w")]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [f"device_pieces: {tmp_path / 'absent'} is not a folder"]
    assert pieces.main(["unpack", str(tmp_path / ".w"), "--target", str(tmp_path / "t")]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"device_pieces: no {tmp_path / '.w'}-*/ folders here")
    assert not (tmp_path / "t").exists()


@settings(max_examples=60, deadline=None)
@given(
    chunks=st.lists(st.binary(min_size=0, max_size=300), max_size=20),
    limit=st.integers(min_value=1, max_value=700),
)
def test_the_piece_writer_cuts_at_the_limit_and_loses_nothing(tmp_path_factory, chunks, limit):
    staging = tmp_path_factory.mktemp("staging")
    writer = pieces._PieceWriter(staging, "x.tar.xz", limit)
    for chunk in chunks:
        assert writer.write(chunk) == len(chunk)
    writer.close()
    data = b"".join(chunks)
    parts = [(staging / str(i) / p["file"]).read_bytes() for i, p in enumerate(writer.pieces, start=1)]
    assert b"".join(parts) == data
    assert len(parts) == -(-len(data) // limit)  # ceil: no empty piece, none over the limit
    assert all(len(p) == limit for p in parts[:-1]) and all(0 < len(p) <= limit for p in parts)
    assert [p["bytes"] for p in writer.pieces] == [len(p) for p in parts]


def test_a_staging_folder_a_kill_left_is_no_piece(tmp_path):
    out = tmp_path / ".whl-fleet"
    manifest = pieces.pack(_site(tmp_path), out, piece_mib=0.1)
    (tmp_path / ".whl-fleet-staging-x1y2").mkdir()  # what a SIGKILL mid-pack leaves
    assert pieces.unpack(out, tmp_path / "target") == (manifest, True)


def test_a_pack_stopped_by_sigterm_leaves_no_folder(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    site = tmp_path / "site"
    site.mkdir()
    (site / "noise.bin").write_bytes(os.urandom(40 * 2**20))  # seconds of xz
    script = str(pieces.__file__)
    proc = subprocess.Popen(
        [sys.executable, script, "pack", str(site), "--out", str(tmp_path / "carry" / ".w"), "--piece-mib=4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    carry = tmp_path / "carry"
    deadline = time.monotonic() + 60
    while not (carry.exists() and any(carry.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.05)  # the staging folder is there: the pack is under way
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert list(carry.iterdir()) == []


def test_a_tree_made_for_another_python_is_refused(tmp_path):
    """Its compiled modules would shadow this interpreter's own (optree's cp312 build broke
    torch's import under 3.11, found when the pieces sat in a checkout running the tests)."""
    import sys

    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    out = tmp_path / ".whl-fleet"
    pieces.pack(_site(tmp_path), out, piece_mib=0.1, python="2.7")
    with pytest.raises(pieces.PiecesError, match=rf"made for Python 2\.7, this is {here} \(make them with"):
        pieces.unpack(out, tmp_path / "target")
    assert not (tmp_path / "target").exists()
    ours = tmp_path / "ours"
    manifest = pieces.pack(_site(ours), ours / ".whl-fleet", piece_mib=0.1, python=here)
    assert manifest["python"] == here
    assert pieces.unpack(ours / ".whl-fleet", tmp_path / "target")[1] is True
