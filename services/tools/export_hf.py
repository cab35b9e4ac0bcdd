"""`relay export RUN --format hf [--out DIR]`: a language run's trained model as a Hugging Face
folder that `AutoModelForCausalLM.from_pretrained` loads (safetensors, config, tokenizer); a
reward model's run's as one `AutoModelForSequenceClassification.from_pretrained` loads.

The checkpoint and the run's config are data: the config names the model folder the run started
from (its architecture and tokenizer, checked as `model.path` is at train time); the weights come
from the checkpoint. The folder is written beside its destination and renamed into place, so a
crash or a signal leaves either nothing or the whole folder, and an existing folder is never
replaced. Before it is renamed into place, transformers loads it back and decodes random prompts
greedily with `generate`: every token must be the trained policy's own greedy token (as ONNX
exports are checked against onnxruntime). A reward model's folder is checked the same way: loaded
back, it scores random rows as the trained model does (`learner/lm/reward_model.py` export_scorer).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from ...contracts.checkpoint import Checkpoint, CheckpointError
from ...contracts.config import LANGUAGE_FAMILY, PREFERENCE_FAMILY, LoraConfig
from ...learner.lm import shards
from ...learner.lm.reward_model import build_scorer, export_scorer
from ...policy.causal_lm import CausalLMPolicy, ModelFolderError, build_language_policy, load_tokenizer
from ...policy.models import weights_mismatch
from ...services.runs.checkpoints import MANIFEST, SHARDS_KEY, load_checkpoint, load_newest_valid
from ...services.runs.files import OutputError


def run_checkpoint(path: Path) -> tuple[Path, Checkpoint]:
    """(the checkpoint file, its contents) of a run directory (its newest valid checkpoint) or a
    checkpoint file (or a sharded checkpoint's folder); CheckpointError (one line) otherwise."""
    if path.is_dir() and (path / MANIFEST).exists():  # a sharded checkpoint's folder
        return path, load_checkpoint(path)
    if path.is_dir():
        found = load_newest_valid(path / "checkpoints")
        if found is None:
            raise CheckpointError(f"{path}: no valid checkpoint (a run directory has checkpoints/ckpt-N.pt)")
        return found
    if path.is_file():
        return path, load_checkpoint(path)
    raise CheckpointError(f"{path}: no such run directory or checkpoint")


def model_source(file: Path, ckpt: Checkpoint) -> tuple[str, LoraConfig | None]:
    """(the model folder the checkpoint's run started from, its LoRA adapters or None), from its
    config (data); CheckpointError where it names no folder."""
    model = ckpt.config.get("model") or {}
    source, lora = model.get("path"), model.get("lora")
    if not isinstance(source, str):
        raise CheckpointError(f"{file}: its config names no model.path")
    return source, None if lora is None else LoraConfig.model_validate(lora)


def check_folder_output(out: Path) -> None:
    """Refuse an output folder that exists (non-empty), is a link, or cannot be written."""
    if out.is_symlink():
        raise OutputError(f"--out {out} is a symbolic link; relay never writes through one")
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise OutputError(f"--out {out} exists; choose a new folder (nothing is ever replaced)")
    parent = out.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"--out {out}: {parent} is not a writable folder")


class ExportMismatchError(RuntimeError):
    """The exported folder does not generate what the trained policy generates (exit 1)."""


