"""The Ray Serve application: `PolicyDeployment` (replicas of the policy service, requests batched
by `@serve.batch`) behind Serve's HTTP proxy.

    POST /act        {"obs": [[...], ...], "deterministic": true, "seed": 7} -> {"actions": [...], ...}
    GET  /healthz    200 once the replica answers
    GET  /metadata   observation shape, action spec, source file, fingerprint, runtime, device

`build` is the application builder `serve run` and `serve deploy` call with a config's `args`
(deploy/serve.yaml); `relay serve` builds the same application. With several replicas it holds a
`SessionDeployment` too: one store of a recurrent policy's sessions that every replica starts and
keeps them in, so a client's calls carry its state whichever replica answers them. Every answer
names the replica that gave it (`"replica"`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import ray
from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from ray.serve.deployment import Application
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import Response

from ...contracts.spaces import POLICY_NAME
from ...learner.device import accelerator_resources, ray_options
from ...rollout_workers.user_code import one_line
from ...services.serving.service import ActRequest, BadRequest, PolicyService, finite_json, parse_act
from ...services.serving.sessions import Keep, SessionStore, Start, Started

log = logging.getLogger(__name__)
APP_NAME = "relay"
FOLLOW_POLL_S = 0.5


class ServeArgs(BaseModel):
    """`relay serve`'s options, and the `args` of a Serve config (deploy/serve.yaml)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str = Field(
        description="A relay checkpoint, a relay ONNX export, an ML-Agents .onnx/.pt, "
        "or (with follow) a run directory"
    )
    follow: bool = Field(
        False, description="Serve the newest checkpoint of a run directory, swapping in newer ones"
    )
    runtime: str = Field("torch", pattern="^(torch|onnxruntime)$", description="torch or onnxruntime")
    device: str = Field("auto", max_length=16, description="auto, cpu, cuda[:i] or npu[:i]")
    replicas: int = Field(1, ge=1, le=1024, description="Replicas of the deployment")
    max_batch_size: int = Field(32, ge=1, le=4096, description="Requests @serve.batch puts in one batch")
    batch_wait_ms: float = Field(2.0, ge=0, le=10_000, description="How long a batch waits to fill")
    max_body_bytes: int = Field(1 << 20, ge=256, le=1 << 30, description="Larger request bodies get 413")
    policy: str | None = Field(
        None,
        pattern=POLICY_NAME.pattern,
        description="The policy group to serve (checkpoints of policy groups)",
    )


def _json(status: int, payload: Any) -> Response:
    return Response(finite_json(payload), status_code=status, media_type="application/json")


async def _body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) past `limit` bytes whether or not it declares its length."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(413, f"the body is larger than {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(413, f"the body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


# A stopping replica finishes what it holds (batches are milliseconds), then goes.
@serve.deployment(
    name="relay-policy",
    max_ongoing_requests=256,
    graceful_shutdown_timeout_s=5,
    graceful_shutdown_wait_loop_s=0.5,
)
class PolicyDeployment:
    """A replica: the policy service, batching and, with follow, a watcher swapping weights in;
    `sessions`: the store its replicas share (several replicas), else one of its own."""

    def __init__(self, args: dict[str, Any], sessions: DeploymentHandle | None = None) -> None:
        self.args = ServeArgs.model_validate(args)
        self.service = PolicyService(
            self.args.model,
            self.args.runtime,
            self.args.device,
            self.args.follow,
            self.args.policy,
            sessions=None if sessions is None else SharedSessions(sessions),
        )
        self.replica = serve.get_replica_context().replica_id.unique_id
        # @serve.batch's own setters (added by the decorator, unknown to type checkers).
        self.act_batch.set_max_batch_size(self.args.max_batch_size)  # type: ignore[attr-defined]
        self.act_batch.set_batch_wait_timeout_s(self.args.batch_wait_ms / 1000)  # type: ignore[attr-defined]
        if self.args.follow:
            threading.Thread(target=self._follow, name="relay-follow", daemon=True).start()

    def _follow(self) -> None:
        """Swap in each newer checkpoint as it lands (the swap is one reference assignment)."""
        last_error = ""
        while True:
            time.sleep(FOLLOW_POLL_S)
            try:
                if self.service.refresh():
                    log.info("now serving %s", self.service.served.source)
                last_error = ""
            except Exception as err:  # pruned while read, a torn copy: the next poll retries
                if str(err) != last_error:  # once per distinct failure, not every poll
                    log.warning("could not load the newest checkpoint: %s", err)
                last_error = str(err)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.002)
    async def act_batch(self, requests: list[ActRequest]) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.service.act, requests)

    async def __call__(self, request: Request) -> Response:
        path = request.url.path.rstrip("/").rsplit("/", 1)[-1]
        try:
            if request.method == "GET" and path == "healthz":
                return _json(200, {"status": "ok", "weights_version": self.service.served.version})
            if request.method == "GET" and path == "metadata":
                return _json(200, self.service.metadata())
            if request.method == "POST" and path == "act":
                act = parse_act(await _body(request, self.args.max_body_bytes), self.service.handle)
                answer = dict(await self.act_batch(act))
                return _json(answer.pop("_status", 200), {**answer, "replica": self.replica})
            return _json(
                404,
                {"error": f"no {request.method} {request.url.path}: POST /act, GET /healthz, GET /metadata"},
            )
        except BadRequest as err:
            return _json(err.status, {"error": str(err)})
        except Exception as err:  # a failure of the replica, said as such: never a bare 500
            why = one_line(err)
            log.warning("request failed: %s", why)
            return _json(503, {"error": f"the replica could not answer ({why})"})


@serve.deployment(name="relay-sessions", num_replicas=1, ray_actor_options={"num_cpus": 0})
class SessionDeployment:
    """The one session store the policy replicas share (a dict in one actor: a call is a
    dictionary lookup, so one replica of it serves many policy replicas)."""

    def __init__(self) -> None:
        self.store = SessionStore()

    def start_many(self, calls: list[Start]) -> list[Started]:
        return self.store.start_many(calls)

    def keep_many(self, states: list[Keep]) -> None:
        self.store.keep_many(states)


class SharedSessions:
    """The shared store seen from a policy replica: blocking calls through its handle. The service
    calls them from `act_batch`'s worker thread, never from the replica's event loop."""

    def __init__(self, handle: DeploymentHandle) -> None:
        self.handle = handle

    def start_many(self, calls: list[Start]) -> list[Started]:
        result: list[Started] = self.handle.start_many.remote(calls).result()
        return result

    def keep_many(self, states: list[Keep]) -> None:
        self.handle.keep_many.remote(states).result()


def replica_options(args: ServeArgs) -> dict[str, Any]:
    """Ray actor options of a replica: a CPU, and the device it serves on (a GPU for cuda, the
    NPU resource for npu; auto asks for what the cluster has)."""
    have = ray.cluster_resources() if ray.is_initialized() else {}
    return ray_options({"CPU": 1.0, **accelerator_resources(args.device, have)})


def build(args: dict[str, Any]) -> Application:
    """The application for `args` (ServeArgs' fields): what `serve run`/`serve deploy` import."""
    checked = ServeArgs.model_validate(args)
    deployment: Any = PolicyDeployment  # @serve.deployment made it a Deployment
    store: Any = SessionDeployment
    sessions = store.bind() if checked.replicas > 1 else None
    return deployment.options(num_replicas=checked.replicas, ray_actor_options=replica_options(checked)).bind(
        checked.model_dump(), sessions
    )
