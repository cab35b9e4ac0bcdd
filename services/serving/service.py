"""The policy service behind `relay serve`, without Ray: load a policy file as data, check requests,
answer batches, follow a run's newest checkpoint. `services/serving/app.py` puts it behind Ray
Serve's HTTP proxy and `@serve.batch`.

A request is `{"obs": [[...], ...], "deterministic": true, "seed": 7}`: one observation or a
batch of them (for a Dict/Tuple observation, an object of its leaves, `{"image": [...],
"direction": 2}`, each one or a batch; Tuple positions as arrays), plus `"action_mask": [...]`
where the env has masks (absent: every action allowed); `deterministic` (default true) gives
greedy actions, false samples with noise drawn on the CPU from `seed` (a random one when absent).
A sampled request with a seed is answered by a forward pass of its own, so its bits do not depend
on what else shared the batch (matrix kernels round differently at different batch sizes): the
same request, the same bits, under any load. Whatever a client
sends, the answer is JSON: 400 for a body that is not JSON, has no `obs`, the wrong shape, a leaf
missing or out of its range (naming the leaf's path), or NaN or inf anywhere; 413 past the size
limit. Actions come back as the env takes them (choices from the space's start, in its shape).

A recurrent policy's requests name their client's session, `"session": "robot-7"` (and
`"reset": true` at an episode's start): the service carries the policy's state from one call of
the session to the next, in a store of its own or one its replicas share
(`services/serving/sessions.py`), and each answer says what the state was
(`"state": "new" | "carried" | "reset" | "expired" | "weights changed"`).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...contracts.segment import Fields, as_fields
from ...contracts.spaces import PATH_SEP, ObsLeaf
from ...learner.device import resolve_device
from ...policy.actor_critic import STATE, draw_noise
from ...rollout_workers.user_code import one_line
from ...services.runs.checkpoints import list_checkpoints, load_checkpoint
from ...services.serving.runtimes import RUNTIMES
from ...services.serving.sessions import MAX_SESSION_CHARS, SESSION_ID, Keep, Sessions, SessionStore
from ...services.tools.handle import PolicyHandle, PolicyLoadError, concat_fields, rows_of
from ...services.tools.load import load_policy
from ...services.tools.verify import fingerprint

MAX_ROWS = 4096  # observations in one request


class BadRequest(ValueError):
    """A request the service refuses: an HTTP status and a one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class ActRequest:
    """One client's input fields (observation leaves, action mask; each [k, ...]), greedy or
    sampled, and its seed."""

    obs: Fields  # (a bare array is a plain observation batch, {"obs": array})
    deterministic: bool = True
    seed: int = field(default_factory=lambda: secrets.randbelow(2**63))
    seeded: bool = False  # the client chose the seed: it wants these exact bits again
    session: str | None = None  # a recurrent policy's client, whose state the replica carries
    reset: bool = False  # the session starts over (an episode's start)
    session_key: str | None = None  # the client's secret: a session started with one needs it

    def __post_init__(self) -> None:
        self.obs = as_fields(self.obs)

    @property
    def rows(self) -> int:
        return rows_of(self.obs)

    @property
    def alone(self) -> bool:
        """Answered by its own forward pass (reproducible bits), not in the shared batch."""
        return self.seeded and not self.deterministic


def _no_constants(token: str) -> Any:
    raise BadRequest(400, f"{token} is not a number JSON allows")


def _read_json(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=_no_constants)
    except BadRequest:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadRequest(400, "the body is not JSON") from None
    if not isinstance(data, dict) or "obs" not in data:
        raise BadRequest(400, 'expected a JSON object with "obs"')
    return data


def _rows(raw: Any, what: str, shape: tuple[int, ...]) -> np.ndarray:
    """[k, *shape] float64 from one value of `shape` or k of them, finite; 400 naming `what`."""
    try:
        arr = np.asarray(raw, dtype=np.float64)
    except OverflowError:
        raise BadRequest(400, f"{what} holds a number too large for float64") from None
    except (ValueError, TypeError):
        raise BadRequest(400, f"{what} is not an array of numbers (ragged rows?)") from None
    if arr.shape == shape:
        arr = arr[None]
    if arr.shape[1:] != shape or not 1 <= arr.shape[0] <= MAX_ROWS:
        expected = f"{list(shape)} or [k, {', '.join(map(str, shape))}], k <= {MAX_ROWS}"
        raise BadRequest(400, f"{what} has shape {list(arr.shape)}; expected {expected}")
    if not np.isfinite(arr).all():
        raise BadRequest(400, f"{what} holds NaN or inf")
    return arr


def _whole(arr: np.ndarray, what: str, low: np.ndarray | float, high: np.ndarray | float) -> None:
    if (arr < low).any() or (arr > high).any() or (arr % 1).any():
        raise BadRequest(400, f"{what} holds whole numbers in [{_show(low)}, {_show(high)}]")


