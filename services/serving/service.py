"""The policy service behind `relay serve`, without Ray: load a policy file as data, check requests,
answer batches, follow a run's newest checkpoint. `services/serving/app.py` puts it behind Ray
Serve's HTTP proxy and `@serve.batch`.

A request is `{"obs": [[...], ...], "deterministic": true, "seed": 7}`: one observation or a
batch of them; `deterministic` (default true) gives greedy actions, false samples with noise drawn
on the CPU from `seed` (a random one when absent). A sampled request with a seed is answered by a
forward pass of its own, so its bits do not depend on what else shared the batch (matrix kernels
round differently at different batch sizes): the same request, the same bits, under any load.
Whatever a client
sends, the answer is JSON: 400 for a body that is not JSON, has no `obs`, the wrong shape, or NaN
or inf anywhere; 413 past the size limit.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from learner.device import resolve_device
from policy.actor_critic import draw_noise
from services.driver.checkpoints import list_checkpoints, load_checkpoint
from services.serving.runtimes import RUNTIMES
from services.tools.handle import PolicyHandle, PolicyLoadError
from services.tools.load import load_policy
from services.tools.verify import fingerprint

MAX_ROWS = 4096  # observations in one request


class BadRequest(ValueError):
    """A request the service refuses: an HTTP status and a one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class ActRequest:
    """One client's observations [k, *obs_shape], greedy or sampled, and its seed."""

    obs: np.ndarray
    deterministic: bool = True
    seed: int = field(default_factory=lambda: secrets.randbelow(2**63))
    seeded: bool = False  # the client chose the seed: it wants these exact bits again

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


def _observations(raw: Any, handle: PolicyHandle) -> np.ndarray:
    """[k, *obs_shape] float64, finite, in range for an image policy."""
    try:
        obs = np.asarray(raw, dtype=np.float64)
    except OverflowError:  # an integer past float64's range (JSON integers have no bound)
        raise BadRequest(400, '"obs" holds a number too large for float64') from None
    except (TypeError, ValueError):
        raise BadRequest(400, '"obs" is not an array of numbers (ragged rows?)') from None
    shape = handle.obs_shape
    if obs.shape == shape:
        obs = obs[None]
    if obs.shape[1:] != shape or not 1 <= obs.shape[0] <= MAX_ROWS:
        expected = f"{list(shape)} or [k, {', '.join(map(str, shape))}], k <= {MAX_ROWS}"
        raise BadRequest(400, f'"obs" has shape {list(obs.shape)}; expected {expected}')
    if not np.isfinite(obs).all():
        raise BadRequest(400, '"obs" holds NaN or inf')
    if handle.env.storage_dtype == np.uint8 and (obs.min() < 0 or obs.max() > 255 or (obs % 1).any()):
        raise BadRequest(400, '"obs" of an image policy are whole numbers in [0, 255]')
    return obs


def parse_act(body: bytes, handle: PolicyHandle) -> ActRequest:
    """The request in `body`, checked against the policy's observation shape and dtype."""
    data = _read_json(body)
    deterministic = data.get("deterministic", True)
    if not isinstance(deterministic, bool):
        raise BadRequest(400, '"deterministic" is true or false')
    request = ActRequest(_observations(data["obs"], handle), deterministic)
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
    if (now.env.obs_shape, now.env.storage_dtype, now.env.action) != (
        new.env.obs_shape,
        new.env.storage_dtype,
        new.env.action,
    ):
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
        self, model: str, runtime: str = "torch", device: str = "auto", follow: bool = False
    ) -> None:
        self.path = Path(model)
        self.runtime_name, self.device, self.follow = runtime, device, follow
        self.served = self._load_newest() if follow else self._load(self.path)
        self._refused = ""  # the newest checkpoint, when it did not fit what is served

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
        handle = load_policy(path)
        version = 0
        if handle.config is not None and path.suffix == ".pt":  # a relay checkpoint
            version = int(load_checkpoint(path).learner.get("version", 0))
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
            "weights_version": served.version,
            "obs_shape": list(env.obs_shape),
            "obs_dtype": str(env.storage_dtype),
            "action": env.action.to_dict(),
            "fingerprint": served.fingerprint,
            "runtime": served.runtime.name,
            "device": served.runtime.device,
            "follow": self.follow,
        }

    def act(self, requests: list[ActRequest]) -> list[dict[str, Any]]:
        """One batch of requests: one forward pass for all of them but the seeded sampled ones,
        which get one each. An answer per request, in order."""
        served = self.served  # one version answers the whole batch
        shared = [r for r in requests if not r.alone]
        groups = [[r] for r in requests if r.alone] + ([shared] if shared else [])
        answers: dict[int, dict[str, Any]] = {}
        for group in groups:
            for r, actions in zip(group, self._forward(served, group), strict=True):
                answers[id(r)] = {
                    "actions": actions.tolist(),
                    "weights_version": served.version,
                    "batch_rows": sum(len(g.obs) for g in group),
                    "batch_requests": len(group),
                }
        return [answers[id(r)] for r in requests]

    def _forward(self, served: Served, requests: list[ActRequest]) -> list[np.ndarray]:
        obs = np.concatenate([r.obs for r in requests])
        deterministic = np.concatenate([np.full(len(r.obs), r.deterministic) for r in requests])
        noise = np.concatenate(
            [
                draw_noise(
                    served.handle.model.action, len(r.obs), torch.Generator().manual_seed(r.seed)
                ).numpy()
                for r in requests
            ]
        )
        actions = served.runtime.act(obs, deterministic, noise)
        return np.split(actions, np.cumsum([len(r.obs) for r in requests])[:-1])


def finite_json(payload: Any) -> bytes:
    """Strict JSON (a non-finite number would be a bug: refuse to send it)."""
    return json.dumps(payload, allow_nan=False).encode()
