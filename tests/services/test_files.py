"""Nothing already written is lost by an output path: `relay export --out` refuses its own input
(by name, link or hard link), links, FIFOs, devices and existing files without --force, and
writes beside the target first; readers never hang on a FIFO."""

import os
import stat
import threading
from pathlib import Path

import pytest
import torch

from relay_rl.services.cli import main
from relay_rl.services.runs.files import OutputError, check_output, read_regular, write_new
from tests.helpers import train_local


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    assert train_local("cartpole_ppo.yaml", run, "learner.buffer_size=512", "stop.env_steps=600") == 0
    return sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1]


def _copy(ckpt: Path, folder: Path) -> Path:
    out = folder / "ck.pt"
    out.write_bytes(ckpt.read_bytes())
    return out


def _refused(capsys, argv: list[str], words: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err


def test_export_never_writes_over_its_input(ckpt, tmp_path, capsys):
    ck = _copy(ckpt, tmp_path)
    before = ck.read_bytes()
    os.link(ck, tmp_path / "hard.pt")
    (tmp_path / "soft.pt").symlink_to(ck)
    for out in (ck, tmp_path / "hard.pt", tmp_path / "soft.pt", tmp_path / "." / "ck.pt"):
        _refused(capsys, ["export", str(ck), "--out", str(out), "--force"], "is the input file itself")
    assert ck.read_bytes() == before


def test_export_refuses_links_fifos_and_devices(ckpt, tmp_path, capsys):
    ck = _copy(ckpt, tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "link.onnx").symlink_to(victim)
    _refused(capsys, ["export", str(ck), "--out", str(tmp_path / "link.onnx"), "--force"], "symbolic link")
    assert victim.read_text() == "keep me"
    os.mkfifo(tmp_path / "fifo")
    _refused(capsys, ["export", str(ck), "--out", str(tmp_path / "fifo")], "not a regular file")
    assert stat.S_ISFIFO((tmp_path / "fifo").lstat().st_mode)
    # As root, `--out /dev/null` would have replaced the real device; a copy of it stands in.
    os.mknod(tmp_path / "fakenull", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    _refused(
        capsys, ["export", str(ck), "--out", str(tmp_path / "fakenull"), "--force"], "not a regular file"
    )
    assert stat.S_ISCHR((tmp_path / "fakenull").lstat().st_mode)


def test_an_existing_file_needs_force_and_force_replaces_it_whole(ckpt, tmp_path, capsys):
    ck = _copy(ckpt, tmp_path)
    out = tmp_path / "p.onnx"
    out.write_bytes(b"an older export")
    _refused(capsys, ["export", str(ck), "--out", str(out)], "exists; add --force")
    assert out.read_bytes() == b"an older export"
    assert main(["export", str(ck), "--out", str(out), "--force"]) == 0
    assert out.read_bytes()[:2] != b"an" and not list(tmp_path.glob("*.tmp"))
    assert main(["export", str(ck)]) == 0  # the default, ck.onnx, is new
    _refused(capsys, ["export", str(ck)], "ck.onnx exists; add --force")


def test_write_new_keeps_a_file_that_appeared_meanwhile(tmp_path):
    out = tmp_path / "x"
    out.write_bytes(b"someone else's")
    with pytest.raises(OutputError, match="appeared"):
        write_new(out, b"ours", replace=False)
    assert out.read_bytes() == b"someone else's" and not list(tmp_path.glob("*.tmp"))
    with pytest.raises(OutputError, match="exists"):
        check_output(out, [], force=False)


def test_a_nan_policy_fails_its_own_check_and_nothing_is_written(ckpt, tmp_path, capsys):
    state = torch.load(ckpt, weights_only=True)
    first = next(k for k in state["learner"]["model"] if k.endswith("weight"))
    state["learner"]["model"][first][:] = float("nan")
    bad = tmp_path / "nan.pt"
    torch.save(state, bad)
    assert main(["export", str(bad), "--out", str(tmp_path / "nan.onnx")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not finite" in err and "nothing written" in err
    assert not (tmp_path / "nan.onnx").exists()


def test_reading_a_fifo_fails_at_once_instead_of_hanging(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    result: list[BaseException] = []

    def read() -> None:
        try:
            read_regular(tmp_path / "fifo", 1 << 20)
        except OSError as err:
            result.append(err)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive() and result and "not a regular file" in str(result[0])
