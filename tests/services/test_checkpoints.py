"""Checkpoints and resume: atomic writes, corrupt newest skipped, safe loading, counters continue."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from relay_rl.contracts.checkpoint import Checkpoint, RunCounters
from relay_rl.contracts.config import load_config
from relay_rl.services.cli import main
from relay_rl.services.driver.backends import LocalBackend
from relay_rl.services.driver.loop import TrainingLoop
from relay_rl.services.runs.checkpoints import list_checkpoints, load_newest_valid, save_checkpoint
from relay_rl.services.runs.run_dir import RunDir
from relay_rl.services.runs.sinks import MetricsWriter
from tests.helpers_proc import start_train

ROOT = Path(__file__).parents[2]
LOCAL = [
    "--set",
    "rollout.num_workers=0",
    "--set",
    "learner.buffer_size=512",
    "--set",
    "metrics.progress=none",
]


def _state(i: int, size: int = 3) -> dict:
    """A well-formed checkpoint of iteration i (weights are placeholders)."""
    learner = {"model": {"w": torch.ones(size) * i}}
    return Checkpoint(learner, RunCounters(iteration=i), {}, None).to_dict()


def test_keep_prunes_oldest_and_no_temp_files_remain(tmp_path):
    for i in range(1, 6):
        save_checkpoint(tmp_path, i, _state(i), keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-00000004.pt", "ckpt-00000005.pt"]
    assert not list(tmp_path.glob("*.tmp"))


def test_truncated_newest_checkpoint_is_reported_and_the_previous_used(tmp_path, caplog):
    save_checkpoint(tmp_path, 1, _state(1), keep=3)
    newest = save_checkpoint(tmp_path, 2, _state(2, 1000), keep=3)
    newest.write_bytes(newest.read_bytes()[:100])
    path, state = load_newest_valid(tmp_path)
    assert path.name == "ckpt-00000001.pt" and state.counters.iteration == 1
    assert "ckpt-00000002.pt is unusable" in caplog.text


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_a_checkpoint_never_executes_code(tmp_path):
    save_checkpoint(tmp_path, 1, _state(1), keep=3)
    torch.save({"payload": Evil()}, tmp_path / "ckpt-00000002.pt")
    path, _ = load_newest_valid(tmp_path)  # weights_only=True refuses the pickled callable
    assert path.name == "ckpt-00000001.pt"


def test_a_link_planted_at_the_temporary_name_is_never_followed(tmp_path):
    """A symlink left at ckpt-<n>.pt.tmp (a planted one, or a stale one pointing elsewhere) is
    removed, not written through: the file it points to is untouched."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / "ckpt-00000001.pt.tmp").symlink_to(victim)
    path = save_checkpoint(folder, 1, _state(1), keep=3)
    assert victim.read_text() == "keep me"
    assert path.is_file() and not path.is_symlink() and not (folder / "ckpt-00000001.pt.tmp").exists()
    assert load_newest_valid(folder)[0] == path


def test_metrics_writer_cuts_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"iteration": 1}\n{"iteration": 2, "env_st')
    w = MetricsWriter(path)
    w.write({"iteration": 2})
    w.close()
    assert [json.loads(x)["iteration"] for x in path.read_text().splitlines()] == [1, 2]


def _lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_resume_continues_counters_and_metrics(tmp_path):
    run = tmp_path / "run"
    args = [
        "train",
        "configs/cartpole_ppo.yaml",
        "--run-dir",
        str(run),
        *LOCAL,
        "--set",
        "checkpoint.interval=3",
    ]
    assert main([*args, "--set", "stop.env_steps=4000", "--set", "stop.episode_return_mean=null"]) == 0
    first = _lines(run)
    # Simulate lines written after the newest checkpoint by a run that then crashed.
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({**first[-1], "iteration": first[-1]["iteration"] + 1}) + "\n")
    assert main(["resume", str(run), "--set", "stop.env_steps=8000"]) == 0
    lines = _lines(run)
    assert [x["iteration"] for x in lines] == list(range(1, len(lines) + 1))
    assert lines[len(first)]["env_steps"] > first[-1]["env_steps"]
    assert lines[-1]["env_steps"] >= 8000
    assert lines[-1]["weights_version"] == lines[-1]["iteration"]


def test_resume_reseeds_workers_from_the_checkpoint_iteration(tmp_path):
    """Resumed workers continue on the checkpoint's seed stream, not the run's first one."""
    run = tmp_path / "run"
    sets = [*LOCAL, "--set", "checkpoint.interval=2", "--set", "stop.env_steps=1024"]
    assert main(["train", "configs/cartpole_ppo.yaml", "--run-dir", str(run), *sets]) == 0
    cfg = load_config(run / "config.yaml")
    loop = TrainingLoop(cfg, RunDir(run), LocalBackend(cfg))
    assert loop.backend.sampler.seed_stream == 0
    loop.restore(load_newest_valid(run / "checkpoints")[1], counters=True)
    assert loop.backend.sampler.seed_stream == loop.c.iteration == 4


