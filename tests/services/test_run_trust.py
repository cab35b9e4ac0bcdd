"""A run directory belongs to one process, is never written through a link, and is resumed only
from a checkpoint whose every field checks out: a second `train`/`resume` on a live run is refused
naming its holder (a dead holder blocks nothing); links and FIFOs in a run are refused before
anything is written; a malformed newest checkpoint is skipped for the previous one before any
file is truncated."""

import json
import math
import os
import shutil
import signal
import socket
from pathlib import Path

import pytest
import torch

from relay_rl.contracts.checkpoint import Checkpoint, CheckpointError
from relay_rl.services.cli import main
from relay_rl.services.runs.checkpoints import list_checkpoints
from relay_rl.services.runs.run_dir import RunDir, RunDirError
from tests.helpers import train_local
from tests.helpers_proc import metrics_lines, start_train, wait_for

SHORT = ("learner.buffer_size=512", "stop.env_steps=2400", "checkpoint.interval=2", "checkpoint.keep=5")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "run"
    assert train_local("cartpole_ppo.yaml", run, *SHORT) == 0
    assert len(list_checkpoints(run / "checkpoints")) >= 2
    return run


def _copy(finished: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(finished, run, symlinks=True)
    return run


def _resume(run: Path, *sets: str) -> int:
    args = ["resume", str(run), "--set", "rollout.num_workers=0", "--set", "metrics.progress=none"]
    for kv in sets:
        args += ["--set", kv]
    return main(args)


def _one_line(capsys, words: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err
    return err


# ---- one process per run -----------------------------------------------------------------------
def test_a_second_holder_is_refused_naming_the_first_and_released_locks_free_the_run(tmp_path):
    run = RunDir(tmp_path)
    run.lock()
    other = RunDir(tmp_path)
    with pytest.raises(RunDirError, match=rf"in use by pid {os.getpid()} on {socket.gethostname()}"):
        other.lock()
    run.unlock()
    other.lock()  # free again
    other.unlock()
    assert list(tmp_path.iterdir()) == []  # taking and releasing the lock leaves nothing behind


def test_resume_while_train_runs_is_refused_and_a_killed_train_blocks_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    proc = start_train(run, "rollout.num_workers=0", "learner.buffer_size=512", "checkpoint.interval=2")
    try:
        wait_for(lambda: len(metrics_lines(run)) >= 4, 120, "four iterations")
        before = (run / "metrics.jsonl").read_bytes()
        assert _resume(run) == 2
        _one_line(capsys, f"in use by pid {proc.pid} on {socket.gethostname()}")
        assert (run / "metrics.jsonl").read_bytes()[: len(before)] == before  # untouched, still growing
        assert (run / "config.yaml").exists()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    # The kernel dropped the dead process's lock: the run resumes.
    assert _resume(run, "stop.env_steps=4000") == 0


# ---- no links, no FIFOs --------------------------------------------------------------------------
def test_an_error_log_linked_elsewhere_is_refused_and_its_target_untouched(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (run / "error.log").symlink_to(victim)
    assert _resume(run) == 2
    _one_line(capsys, "error.log is a symbolic link")
    assert victim.read_text() == "precious\n"


def test_a_checkpoints_folder_linked_elsewhere_is_neither_written_nor_pruned(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(run / "checkpoints", elsewhere)
    (elsewhere / "unrelated.txt").write_text("x")
    (run / "checkpoints").symlink_to(elsewhere)
    before = sorted(p.name for p in elsewhere.iterdir())
    assert _resume(run, "stop.env_steps=9000", "checkpoint.keep=1") == 2
    _one_line(capsys, "checkpoints is a symbolic link")
    assert sorted(p.name for p in elsewhere.iterdir()) == before


def test_a_linked_checkpoint_file_is_refused(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path)
    newest = list_checkpoints(run / "checkpoints")[-1]
    outside = tmp_path / "outside.pt"
    shutil.move(newest, outside)
    newest.symlink_to(outside)
    assert _resume(run) == 2
    _one_line(capsys, "is a symbolic link")


def test_a_fifo_for_metrics_is_refused_at_once_instead_of_hanging_resume(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path)
    (run / "metrics.jsonl").unlink()
    os.mkfifo(run / "metrics.jsonl")
    assert _resume(run) == 2
    _one_line(capsys, "metrics.jsonl is not a regular file")


def test_error_log_is_replaced_never_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "error.log").symlink_to(victim)
    RunDir(tmp_path).write_error_log("Traceback ...\n")
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "error.log").is_symlink()


# ---- every checkpoint field checked --------------------------------------------------------------
def _raw(finished: Path) -> dict:
    return torch.load(list_checkpoints(finished / "checkpoints")[-1], weights_only=True)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("iteration", True, "iteration=True is not a count"),
        ("iteration", 20.5, "iteration=20.5 is not a count"),
        ("env_steps", -3, "env_steps=-3 is not a count"),
        ("episodes", "7", "episodes='7' is not a count"),
        ("wall_s", math.nan, "wall_s=nan is not a time"),
        ("returns", [1.0, math.nan], "returns are not a list of finite numbers"),
        ("returns", [True], "returns are not a list of finite numbers"),
        ("lengths", [3, -1], "lengths are not a list of counts"),
        ("env_faults", {"raised": 1.5}, "env_faults is not a mapping"),
    ],
)
def test_malformed_counters_are_refused(finished, field, value, words):
    raw = _raw(finished)
    raw["counters"][field] = value
    with pytest.raises(CheckpointError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Checkpoint.from_dict(raw)


@pytest.mark.parametrize(
    "spoil",
    [
        lambda raw: raw["counters"].update(iteration=True),
        lambda raw: raw["counters"].update(iteration=20.5),
        lambda raw: raw["counters"].update(returns=[math.nan]),
        lambda raw: raw["learner"]["optimizer"]["state"][0].update(exp_avg=torch.zeros(3)),
        lambda raw: raw["learner"]["optimizer"].update(param_groups=[]),
        lambda raw: raw["learner"].update(optimizer={"state": "x"}),
        lambda raw: raw["learner"].update(version=-1),
        lambda raw: raw["learner"].update(generator=torch.zeros(3)),
        lambda raw: next(iter(raw["learner"]["model"].values())).fill_(math.inf),
    ],
    ids=[
        "bool-iteration",
        "float-iteration",
        "nan-return",
        "moment-shape",
        "no-groups",
        "no-state",
        "negative-version",
        "generator",
        "inf-weight",
    ],
)
def test_resume_skips_a_malformed_newest_checkpoint_for_the_previous_before_truncating(
    finished, tmp_path, capsys, spoil
):
    run = _copy(finished, tmp_path)
    ckpts = list_checkpoints(run / "checkpoints")
    raw = torch.load(ckpts[-1], weights_only=True)
    spoil(raw)
    torch.save(raw, ckpts[-1])
    previous = Checkpoint.from_dict(torch.load(ckpts[-2], weights_only=True)).counters.iteration
    assert _resume(run, "stop.env_steps=3000") == 0
    err = capsys.readouterr().err
    assert f"resuming from {ckpts[-2].name} (iteration {previous}" in err
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    # The metrics were cut to the checkpoint resumed from (never to a bogus iteration 1), and go on.
    assert [x["iteration"] for x in lines] == list(range(1, len(lines) + 1))
    assert len(lines) > previous