def _show(bound: np.ndarray | float) -> str:
    values = np.unique(np.asarray(bound))
    return str(int(values[0])) if len(values) == 1 else "per component: " + str(np.asarray(bound).tolist())


def _at(tree: Any, path: str, what: str) -> Any:
    """The value at a leaf path of a JSON tree (objects by key, Tuples as arrays by index)."""
    node = tree
    for key in path.split(PATH_SEP):
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            raise BadRequest(400, f"{what} is missing")
    return node


def _leaf(raw: Any, leaf: ObsLeaf, what: str) -> np.ndarray:
    """One leaf's rows, checked against its kind; choices come back from 0, as the policy reads them."""
    arr = _rows(raw, what, leaf.shape)
    if leaf.kind in ("discrete", "multi_discrete"):
        start = np.asarray(leaf.start or (0,) * len(leaf.nvec), dtype=np.float64).reshape(leaf.shape)
        top = start + np.asarray(leaf.nvec, dtype=np.float64).reshape(leaf.shape) - 1
        _whole(arr, what, start, top)
        return arr - start
    if leaf.kind == "multi_binary":
        _whole(arr, what, 0, 1)
    elif leaf.dtype == "uint8" and leaf.kind == "box":
        _whole(arr, what, 0, 255)
    return arr


def _inputs(data: dict[str, Any], handle: PolicyHandle) -> Fields:
    """The request's input fields: "obs" (an array, or for a tree a JSON object per leaf path) and
    "action_mask" (absent: every action allowed), each [k, ...] with one k."""
    env = handle.env
    if not env.structured:
        obs = _rows(data["obs"], '"obs"', handle.obs_shape)
        if env.storage_dtype == np.uint8 and (obs.min() < 0 or obs.max() > 255 or (obs % 1).any()):
            raise BadRequest(400, '"obs" of an image policy are whole numbers in [0, 255]')
        fields = {"obs": obs}
    else:
        if env.leaves[0].path and not isinstance(data["obs"], dict | list):
            paths = ", ".join(repr(leaf.path) for leaf in env.leaves[:8])
            raise BadRequest(400, f'"obs" is an object of the observation\'s leaves ({paths})')
        fields = {
            leaf.field: _leaf(_at(data["obs"], leaf.path, f'"{leaf.field}"'), leaf, f'"{leaf.field}"')
            if leaf.path
            else _leaf(data["obs"], leaf, '"obs"')
            for leaf in env.leaves
        }
    rows = {len(a) for a in fields.values()}
    if len(rows) > 1:
        raise BadRequest(400, f'the leaves of "obs" hold different numbers of rows ({sorted(rows)})')
    k = rows.pop()
    if env.action_mask is not None:
        raw = data.get("action_mask")
        if raw is None:
            fields["action_mask"] = np.ones((k, env.action.param_size))
        else:
            mask = _rows(raw, '"action_mask"', (env.action.param_size,))
            _whole(mask, '"action_mask"', 0, 1)
            if len(mask) != k:
                raise BadRequest(400, f'"action_mask" has {len(mask)} rows, "obs" {k}')
            fields["action_mask"] = mask
    elif "action_mask" in data:
        raise BadRequest(400, '"action_mask" given, but this policy\'s env has no action masks')
    return handle.as_input(fields, with_state=False)  # a session's state joins it when it runs


def _session(data: dict[str, Any], handle: PolicyHandle) -> tuple[str | None, bool, str | None]:
    session, reset, key = data.get("session"), data.get("reset", False), data.get("session_key")
    if not handle.recurrent:
        if session is not None or "reset" in data or key is not None:
            raise BadRequest(
                400,
                '"session", "session_key" and "reset" are for recurrent policies; this one keeps no state',
            )
        return None, False, None
    if session is None:
        raise BadRequest(
            400,
            'this policy is recurrent: send "session": "<id>" so the replica carries its state between calls',
        )
    if not isinstance(session, str) or not SESSION_ID.fullmatch(session):
        raise BadRequest(400, f'"session" is 1-{MAX_SESSION_CHARS} characters of A-Z a-z 0-9 _ . : -')
    if not isinstance(reset, bool):
        raise BadRequest(400, '"reset" is true or false')
    if key is not None and (not isinstance(key, str) or not SESSION_ID.fullmatch(key)):
        raise BadRequest(400, f'"session_key" is 1-{MAX_SESSION_CHARS} characters of A-Z a-z 0-9 _ . : -')
    return session, reset, key


