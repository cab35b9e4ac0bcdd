"""Checkpoints: written atomically (temporary file, fsync, rename, directory fsync); the newest
loadable one wins; one restore path for `relay resume` and for a learner that died mid-run.

Two forms, one name each iteration:
- `ckpt-<iteration>.pt`, one file: the learner's state whole (what one learner, or rank 0 after
  gathering, holds);
- `ckpt-<iteration>/`, a folder (a sharded learner, `checkpoint.format: sharded`): `shards/`, where
  each learner rank wrote its own shards with torch.distributed.checkpoint (`learner/lm/shards.py`),
  and `checkpoint.pt`, the rest of the state with the counters and config. It is written under a
  temporary name and renamed into place once every shard is there, so a folder missing a shard
  never carries a checkpoint's name.

Loading is `torch.load(weights_only=True)` (tensors and plain containers, never pickled code), or
for shards DCP's reader restricted to data, followed by the schema check of
`contracts/checkpoint.py`.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ...contracts.checkpoint import Checkpoint, CheckpointError, RunCounters
from ...contracts.config import RelayConfig, config_data
from ...contracts.policy_groups import group_config, part_of
from ...contracts.spaces import EnvSpec
from ...contracts.torch_files import zip_entries_problem
from ...learner.algorithms import algorithm_class
from ...learner.learner import learner_state_problem
from ...learner.lm import shards
from ...learner.policy_groups import groups_state_problem
from ...policy.causal_lm import build_language_policy
from ...policy.models import build_policy, infer_env_spec, weights_mismatch
from ...services.runs.files import atomic_write_with, fsync_dir

log = logging.getLogger(__name__)
_NAME = re.compile(r"^ckpt-(\d+)(\.pt)?$")
MANIFEST = "checkpoint.pt"  # a sharded checkpoint's own file: everything but the shards
SHARDS = "shards"  # a sharded checkpoint's folder of shards
SHARDS_KEY = "shards"  # where a loaded sharded checkpoint's learner state names its shards folder
BEST_NAME = "best.pt"  # checkpoint.keep_best: the best evaluation's, never pruned
SUPERSEDED = ".superseded"  # an unreadable checkpoint a resumed run reached again: kept, never listed


def checkpoint_path(folder: Path, iteration: int) -> Path:
    return folder / f"ckpt-{iteration:08d}.pt"


def write_learner_checkpoint(
    folder: Path, cfg: RelayConfig, env: EnvSpec | None, learner_state: dict[str, Any], counters: RunCounters
) -> Path:
    """A learner's state with the run's counters, config, family and env spec (None: a family
    without an env), written as the training loop
    writes its checkpoints (atomically, the newest `checkpoint.keep` kept)."""
    ckpt = Checkpoint(learner_state, counters, config_data(cfg), env, family=cfg.family)
    return save_checkpoint(folder, counters.iteration, ckpt.to_dict(), cfg.checkpoint.keep)


def write_sharded_checkpoint(
    folder: Path,
    cfg: RelayConfig,
    counters: RunCounters,
    write_shards: Callable[[Path], dict[str, Any]],
) -> Path:
    """A sharded learner's checkpoint: `write_shards(shards)` has every rank write its shards
    there and returns the rest of the state (no tensors of the model); the folder becomes
    `ckpt-<iteration>/` only once the shards are whole and the state is written. A checkpoint
    that fails is removed whole, and nothing older is touched."""
    folder.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(folder, counters.iteration).with_suffix("")
    tmp = folder / f"{final.name}.tmp-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        state = write_shards(tmp / SHARDS)
        problem = shards.problem(tmp / SHARDS)
        if problem:
            raise CheckpointError(
                f"{final.name}: {problem} after every learner rank wrote its shards into {tmp}; a "
                "sharded checkpoint needs the run folder on storage every learner node sees (or "
                "checkpoint.format=whole)"
            )
        ckpt = Checkpoint({**state, "model": {}}, counters, config_data(cfg), None, family=cfg.family)
        atomic_write_with(tmp / MANIFEST, lambda f: torch.save(ckpt.to_dict(), f))
        fsync_dir(tmp / SHARDS)
        _set_aside(folder, counters.iteration)
        os.rename(tmp, final)
        fsync_dir(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _prune(folder, counters.iteration, cfg.checkpoint.keep)
    return final


def list_checkpoints(folder: Path) -> list[Path]:
    """Finished checkpoints, files and sharded folders, oldest first (temporary files and folders
    and links are ignored)."""
    found = [
        (n, p)
        for p in folder.glob("ckpt-*")
        if (n := _iteration(p)) >= 0 and not p.is_symlink() and (p.is_dir() != p.name.endswith(".pt"))
    ]
    return [p for _, p in sorted(found)]


def _set_aside(folder: Path, iteration: int) -> None:
    """A checkpoint of this iteration already there (a resume skipped it as unreadable) is set
    aside as `<name>.superseded`, never overwritten."""
    for old in (checkpoint_path(folder, iteration), checkpoint_path(folder, iteration).with_suffix("")):
        if old.exists() and not old.is_symlink():
            aside = old.with_name(old.name + SUPERSEDED)
            if aside.is_dir() and not aside.is_symlink():
                shutil.rmtree(aside)
            os.replace(old, aside)


def _prune(folder: Path, iteration: int, keep: int) -> None:
    """Keep the newest `keep` checkpoints up to `iteration`. Later ones exist only when a resume
    skipped them as unreadable: they are never pruned (pruning by name would keep them and delete
    every good one)."""
    upto = [p for p in list_checkpoints(folder) if _iteration(p) <= iteration]
    for old in upto[:-keep]:
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink(missing_ok=True)


def save_checkpoint(folder: Path, iteration: int, state: dict[str, Any], keep: int) -> Path:
    """Write atomically (through a temporary file created exclusively: a link planted at its
    name is removed, never followed), then prune to the newest `keep` up to this one.

    Checkpoints of later iterations than this one exist only when a resume skipped them as
    unreadable: they are never pruned (pruning by name would keep them and delete every good one),
    and one at this very name is set aside as `<name>.superseded`, not overwritten."""
    folder.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(folder, iteration)
    _set_aside(folder, iteration)
    atomic_write_with(final, lambda f: torch.save(state, f))
    _prune(folder, iteration, keep)
    return final


def _iteration(path: Path) -> int:
    """A checkpoint file's iteration, from its name; -1 for any other file."""
    m = _NAME.match(path.name)
    return int(m.group(1)) if m else -1