def greedy_mismatch(
    policy: CausalLMPolicy, folder: Path, rows: int = 4, length: int = 8, new: int = 16
) -> str | None:
    """Why the folder, loaded by `AutoModelForCausalLM.from_pretrained` and decoded greedily by
    `generate`, does not give the policy's own greedy tokens on `rows` random prompts; None when
    every token agrees."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(folder), local_files_only=True, trust_remote_code=False, use_safetensors=True, dtype=torch.float32
    ).eval()
    g = torch.Generator().manual_seed(0)
    special = {policy.pad_id, *policy.eos_ids.tolist()}
    pool = torch.tensor([i for i in range(min(policy.vocab_size, 4096)) if i not in special])
    ids = pool[torch.randint(len(pool), (rows, length), generator=g)]
    ones = torch.ones_like(ids)
    policy.eval()
    with torch.no_grad():
        ours = policy.generate(ids, ones, new, temperature=1.0, top_k=1, generator=g)
        theirs = model.generate(
            ids,
            attention_mask=ones,
            max_new_tokens=new,
            do_sample=False,
            pad_token_id=policy.pad_id,
            eos_token_id=policy.eos_ids.tolist(),
        )[:, length:]
    mine = torch.where(ours.mask > 0, ours.tokens, torch.full_like(ours.tokens, policy.pad_id))
    theirs = torch.nn.functional.pad(theirs, (0, new - theirs.shape[1]), value=policy.pad_id)
    differ = (mine != theirs).nonzero()
    if len(differ) == 0:
        return None
    row, col = (int(x) for x in differ[0])
    said = f"the policy gives {int(mine[row, col])}, the folder {int(theirs[row, col])}"
    return f"greedy token {col} of prompt {row}: {said}"


def trained_policy(file: Path, ckpt: Checkpoint) -> tuple[CausalLMPolicy, Any]:
    """(the checkpoint's trained policy, its tokenizer): the model folder its config names
    (model.path, with its LoRA adapters where it had them), the checkpoint's weights loaded in;
    CheckpointError (one line) where the folder cannot be read now or the weights do not fit it."""
    source, lora = model_source(file, ckpt)
    trained = SimpleNamespace(model=SimpleNamespace(path=source, lora=lora))
    try:
        policy, tokenizer = build_language_policy(trained)
    except (ModelFolderError, ValueError) as err:
        raise CheckpointError(
            f"{file} was trained from model.path={source}, which cannot be read now: {err}"
        ) from None
    try:
        if ckpt.learner.get(SHARDS_KEY) is not None:  # read whole from every rank's shards
            problem = weights_mismatch(policy.state_dict(), ckpt.learner["model"])
            if problem:
                raise RuntimeError(problem)
            state = {"model": policy.state_dict()}
            shards.load(state, Path(ckpt.learner[SHARDS_KEY]))
            policy.load_state_dict(state["model"])
        else:
            policy.load_state_dict(ckpt.learner["model"])
    except shards.ShardError as err:
        raise CheckpointError(f"{file}: {err}") from None
    except (RuntimeError, KeyError) as err:
        raise CheckpointError(
            f"{file}: its weights do not fit {source} ({str(err).splitlines()[0][:200]})"
        ) from None
    return policy, tokenizer


def trained_scorer(file: Path, ckpt: Checkpoint) -> tuple[Any, Any]:
    """(a reward model's run's trained scorer, its tokenizer): the model folder its config names
    as a sequence classifier (with its LoRA adapters where it had them), the checkpoint's weights
    loaded in; CheckpointError (one line) where the folder cannot be read now or the weights do
    not fit it."""
    source, lora = model_source(file, ckpt)
    try:
        tokenizer = load_tokenizer(source)
        model = build_scorer(source, int(tokenizer.pad_token_id), lora)
    except (ModelFolderError, ValueError, OSError) as err:
        raise CheckpointError(
            f"{file} was trained from model.path={source}, which cannot be read now: {err}"
        ) from None
    weights = ckpt.learner.get("model")
    problem = weights_mismatch(model.state_dict(), weights) if isinstance(weights, dict) else "no weights"
    if problem:
        raise CheckpointError(f"{file}: its weights do not fit {source} ({problem})")
    model.load_state_dict(weights)
    return model.eval(), tokenizer


def _default_out(file: Path, ckpt: Checkpoint) -> Path:
    run = file.parent.parent if file.parent.name == "checkpoints" else file.parent
    return run / f"hf-{ckpt.counters.iteration}"


def _export_policy(file: Path, ckpt: Checkpoint, out: Path) -> str:
    policy, tokenizer = trained_policy(file, ckpt)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        policy.save_pretrained(tmp)
        tokenizer.save_pretrained(str(tmp))
        problem = greedy_mismatch(policy, tmp)
        if problem:
            raise ExportMismatchError(
                f"the export does not generate what {file} does ({problem}); nothing written"
            )
        if out.exists():
            out.rmdir()  # empty (checked above); rename cannot replace a folder
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return "AutoModelForCausalLM.from_pretrained loads it and generates the policy's greedy tokens"


def _export_scorer(file: Path, ckpt: Checkpoint, out: Path) -> str:
    model, tokenizer = trained_scorer(file, ckpt)
    if out.exists():
        out.rmdir()  # empty (checked by the caller): the export renames its checked folder here
    try:
        export_scorer(model, tokenizer, out)
    except RuntimeError as err:
        raise ExportMismatchError(str(err)) from None
    return (
        "AutoModelForSequenceClassification.from_pretrained loads it and scores as the run did; "
        f'a language run scores with it as prompts.rewards: ["model:{out}"]'
    )


# What --format hf writes of a checkpoint, by its run's family: the writer and what it wrote.
HF_EXPORTS: dict[str, Callable[[Path, Checkpoint, Path], str]] = {
    LANGUAGE_FAMILY: _export_policy,
    PREFERENCE_FAMILY: _export_scorer,
}


def export_hf(path: Path, out: Path | None) -> tuple[Path, str]:
    """Write the run's (or checkpoint's) model to `out` (default: <run>/hf-<iteration>): the
    folder, and what loads it, in words."""
    file, ckpt = run_checkpoint(path)
    write = HF_EXPORTS.get(ckpt.family)
    if write is None:
        kind = (ckpt.config.get("model") or {}).get("kind")
        raise CheckpointError(
            f"{file}: trained model.kind={kind}, an {ckpt.family} run; export it with --format onnx"
        )
    out = out if out is not None else _default_out(file, ckpt)
    check_folder_output(out)
    return out, write(file, ckpt, out)