def test_resume_without_checkpoints_is_a_clear_error(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text((ROOT / "configs/cartpole_ppo.yaml").read_text())
    assert main(["resume", str(run)]) == 2
    assert "no valid checkpoint" in capsys.readouterr().err


def _wait_for_new_checkpoint(folder: Path, after: int, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        names = [p.name for p in list_checkpoints(folder)]
        if names and int(names[-1][5:13]) > after:
            return
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint past iteration {after} within {timeout}s")


def test_sigkill_during_checkpoint_writes_leaves_a_resumable_run(tmp_path):
    """Kill the driver with SIGKILL at random moments while it checkpoints every iteration."""
    run = tmp_path / "run"
    sets = [kv for kv in LOCAL if kv != "--set"] + ["checkpoint.interval=1", "checkpoint.keep=2"]
    for delay in (0.3, 0.75, 1.2):
        resuming = bool(list_checkpoints(run / "checkpoints"))
        if resuming:
            proc = subprocess.Popen(
                [sys.executable, "-m", "relay_rl.services.cli", "resume", str(run)], cwd=ROOT
            )
        else:
            proc = start_train(run, *sets)
        # Kill once this process is checkpointing every iteration (start-up time varies with load).
        _wait_for_new_checkpoint(run / "checkpoints", after=len(_lines(run)) if resuming else 0)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for line in (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)[:-1]:
            json.loads(line)  # every complete line parses
    assert load_newest_valid(run / "checkpoints") is not None
    done = subprocess.run(
        [sys.executable, "-m", "relay_rl.services.cli", "resume", str(run), "--set", "stop.env_steps=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = _lines(run)
    assert [x["iteration"] for x in lines] == list(range(1, len(lines) + 1))


@pytest.fixture(autouse=True)
def _in_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_keep_one_beside_an_unreadable_newer_checkpoint_keeps_the_good_ones(tmp_path):
    """A resume from ckpt 2 past an unreadable ckpt 5 with keep=1: pruning by name would delete
    every new checkpoint and leave only the corrupt one. The newest good one is always kept, the
    unreadable later one is never pruned, and reaching its iteration sets it aside, not over."""
    save_checkpoint(tmp_path, 2, _state(2), keep=1)
    corrupt = tmp_path / "ckpt-00000005.pt"
    corrupt.write_bytes(b"not a checkpoint")
    assert load_newest_valid(tmp_path)[0].name == "ckpt-00000002.pt"
    for i in (3, 4):
        save_checkpoint(tmp_path, i, _state(i), keep=1)
        assert load_newest_valid(tmp_path)[1].counters.iteration == i
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-00000004.pt", "ckpt-00000005.pt"]
    save_checkpoint(tmp_path, 5, _state(5), keep=1)
    assert load_newest_valid(tmp_path)[1].counters.iteration == 5
    assert (tmp_path / "ckpt-00000005.pt.superseded").read_bytes() == b"not a checkpoint"


def test_a_file_larger_inside_than_outside_is_refused_before_loading(tmp_path):
    """A few KB of deflated zeros declaring GBs (torch writes stored entries only), a legacy
    pickle, a truncated zip: one line each, nothing allocated first."""
    import zipfile

    from relay_rl.contracts.checkpoint import CheckpointError
    from relay_rl.services.runs.checkpoints import read_data

    good = tmp_path / "good.pt"
    torch.save({"w": torch.zeros(1000)}, good)
    bomb = tmp_path / "bomb.pt"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bomb, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("/data/0"):
                data = bytes(64 << 20)  # 64 MB of zeros deflate to ~64 KB
            bombed = info.filename.endswith("/data/0")
            dst.writestr(info.filename, data, compress_type=zipfile.ZIP_DEFLATED if bombed else None)
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(CheckpointError, match="declares 67108864 bytes") as err:
        read_data(bomb)
    assert "\n" not in str(err.value)
    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.zeros(3)}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match="not torch's zip format"):
        read_data(legacy)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:-200])
    with pytest.raises(CheckpointError):
        read_data(truncated)
    assert read_data(good)["w"].shape == (1000,)


def test_a_legacy_or_malformed_policy_file_is_one_line_exit_2(tmp_path, capsys):
    """`relay verify` of a legacy pickle prints relay's line alone (no torch warnings before it); an
    ML-Agents .pt with a layer of the wrong shape is exit 2 naming it, not torch's traceback."""
    legacy = tmp_path / "legacy.pt"
    torch.save({"Policy": {"w": torch.zeros(3)}}, legacy, _use_new_zipfile_serialization=False)
    assert main(["verify", str(legacy)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not torch's zip format" in err[0], err
    sd = torch.load(ROOT / "tests/services/data/mlagents/discrete_cartpole.pt", weights_only=True)
    body = sorted(k for k in sd["Policy"] if k.endswith("seq_layers.0.weight"))[0]
    sd["Policy"][body] = torch.zeros(7, 3)
    bad = tmp_path / "bad_layer.pt"
    torch.save(sd, bad)
    assert main(["verify", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "shapes do not fit together" in err[0], err


def test_a_checkpoint_records_its_family_and_older_ones_get_their_configs():
    from relay_rl.contracts.checkpoint import Checkpoint, CheckpointError, RunCounters

    language = {"model": {"kind": "causal_lm"}}
    ckpt = Checkpoint({"model": {}}, RunCounters(), language, None)
    assert ckpt.family == "language" and ckpt.to_dict()["family"] == "language"
    raw = ckpt.to_dict()
    assert Checkpoint.from_dict(raw).family == "language" and Checkpoint.from_dict(raw).env is None
    del raw["family"]  # written before families were recorded: the config's model kind says
    assert Checkpoint.from_dict(raw).family == "language"
    assert Checkpoint.from_dict({**raw, "config": {}}).family == "env"
    for bad in ("robotics", 3, None):
        with pytest.raises(CheckpointError, match="checkpoint family"):
            Checkpoint.from_dict({**raw, "family": bad})