def parse_act(body: bytes, handle: PolicyHandle) -> ActRequest:
    """The request in `body`, checked against the policy's observation shape and dtype."""
    data = _read_json(body)
    deterministic = data.get("deterministic", True)
    if not isinstance(deterministic, bool):
        raise BadRequest(400, '"deterministic" is true or false')
    request = ActRequest(_inputs(data, handle), deterministic)
    request.session, request.reset, request.session_key = _session(data, handle)
    if "seed" in data:
        seed = data["seed"]
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
            raise BadRequest(400, '"seed" is a whole number in [0, 2^63)')
        request.seed, request.seeded = seed, True
    return request


class IncompatibleCheckpoint(ValueError):
    """A newer checkpoint whose interface differs from the served policy's (kept out, said once)."""


def interface_change(now: PolicyHandle, new: PolicyHandle) -> str | None:
    """Why `new` cannot answer the requests `now` answers (other observations or actions, another
    model shape), or None: clients were told the served interface and send what it reads."""

    def interface(h: PolicyHandle) -> tuple[Any, ...]:
        return (h.env.obs_shape, h.env.storage_dtype, h.env.leaves, h.env.action, h.env.action_mask)

    if interface(now) != interface(new):
        return (
            f"it reads {new.env.describe_obs()} and acts {new.env.action.to_dict()}, the served policy "
            f"reads {now.env.describe_obs()} and acts {now.env.action.to_dict()}"
        )
    have, want = new.model.state_dict(), now.model.state_dict()
    if {k: tuple(v.shape) for k, v in have.items()} != {k: tuple(v.shape) for k, v in want.items()}:
        return "its model has other layers or sizes than the served one"
    return None


@dataclass(frozen=True)
class Served:
    """What answers now: the policy, its runtime, the weights version, the file it came from and
    its fingerprint, swapped as one reference."""

    version: int
    runtime: Any
    source: str
    handle: PolicyHandle
    fingerprint: str