def read_data(path: Path) -> Any:
    """A torch file's contents as data (tensors and containers), or CheckpointError in one line.

    weights_only=True refuses any pickled object that is not plain data; torch explains that in
    several lines, cut here to the first.
    """
    check_entries(path)
    try:
        with warnings.catch_warnings():
            # torch warns (in several lines) before refusing some files; relay says one line.
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        text = str(err)
        if "GLOBAL" in text or "Unsupported global" in text:
            why = "it holds pickled objects or code, which relay never loads"
        elif "Weights only load failed" in text:
            why = "not a torch checkpoint file"
        else:
            why = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(err).__name__)[:200]
        raise CheckpointError(f"{path.name} cannot be read as data ({why})") from None


def check_entries(path: Path) -> None:
    """Refuse, before torch reads anything, a file whose contents would be larger than the file
    (`contracts/torch_files.py`)."""
    with path.open("rb") as f:
        problem = zip_entries_problem(f, path.stat().st_size)
    if problem:
        raise CheckpointError(f"{path.name} cannot be read as data ({problem})")


def load_checkpoint(path: Path) -> Checkpoint:
    """A checkpoint file, or a sharded checkpoint's folder: its state, with the model's tensors
    as meta tensors of their saved shapes (read from the shards' index, for the checks a config
    is held to) and `SHARDS_KEY` naming the shards for the learner ranks to load."""
    if not path.is_dir():
        raw = read_data(path)
        if isinstance(raw, dict) and isinstance(raw.get("learner"), dict):
            raw["learner"].pop(SHARDS_KEY, None)  # only a folder's own shards are ever read
        return Checkpoint.from_dict(raw)
    manifest = path / MANIFEST
    if not manifest.is_file() or manifest.is_symlink():
        raise CheckpointError(f"{path.name}/{MANIFEST} is missing")
    raw = read_data(manifest)
    problem = shards.problem(path / SHARDS)
    if problem:
        raise CheckpointError(f"{path.name}: {problem}")
    if isinstance(raw, dict) and isinstance(raw.get("learner"), dict):
        raw["learner"]["model"] = shards.shapes(path / SHARDS, "model")
        raw["learner"][SHARDS_KEY] = str((path / SHARDS).resolve())
    return Checkpoint.from_dict(raw)


