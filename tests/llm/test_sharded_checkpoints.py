"""Sharded checkpoints (`checkpoint.format: sharded`): a folder per checkpoint where each learner
rank writes its shards with torch.distributed.checkpoint, valid only once whole, read as data.

These run one learner in this process (no process group: DCP writes and reads one rank's shards);
the two-rank runs on Ray are in tests/llm/test_sharded_learner.py.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import zipfile
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo

from relay_rl.contracts.checkpoint import CheckpointError, RunCounters
from relay_rl.contracts.config import load_config
from relay_rl.learner.lm import shards
from relay_rl.services.cli import main
from relay_rl.services.runs.checkpoints import (
    MANIFEST,
    SHARDS,
    SHARDS_KEY,
    list_checkpoints,
    load_checkpoint,
    load_newest_valid,
    write_learner_checkpoint,
    write_sharded_checkpoint,
)
from relay_rl.services.runs.run_dir import RunDir
from tests.lm_helpers import sevens_run


@pytest.fixture
def sharded_run(tmp_path, monkeypatch) -> Path:
    """A local language run of 6 iterations whose checkpoints (every 2) are sharded folders."""
    monkeypatch.chdir(sevens_run(tmp_path, checkpoint_interval=2))
    args = ["train", "run.yaml", "--run-dir", "runs/a", "--set", "checkpoint.format=sharded"]
    assert main([*args, "--set", "stop.iterations=6", "--set", "stop.env_steps=null"]) == 0
    return tmp_path / "runs" / "a"


def _linear_state() -> tuple[dict[str, dict[str, torch.Tensor]], dict]:
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    return {"model": dict(layer.state_dict())}, {
        "version": 1,
        "updates": 1,
        "optimizer": {"param_groups": []},
    }


def _write(folder: Path, iteration: int, keep: int = 3) -> Path:
    cfg = load_config("run.yaml", [f"checkpoint.keep={keep}", "checkpoint.format=sharded"])
    parts, rest = _linear_state()

    def write(where: Path) -> dict:
        shards.save(parts, where)
        return rest

    return write_sharded_checkpoint(folder, cfg, RunCounters(iteration=iteration), write)


def test_a_sharded_run_writes_folders_resumes_from_them_and_exports(sharded_run, tmp_path):
    """Each checkpoint is `ckpt-N/` (the rest of the state, and the shards); the newest 3 are kept;
    a resume continues from the newest; the export reads the model whole from its shards."""
    folders = list_checkpoints(sharded_run / "checkpoints")
    assert [p.name for p in folders] == ["ckpt-00000002", "ckpt-00000004", "ckpt-00000006"]
    newest = folders[-1]
    assert {p.name for p in newest.iterdir()} == {MANIFEST, SHARDS}
    assert (newest / SHARDS / ".metadata").is_file() and list((newest / SHARDS).glob("*.distcp"))
    ckpt = load_checkpoint(newest)
    assert ckpt.counters.iteration == 6 and ckpt.learner["version"] == 6
    assert all(t.device.type == "meta" for t in ckpt.learner["model"].values())
    assert ckpt.learner[SHARDS_KEY] == str((newest / SHARDS).resolve())
    # the optimizer's state is in the shards: its parameter groups name parameters by index
    groups = ckpt.learner["optimizer"]["param_groups"]
    assert groups[0]["params"] == list(range(len(groups[0]["params"])))
    assert main(["resume", str(sharded_run), "--set", "stop.iterations=8"]) == 0
    lines = [json.loads(x) for x in (sharded_run / "metrics.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in lines] == list(range(1, 9))
    assert lines[-1]["weights_version"] == 8  # the resumed learner counted on from 6
    # the export of a sharded folder, named directly, holds its weights whole
    out = tmp_path / "hf"
    assert main(["export", str(list_checkpoints(sharded_run / "checkpoints")[-1]), "--format", "hf"]) == 0
    assert main(["export", str(sharded_run), "--format", "hf", "--out", str(out)]) == 0
    from safetensors.torch import load_file

    exported = load_file(out / "model.safetensors")
    state = {"model": {k: torch.empty(t.shape, dtype=t.dtype) for k, t in ckpt.learner["model"].items()}}
    shards.load(state, Path(load_newest_valid(sharded_run / "checkpoints")[1].learner[SHARDS_KEY]))
    key = next(k for k in exported if "embed" in k)
    assert torch.equal(exported[key], state["model"][f"model.{key}"])


def test_a_resume_at_the_same_point_is_the_run_that_never_stopped(tmp_path, monkeypatch):
    """Sharded checkpoints restore everything an update depends on: 4 iterations, a stop, and 2
    more make the weights 6 uninterrupted iterations make."""
    monkeypatch.chdir(sevens_run(tmp_path, checkpoint_interval=2))
    base = [
        "--set",
        "checkpoint.format=sharded",
        "--set",
        "stop.env_steps=null",
        "--set",
        "generation.noise=cpu",
    ]
    assert main(["train", "run.yaml", "--run-dir", "runs/whole", *base, "--set", "stop.iterations=6"]) == 0
    assert main(["train", "run.yaml", "--run-dir", "runs/cut", *base, "--set", "stop.iterations=4"]) == 0
    assert main(["resume", "runs/cut", "--set", "stop.iterations=6"]) == 0

    def weights(run: str) -> dict[str, torch.Tensor]:
        ckpt = load_newest_valid(tmp_path / "runs" / run / "checkpoints")[1]
        state = {"model": {k: torch.empty(t.shape, dtype=t.dtype) for k, t in ckpt.learner["model"].items()}}
        shards.load(state, Path(ckpt.learner[SHARDS_KEY]))
        return state["model"]

    a, b = weights("whole"), weights("cut")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6


def test_a_folder_missing_a_shard_is_no_checkpoint_and_the_one_before_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(sevens_run(tmp_path))
    folder = tmp_path / "ck"
    _write(folder, 2)
    newest = _write(folder, 4)
    (next((newest / SHARDS).glob("*.distcp"))).unlink()
    with pytest.raises(CheckpointError, match=r"ckpt-00000004: shard __0_0\.distcp is missing"):
        load_checkpoint(newest)
    path, _ = load_newest_valid(folder)
    assert path.name == "ckpt-00000002"
    # cut short, or an index gone (a save that did not finish): the same
    shard = next((path / SHARDS).glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="is cut short"):
        load_checkpoint(path)
    (newest / SHARDS / ".metadata").unlink()
    with pytest.raises(CheckpointError, match="a save that did not finish"):
        load_checkpoint(newest)
    assert load_newest_valid(folder) is None


def test_a_failed_save_leaves_nothing_and_keep_prunes_folders(tmp_path, monkeypatch):
    """A rank that fails mid-save: no folder under a checkpoint's name, the older ones untouched.
    `checkpoint.keep` prunes folders as it prunes files, oldest first, whatever their form."""
    monkeypatch.chdir(sevens_run(tmp_path))
    folder = tmp_path / "ck"
    cfg = load_config("run.yaml", ["checkpoint.keep=2"])
    write_learner_checkpoint(folder, cfg, None, {"model": {}, "version": 0}, RunCounters(iteration=1))
    _write(folder, 2, keep=2)

    def broken(where: Path) -> dict:
        shards.save(_linear_state()[0], where)
        raise RuntimeError("rank 1 died")

    with pytest.raises(RuntimeError, match="rank 1 died"):
        write_sharded_checkpoint(folder, cfg, RunCounters(iteration=3), broken)
    assert sorted(p.name for p in folder.iterdir()) == ["ckpt-00000001.pt", "ckpt-00000002"]
    _write(folder, 3, keep=2)
    assert [p.name for p in list_checkpoints(folder)] == ["ckpt-00000002", "ckpt-00000003"]
    # a killed writer's temporary folder is cleaned by the next resume's start
    stale = folder / "ckpt-00000004.tmp-0badf00d"
    (stale / SHARDS).mkdir(parents=True)
    run = RunDir(tmp_path / "run")
    run.checkpoints.mkdir(parents=True)
    os.rename(stale, run.checkpoints / stale.name)
    assert [p.name for p in run.clean_stale_tmp()] == [stale.name]
    assert not any(run.checkpoints.iterdir())


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_the_shard_index_and_shards_are_data(tmp_path, monkeypatch):
    """DCP's own reader unpickles its index and torch.loads non-tensor entries with
    weights_only=False: relay's runs neither. An index naming any other global is refused
    without running it; a non-tensor entry, or a deflated slice, is refused before it is read."""
    monkeypatch.chdir(sevens_run(tmp_path))
    newest = _write(tmp_path / "ck", 2)
    index = newest / SHARDS / ".metadata"
    good = index.read_bytes()
    marker = tmp_path / "ran"

    class Code:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    index.write_bytes(pickle.dumps(Code()))
    with pytest.raises(CheckpointError, match=r"\.metadata names posix\.system"):
        load_checkpoint(newest)
    assert not marker.exists()
    # a file checkpoint cannot point a learner at a folder of its choosing
    planted = tmp_path / "planted.pt"
    torch.save(
        {"learner": {"model": {}, SHARDS_KEY: str(newest / SHARDS)}, "counters": {}, "config": {}}, planted
    )
    assert SHARDS_KEY not in load_checkpoint(planted).learner
    # a non-tensor entry (DCP would torch.load it with weights_only=False)
    index.write_bytes(good)
    odd = tmp_path / "odd"
    shards.save({"model": {"w": torch.ones(2)}}, odd)  # then smuggle bytes in through DCP itself
    import torch.distributed.checkpoint as dcp

    dcp.save(
        {"model": {"w": torch.ones(2)}, "extra": io.BytesIO(b"x")},
        checkpoint_id=tmp_path / "odd2",
        no_dist=True,
    )
    assert "extra is not a tensor" in (shards.problem(tmp_path / "odd2") or "")
    with pytest.raises(shards.ShardError, match="not a tensor"):
        shards.load({"model": {"w": torch.zeros(2)}, "extra": io.BytesIO()}, tmp_path / "odd2")
    # a deflated slice: a small file that would inflate
    md = shards.read_metadata(odd)
    blob = io.BytesIO()
    with zipfile.ZipFile(blob, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data/0", bytes(1 << 20))
    (odd / "big.distcp").write_bytes(blob.getvalue())
    for key in md.storage_data:
        md.storage_data[key] = _StorageInfo("big.distcp", 0, len(blob.getvalue()))
    (odd / ".metadata").write_bytes(pickle.dumps(md))
    assert shards.problem(odd) is None  # the byte ranges are within the files
    with pytest.raises(shards.ShardError, match="declares 1048576 bytes"):
        shards.load({"model": {"w": torch.zeros(2)}}, odd)


def test_the_format_setting(tmp_path, monkeypatch, capsys):
    from relay_rl.learner.lm.settings import sharded_checkpoints

    monkeypatch.chdir(sevens_run(tmp_path))
    lm = load_config("run.yaml")
    assert not sharded_checkpoints(lm)
    assert sharded_checkpoints(load_config("run.yaml", ["checkpoint.format=sharded"]))
    two = load_config("run.yaml", ["learner.num_learners=2", "rollout.num_workers=1"])
    assert sharded_checkpoints(two)
    assert not sharded_checkpoints(
        load_config(
            "run.yaml", ["learner.num_learners=2", "rollout.num_workers=1", "checkpoint.format=whole"]
        )
    )
    root = Path(__file__).resolve().parents[2]
    code = main(["validate", str(root / "configs/cartpole_ppo.yaml"), "--set", "checkpoint.format=sharded"])
    assert code == 2
    assert "checkpoint.format=sharded is a causal LM learner's" in capsys.readouterr().err