class PolicyService:
    """Loads MODEL (or RUN_DIR's newest checkpoint with `follow`) and answers batches."""

    def __init__(
        self,
        model: str,
        runtime: str = "torch",
        device: str = "auto",
        follow: bool = False,
        policy: str | None = None,
        sessions: Sessions | None = None,
    ) -> None:
        """`policy`: the policy group served from checkpoints of policy groups; `sessions`: where
        a recurrent policy's sessions live (default: a store of this service's own)."""
        self.path = Path(model)
        self.runtime_name, self.device, self.follow = runtime, device, follow
        self.policy = policy
        self.served = self._load_newest() if follow else self._load(self.path)
        self._refused = ""  # the newest checkpoint, when it did not fit what is served
        self.sessions: Sessions = sessions if sessions is not None else SessionStore()

    @property
    def handle(self) -> PolicyHandle:
        return self.served.handle

    def _checkpoints(self) -> list[Path]:
        found = list_checkpoints(self.path / "checkpoints")
        if not found:
            raise FileNotFoundError(f"{self.path}/checkpoints holds no checkpoint yet")
        return found

    def _load_newest(self) -> Served:
        """The newest checkpoint that loads (a torn or pruned one is passed over, as resume does)."""
        errors = []
        for path in reversed(self._checkpoints()):
            try:
                return self._load(path)
            except (PolicyLoadError, OSError) as err:
                errors.append(f"{path.name}: {err}")
        raise FileNotFoundError(f"{self.path}/checkpoints holds no loadable checkpoint ({errors[0]})")

    def _load(self, path: Path) -> Served:
        handle = load_policy(path, policy=self.policy)
        bad = handle.nonfinite_weights()
        if bad:  # it would answer every request with NaN (or fail on it): refused as export does
            raise PolicyLoadError(f"{path.name}: the weights are not finite ({bad}); nothing served")
        version = 0
        if handle.config is not None and path.suffix == ".pt":  # a relay checkpoint
            learner = load_checkpoint(path).learner
            version = int((learner.get("groups") or {}).get(self.policy, learner).get("version", 0))
        runtime = RUNTIMES[self.runtime_name](handle, self.device)
        return Served(version, runtime, path.name, handle, fingerprint(handle, resolve_device("cpu")))

    def refresh(self) -> bool:
        """Follow mode: load a newer checkpoint if there is one and swap it in (requests in flight
        finish on the weights they started with). True when it swapped."""
        if not self.follow:
            return False
        newest = self._checkpoints()[-1]
        if newest.name in (self.served.source, self._refused):
            return False
        candidate = self._load(newest)
        problem = interface_change(self.served.handle, candidate.handle)
        if problem:
            self._refused = newest.name  # said once; the next newer checkpoint is looked at again
            raise IncompatibleCheckpoint(
                f"not swapping in {newest.name}: {problem}; still serving {self.served.source}"
            )
        self.served = candidate  # one reference: a batch runs on the one it read first
        return True

    def metadata(self) -> dict[str, Any]:
        served = self.served
        env = served.handle.env
        return {
            "source": served.source,
            "policy": self.policy,
            "weights_version": served.version,
            "obs_shape": list(env.obs_shape),
            "obs_dtype": str(env.storage_dtype),
            "obs_leaves": [leaf.to_dict() for leaf in env.leaves],
            "action_mask": env.action_mask is not None,
            "action": env.action.to_dict(),
            "fingerprint": served.fingerprint,
            "runtime": served.runtime.name,
            "device": served.runtime.device,
            "follow": self.follow,
        }

    def act(self, requests: list[ActRequest]) -> list[dict[str, Any]]:
        """One batch of requests: one forward pass for all of them but the seeded sampled ones,
        which get one each, and a later pass for a session's second call in the batch (it starts
        from the first one's state). An answer per request, in order; a session call that cannot
        run answers {"error", "_status"}."""
        served = self.served  # one version answers the whole batch
        shared = [r for r in requests if not r.alone]
        groups = [[r] for r in requests if r.alone] + _once_per_session(shared)
        answers: dict[int, dict[str, Any]] = {}
        for group in groups:
            ready, refused = self._start_sessions(served, group)
            answers.update(refused)
            if not ready:
                continue
            try:
                outputs = self._forward(served, ready)
            except Exception as err:  # the policy itself failed: said per request, never a bare 500
                why = one_line(err)
                answers.update(
                    {id(r): {"error": f"the policy could not run ({why})", "_status": 503} for r, _ in ready}
                )
                continue
            for (r, status), actions in zip(ready, outputs, strict=True):
                if not np.isfinite(actions).all():
                    answers[id(r)] = {
                        "error": "the policy's actions for these observations are not finite",
                        "_status": 422,
                    }
                    continue
                answers[id(r)] = {
                    "actions": actions.tolist(),
                    "weights_version": served.version,
                    "batch_rows": sum(g.rows for g, _ in ready),
                    "batch_requests": len(ready),
                    **({"session": r.session, "state": status} if r.session is not None else {}),
                }
        return [answers[id(r)] for r in requests]

    def _start_sessions(
        self, served: Served, group: list[ActRequest]
    ) -> tuple[list[tuple[ActRequest, str]], dict[int, dict[str, Any]]]:
        """Each request with the state its session starts from put in its fields (and what that
        state is), and the answers of those refused (rows other than the session's; no room)."""
        ready: list[tuple[ActRequest, str]] = []
        refused: dict[int, dict[str, Any]] = {}
        width = served.handle.model.acting_state_size
        calls = [r for r in group if r.session is not None]
        started = iter(
            self.sessions.start_many(
                [(str(r.session), r.rows, width, _tag(served), r.reset, r.session_key) for r in calls]
            )
            if calls
            else []
        )
        for r in group:
            if r.session is None:
                ready.append((r, ""))
                continue
            state, status, code = next(started)
            if state is None:
                refused[id(r)] = {"error": status, "_status": code}
                continue
            r.obs = {**r.obs, STATE: state}
            ready.append((r, status))
        return ready, refused

    def _forward(self, served: Served, group: list[tuple[ActRequest, str]]) -> list[np.ndarray]:
        requests = [r for r, _ in group]
        obs = concat_fields([r.obs for r in requests])
        deterministic = np.concatenate([np.full(r.rows, r.deterministic) for r in requests])
        noise = np.concatenate(
            [
                draw_noise(served.handle.model.action, r.rows, torch.Generator().manual_seed(r.seed)).numpy()
                for r in requests
            ]
        )
        actions, state = served.runtime.act(obs, deterministic, noise)
        splits = np.cumsum([r.rows for r in requests])[:-1]
        if state is not None:
            keep: list[Keep] = [
                (r.session, rows.astype(np.float32, copy=False), _tag(served), r.session_key)
                for r, rows in zip(requests, np.split(state, splits), strict=True)
                if r.session is not None
            ]
            if keep:  # before the answers go: the session's next call may land on another replica
                self.sessions.keep_many(keep)
        return np.split(actions, splits)


def _tag(served: Served) -> str:
    """What a session's state was computed with: the served file and its weights version."""
    return f"{served.source}@{served.version}"


def _once_per_session(requests: list[ActRequest]) -> list[list[ActRequest]]:
    """Requests in groups where no session appears twice, in order: a session's next call waits
    for the group holding its previous one."""
    groups: list[list[ActRequest]] = []
    seen: list[set[str]] = []
    for r in requests:
        i = (
            0
            if r.session is None
            else next((k for k, s in enumerate(seen) if r.session not in s), len(groups))
        )
        if i == len(groups):
            groups.append([])
            seen.append(set())
        groups[i].append(r)
        if r.session is not None:
            seen[i].add(r.session)
    return groups


def finite_json(payload: Any) -> bytes:
    """Strict JSON (a non-finite number would be a bug: refuse to send it)."""
    return json.dumps(payload, allow_nan=False).encode()
