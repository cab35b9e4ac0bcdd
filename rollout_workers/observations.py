"""From what a vector env returns to the policy's input fields: one array per observation leaf and
the action mask, named as the Segment names them ("obs", "obs/<path>", "action_mask").

Vector envs (gymnasium's and EnvPool's) batch Dict and Tuple observations already, leaf by leaf,
so a leaf is read from the batch as it is, never re-stacked per env. Choices (Discrete,
MultiDiscrete) are stored from 0: their `start` is subtracted here once, so encoders and exports
never see it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..contracts.segment import Fields
from ..contracts.spaces import PATH_SEP, EnvSpec, ObsLeaf
from ..rollout_workers.multi_agent.common import FINAL_GLOBAL_KEY, GLOBAL_KEY


def _at(tree: Any, path: str) -> Any:
    """The value at `path` ("image", "pos/0") of a nested Dict/Tuple observation."""
    for key in path.split(PATH_SEP) if path else ():
        tree = tree[int(key)] if isinstance(tree, tuple | list) else tree[key]
    return tree


def _leaf_array(leaf: ObsLeaf, value: Any) -> np.ndarray:
    arr = np.asarray(value)
    if leaf.kind in ("discrete", "multi_discrete") and leaf.start and any(leaf.start):
        arr = arr - np.asarray(leaf.start, dtype=np.int64).reshape(leaf.shape)
    return arr.astype(leaf.storage_dtype, copy=False)


class MaskError(ValueError):
    """An env's action mask that does not fit its action space (one line naming both)."""


class ObsReader:
    """Reads N envs' observations (and infos, for masks) into fields [N, ...].

    A mask read from infos is kept per env: a partial reset's info only speaks for the envs it
    reset (gymnasium flags them in info["_<key>"]), the others keep the mask they had.
    """

    def __init__(self, spec: EnvSpec, num_envs: int, value_inputs: bool = False) -> None:
        """`value_inputs`: read what only the value trunk takes too (a centralized critic's global
        state, from the env's infos); acting alone never needs it."""
        self.spec = spec
        self.global_state = spec.global_state if value_inputs else 0
        self.leaves = spec.obs_leaves
        self.mask_kind, _, self.mask_key = (spec.action_mask or "").partition(":")
        self.mask = np.ones((num_envs, spec.action.param_size), dtype=bool)
        self._dtype = spec.storage_dtype

    def read(self, obs: Any, info: dict[str, Any] | None = None) -> Fields:
        """The input fields of a batch of N observations (Dict leaves batched by the vector env)."""
        if not self.spec.structured:
            arr = obs if isinstance(obs, np.ndarray) else np.asarray(obs)
            out = {"obs": arr if arr.dtype == self._dtype else arr.astype(self._dtype)}
        else:
            out = {leaf.field: _leaf_array(leaf, _at(obs, leaf.path)) for leaf in self.leaves}
        if self.mask_kind:
            out["action_mask"] = self._read_mask(obs, info or {})
        if self.global_state:  # a parallel env read with its global state (a fresh array)
            out["global_state"] = (info or {})[GLOBAL_KEY]
        return out

    def _read_mask(self, obs: Any, info: dict[str, Any]) -> np.ndarray:
        n, width = self.mask.shape
        if self.mask_kind == "obs":
            return self._fit(np.asarray(obs[self.mask_key])) > 0
        value = info.get(self.mask_key)
        if value is not None:
            rows = np.asarray(info.get("_" + self.mask_key, np.ones(n, dtype=bool)), dtype=bool)
            fresh = np.asarray(value)
            if fresh.dtype == object:  # envs that had no mask this step left None in their row
                fresh = np.stack(
                    [np.ones(width) if v is None else self._fit(np.asarray(v), 1)[0] for v in value]
                )
            self.mask[rows] = self._fit(fresh)[rows] > 0
        return self.mask.copy()

    def _fit(self, mask: np.ndarray, rows: int | None = None) -> np.ndarray:
        """`mask` as [rows (default N), choices], or MaskError naming the source and the sizes."""
        n = self.mask.shape[0] if rows is None else rows
        width = self.mask.shape[1]
        if mask.size != n * width:
            raise MaskError(
                f"env.action_mask={self.mask_kind}:{self.mask_key}: the env gave {mask.size // max(n, 1)} "
                f"mask values per env (shape {list(mask.shape)}), the action space has {width} choices"
            )
        return mask.reshape(n, width)

    def read_one(self, obs: Any) -> Fields:
        """The input fields of one env's observation (a final observation), each [1, ...]; no
        mask (only V reads a final observation)."""
        if not self.spec.structured:
            return {"obs": np.asarray(obs)[None].astype(self.spec.storage_dtype, copy=False)}
        return {leaf.field: _leaf_array(leaf, _at(obs, leaf.path))[None] for leaf in self.leaves}

    def read_final(self, info: dict[str, Any], i: int) -> Fields:
        """The input fields of env i's final observation in a step's `info`, each [1, ...]: its
        observation and, where the value trunk reads one, the global state it ended in."""
        out = self.read_one(info["final_obs"][i])
        if self.global_state:
            out["global_state"] = info[FINAL_GLOBAL_KEY][i][None]
        return out

    def stack(self, rows: list[Fields]) -> Fields:
        """Fields of several read_one results, [k, ...]."""
        return {name: np.concatenate([r[name] for r in rows]) for name in rows[0]}


def select_rows(fields: Fields, rows: np.ndarray, other: Fields) -> Fields:
    """Per field, `other`'s rows where `rows` [N] is True, `fields`' elsewhere."""
    out = {}
    for name, arr in fields.items():
        where = rows.reshape(-1, *([1] * (arr.ndim - 1)))
        out[name] = np.where(where, other[name], arr)
    return out


def finite_rows(fields: Fields) -> np.ndarray | None:
    """None when every float leaf is finite (the fast path), else bool [N]: the envs whose float
    leaves all are."""
    floats = [a for a in fields.values() if a.dtype.kind == "f"]
    if all(np.isfinite(a).all() for a in floats):
        return None
    n = next(iter(fields.values())).shape[0]
    good = np.ones(n, dtype=bool)
    for a in floats:
        good &= np.isfinite(a.reshape(n, -1)).all(axis=1)
    return good
