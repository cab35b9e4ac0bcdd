"""A model folder's weights checked as data before anything loads them: which safetensors files
hold them (`model.safetensors`, or the shards a `model.safetensors.index.json` names), each file's
header (sizes, dtypes, offsets against the file's length), and every tensor the folder's
config.json implies, by name and shape.

Headers are read by the safetensors library itself (`safe_open` parses and validates the header
and maps the file without reading a weight), so a header too large, offsets past the end or
overlapping, and a buffer the header does not cover are refused exactly as a load would refuse
them, but before the run starts, in one line naming the file. The tensors the config implies come
from the architecture built on the meta device (no memory, no weights).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MAX_INDEX_BYTES = 64 << 20


class WeightFilesError(ValueError):
    """Weights that a load would fail on, or would fill with random values (one line, exit 2)."""


def weight_files(root: Path) -> list[Path]:
    """The safetensors files a load reads: the shards the index names (each a plain file name in
    the folder, never a pickled `.bin`), else `model.safetensors`."""
    index = root / INDEX
    if not index.exists() and not index.is_symlink():
        single = root / SINGLE
        if not single.is_file():
            pickled = sorted(p.name for p in root.glob("*.bin"))
            why = f" ({pickled[0]} is pickled: convert it to safetensors)" if pickled else ""
            raise WeightFilesError(f"model.path={root}: no {SINGLE} or {INDEX}{why}")
        return [single]
    if not index.is_file() or index.stat().st_size > MAX_INDEX_BYTES:
        raise WeightFilesError(f"{index}: not a file of at most {MAX_INDEX_BYTES >> 20} MiB")
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise WeightFilesError(f"{index}: not readable JSON ({type(err).__name__})") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise WeightFilesError(f"{index}: no weight_map of tensor names to files")
    names = sorted({str(v) for v in weight_map.values()})
    for name in names:
        if not name.endswith(".safetensors"):
            raise WeightFilesError(
                f"{index}: names {name!r}, not a safetensors file; relay never loads pickled weights"
            )
        if os.sep in name or name.startswith(".") or "/" in name:
            raise WeightFilesError(f"{index}: names {name!r}, not a file of this folder")
        if not (root / name).is_file():
            raise WeightFilesError(f"{index}: names {name}, which is not a file in {root}")
    return [root / name for name in names]


def header_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in one safetensors file, by name, from its validated header."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as err:
        why = " ".join(str(err).split())[:200]
        raise WeightFilesError(f"{path}: not a readable safetensors file ({why})") from None


def expected_tensors(
    config: Any, head: str = "causal_lm"
) -> tuple[dict[str, tuple[int, ...]], list[list[str]], str]:
    """(shape of every tensor the architecture saves, by name; groups of names that are one tied
    tensor, any one of which a folder may hold; the architecture's base-model prefix). `head`:
    the model on top of the base, "causal_lm" (a policy) or "sequence_classification" (a reward
    model's scalar score)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    auto = AutoModelForSequenceClassification if head == "sequence_classification" else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config)
    # Names the architecture itself says a checkpoint may lack (transformers loads without them).
    optional = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_missing", None) or ()]
    state = {
        name: tensor
        for name, tensor in model.state_dict(keep_vars=True).items()
        if not any(p.search(name) for p in optional)
    }
    groups: dict[int, list[str]] = {}
    for name, tensor in state.items():
        groups.setdefault(id(tensor), []).append(name)
    shapes = {name: tuple(tensor.shape) for name, tensor in state.items()}
    return shapes, list(groups.values()), str(getattr(model, "base_model_prefix", "") or "")


def _renamed(found: Mapping[str, tuple[int, ...]], want: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The file's names as the model's: a base model saved without the causal LM's prefix (or a
    causal LM's under a bare base model) reads with the prefix added (or dropped), as transformers
    does."""
    if not prefix or any(name in want for name in found):
        return dict(found)
    lead = prefix + "."
    if any(name.startswith(lead) for name in found):
        return {name.removeprefix(lead): shape for name, shape in found.items()}
    return {lead + name: shape for name, shape in found.items()}


def check_weights(root: Path, config: Any, head: str = "causal_lm") -> None:
    """WeightFilesError (one line naming the file or the tensor) unless every tensor `config`'s
    architecture (with `head`, `expected_tensors`) holds is in the folder's safetensors files
    with its shape."""
    files = weight_files(root)
    found: dict[str, tuple[int, ...]] = {}
    where: dict[str, Path] = {}
    for path in files:
        for name, shape in header_shapes(path).items():
            found[name], where[name] = shape, path
    want, tied, prefix = expected_tensors(config, head)
    have = _renamed(found, want, prefix)
    for names in tied:
        held = [n for n in names if n in have]
        if not held:
            raise WeightFilesError(
                f"model.path={root}: the weights lack {names[0]} (config.json's architecture has it; "
                "a load would fill it with random values)"
            )
        for name in held:
            if have[name] != want[name]:
                file = where.get(name) or next(iter(where.values()))
                raise WeightFilesError(
                    f"{file.parent / 'config.json'}: {name} is {list(have[name])} in {file.name}, "
                    f"config.json makes it {list(want[name])}"
                )