def load_newest_valid(
    folder: Path, check: Callable[[Checkpoint, str], None] | None = None
) -> tuple[Path, Checkpoint] | None:
    """The newest checkpoint that loads and passes `check` (which raises CheckpointError for a
    malformed one); a corrupt, truncated or malformed one is reported and skipped."""
    for path in reversed(list_checkpoints(folder)):
        try:
            ckpt = load_checkpoint(path)
            if check is not None:
                check(ckpt, path.name)
            return path, ckpt
        except CheckpointError as err:
            log.warning("checkpoint %s is unusable (%s); trying the previous one", path.name, err)
    return None


class ResumeError(ValueError):
    """A checkpoint the (merged) config cannot continue from (one line, exit 2)."""


def check_algo(cfg: RelayConfig, ckpt: Checkpoint, name: str) -> None:
    """ResumeError where the checkpoint was trained by another learner.algo."""
    saved_algo = (ckpt.config.get("learner") or {}).get("algo", "ppo")
    if saved_algo != cfg.learner.algo:
        raise ResumeError(
            f"{name} was trained with learner.algo={saved_algo}, the config says {cfg.learner.algo}"
        )


def check_env_resumable(cfg: RelayConfig, env: EnvSpec | None, ckpt: Checkpoint, name: str) -> None:
    """An env run's merged config must rebuild exactly the checkpoint's learner: same algorithm,
    same env spaces (and policy groups), a policy its weights load into. Checked on the CPU before
    anything starts."""
    assert env is not None
    check_algo(cfg, ckpt, name)
    saved_env = ckpt.env or infer_env_spec(ckpt.learner["model"])
    if saved_env.policy_names != env.policy_names:

        def groups(e: EnvSpec) -> str:
            return f"policy groups {', '.join(e.policy_names)}" if e.groups else "one policy"

        raise ResumeError(f"{name} was trained with {groups(saved_env)}; the config gives {groups(env)}")
    critic = algorithm_class(cfg.learner.algo).critic
    models = {}
    for group in env.policy_names or [None]:
        policy_cfg = cfg if group is None else group_config(cfg, env, group)
        weights = ckpt.learner["model"] if group is None else part_of(ckpt.learner["model"], group)
        _check_spaces(saved_env.policy(group), env.policy(group), cfg.env.id, name)
        policy = build_policy(policy_cfg, env.policy(group), critic=critic)
        problem = weights_mismatch(policy.state_dict(), weights)
        if problem:
            where = "" if group is None else f"policy group {group} of "
            raise ResumeError(
                f"the config's model does not fit {where}{name} ({problem}); model.* must stay as trained"
            )
        models[group] = policy
    if env.groups:
        problem = groups_state_problem({str(g): m for g, m in models.items()}, ckpt.learner)
    else:
        problem = learner_state_problem(models[None], ckpt.learner)
    if problem:  # the weights fit the config, the rest of the file is malformed: not the config's fault
        raise CheckpointError(f"{name}: {problem}")


def check_language_resumable(cfg: RelayConfig, spec: None, ckpt: Checkpoint, name: str) -> None:
    """A language run continues only with the same estimator, on a model of the same architecture
    and size: the weights must fit model.path's config (built on the meta device: no memory, no
    weights read)."""
    check_algo(cfg, ckpt, name)
    saved_kind = (ckpt.config.get("model") or {}).get("kind")
    if saved_kind != cfg.model.kind:
        raise ResumeError(
            f"{name} was trained with model.kind={saved_kind}, the config says {cfg.model.kind}"
        )
    want = build_language_policy(cfg, meta=True)[0].state_dict()
    weights = ckpt.learner.get("model")
    problem = weights_mismatch(want, weights) if isinstance(weights, dict) else "no model weights"
    if problem:
        raise ResumeError(f"model.path={cfg.model.path} does not fit {name} ({problem})")


def _check_spaces(saved: EnvSpec, env: EnvSpec, env_id: str, name: str) -> None:
    """ResumeError where the env's observations, actions or masks are not those trained on."""

    def spaces(e: EnvSpec) -> tuple[object, ...]:
        return (e.obs_shape, e.leaves, e.action, e.action_mask)

    if spaces(saved) != spaces(env):

        def said(e: EnvSpec) -> str:
            masks = "with" if e.action_mask is not None else "without"
            return f"{e.describe_obs()} and {e.action.describe()} actions {masks} action masks"

        raise ResumeError(f"{name} was trained on observations {said(saved)}; {env_id} has {said(env)}")
