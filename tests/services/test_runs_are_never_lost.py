"""No run is ever lost: a directory holding a run is refused, default names never collide, a
refused `relay resume --set` changes nothing, a finished run trains longer on a bigger budget,
and files are replaced atomically with the directory fsynced."""

import json
import os
import shutil
from pathlib import Path

import pytest

from relay_rl.contracts.config import build_config
from relay_rl.services.cli import main
from relay_rl.services.runs import run_dir as run_dir_mod
from relay_rl.services.runs.files import atomic_write
from relay_rl.services.runs.run_dir import RunDir, RunDirError, default_run_name
from tests.helpers import train_local

ROOT = Path(__file__).parents[2]
SHORT = ("learner.buffer_size=512", "stop.env_steps=1000", "checkpoint.interval=2")


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "run"
    assert train_local("cartpole_ppo.yaml", run, *SHORT) == 0
    return run


def test_train_refuses_a_directory_holding_a_run_and_touches_nothing(finished, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    before = _snapshot(run)
    assert train_local("cartpole_ppo.yaml", run, *SHORT) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"relay resume {run}" in err
    assert _snapshot(run) == before


@pytest.mark.parametrize("leftover", ["metrics.jsonl", "checkpoints", "config.yaml"])
def test_any_run_file_marks_a_run(tmp_path, leftover):
    run = tmp_path / "run"
    run.mkdir()
    (run / leftover).mkdir() if leftover == "checkpoints" else (run / leftover).write_text("x\n")
    with pytest.raises(RunDirError, match="already holds a run"):
        RunDir.check_new(run)


def test_an_existing_empty_directory_is_fine(tmp_path):
    run = tmp_path / "empty"
    run.mkdir()
    assert train_local("cartpole_ppo.yaml", run, "learner.buffer_size=512", "stop.env_steps=300") == 0
    assert (run / "config.yaml").is_file() and _lines(run)


def test_default_names_never_collide_and_two_claims_of_one_directory_cannot_both_win(tmp_path):
    cfg = build_config({}, [f"metrics.runs_dir={tmp_path}"])
    names = {default_run_name(cfg) for _ in range(50)}  # all within the same second
    assert len(names) == 50
    RunDir.claim(tmp_path / "x", cfg)
    with pytest.raises(RunDirError, match="already holds a run"):
        RunDir.claim(tmp_path / "x", cfg)


def test_run_dir_on_a_file_or_where_nothing_can_be_created_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for target in (tmp_path / "file", Path("/proc/relay-run"), tmp_path / "file" / "sub"):
        assert train_local("cartpole_ppo.yaml", target, "stop.env_steps=300") == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(target) in err, err
    assert not Path("/proc/relay-run").exists()


def test_a_refused_resume_changes_nothing_and_a_plain_resume_still_works(finished, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    before = _snapshot(run)
    for bad in ("model.hidden_sizes=[32]", "learner.algo=grpo", "env.id=Pendulum-v1"):
        assert main(["resume", str(run), "--set", bad, "--set", "learner.group_size=2"]) == 2, bad
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
    assert _snapshot(run) == before
    assert main(["resume", str(run), "--set", "stop.env_steps=1300", "--set", "metrics.progress=none"]) == 0


def test_resume_with_a_bigger_budget_trains_longer_without_gaps_or_repeats(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    first = _lines(run)
    assert first[-1]["env_steps"] >= 1000
    assert main(["resume", str(run), "--set", "stop.env_steps=2500", "--set", "metrics.progress=none"]) == 0
    lines = _lines(run)
    assert [x["iteration"] for x in lines] == list(range(1, len(lines) + 1))
    assert len(lines) > len(first) and lines[-1]["env_steps"] >= 2500
    assert [x["env_steps"] for x in lines] == sorted({x["env_steps"] for x in lines})
    assert "env_steps: 2500" in (run / "config.yaml").read_text()  # the merged config, once it ran


def test_resume_cleans_stale_temporary_files(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "checkpoints" / "ckpt-00000099.pt.tmp").write_bytes(b"half a checkpoint")
    (run / "metrics.jsonl.tmp").write_text("{")
    assert main(["resume", str(run), "--set", "stop.env_steps=1200", "--set", "metrics.progress=none"]) == 0
    assert not list(run.rglob("*.tmp"))


def test_atomic_write_fsyncs_the_file_and_then_its_directory(tmp_path, monkeypatch):
    synced: list[str] = []
    real = os.fsync

    def spy(fd):
        synced.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        real(fd)

    monkeypatch.setattr(run_dir_mod.os, "fsync", spy)
    target = tmp_path / "config.yaml"
    target.write_text("old")
    atomic_write(target, b"new")
    assert target.read_text() == "new" and synced == ["file", "dir"]
    assert not list(tmp_path.glob("*.tmp"))
