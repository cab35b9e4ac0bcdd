"""Joining or starting Ray, and placing the actors, with every failure a one-line answer.

- A cluster address that does not answer is refused in seconds (Ray would retry for minutes).
- Ctrl-C or SIGTERM while Ray starts leaves nothing running: the processes it had started are
  ended before the interrupt goes on.
- The local Ray that `relay train` starts is a new instance with token authentication on (Ray
  >= 2.59's default; Ray binds its services on every interface, and the token is what keeps
  other hosts out).
- Actors that cannot be placed are reported every REPORT_S with what they need and what the
  cluster has; after `rollout.placement_timeout_s` the run stops (exit 2) naming what is missing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psutil
import ray

from ...contracts.config import RelayConfig
from ...learner.actor import learner_resources
from ...rollout_workers.worker import worker_resources
from ...services.runs.signals import Terminated, raise_pending

REPORT_S = 10.0
CONNECT_TIMEOUT_S = 5.0
STATUS_WAIT_S = 12.0  # the monitor publishes its first status within one 5 s update


class ClusterError(ValueError):
    """The cluster cannot run this config: unreachable, or actors that cannot be placed (exit 2)."""


def check_reachable(address: str) -> None:
    """Refuse in seconds an address whose Ray port does not accept connections.

    `auto` and `local` are Ray's own lookups and are left to it; `host:port` and `ray://host:port`
    are tried with a plain TCP connect.
    """
    if address in ("auto", "local"):
        return
    parsed = urlparse(address if "://" in address else f"ray://{address}")
    try:
        host, port = parsed.hostname, parsed.port
    except ValueError:
        host, port = None, None
    if not host or port is None:
        raise ClusterError(f"--address {address!r}: expected host:port (or ray://host:port, auto)")
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ClusterError(f"cannot reach a Ray cluster at {address} ({reason})") from None


def end_children() -> None:
    """End every process this one started (Ray's GCS, raylet and agents after an interrupted start)."""
    children = psutil.Process().children(recursive=True)
    for p in children:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(children, timeout=3)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=3)


def init_ray(cfg: RelayConfig, address: str | None, actors_per_worker: int = 1) -> bool:
    """Connect to a cluster (--address or RAY_ADDRESS) or start a local one. True if we started it.
    `actors_per_worker`: the backend's actors of rollout.num_cpus_per_worker CPUs per rollout
    worker (a language run's generators beside its reward actors make 2)."""
    # Logical CPUs: a 2-core laptop still runs 2 workers + the learner (they oversubscribe, as
    # processes do).
    needed = (
        actors_per_worker * cfg.rollout.num_workers * worker_resources(cfg)["CPU"]
        + cfg.learner.num_learners * learner_resources(cfg)["CPU"]
        + (cfg.eval.num_cpus if cfg.eval.every_iterations else 0.0)
    )
    return join_or_start_ray(address, needed)


# Task records the GCS of a local Ray keeps (Ray's default: 100,000, ~300 MB measured on a long
# run). relay's hot calls keep none; this bounds what the rest (actor creation, checkpoints) adds.
LOCAL_TASK_EVENTS = 10_000


def local_system_config() -> dict[str, Any]:
    """Ray settings of a local cluster relay starts; RAY_* variables the user set win."""
    if "RAY_task_events_max_num_task_in_gcs" in os.environ:
        return {}
    return {"task_events_max_num_task_in_gcs": LOCAL_TASK_EVENTS}


@contextlib.contextmanager
def _no_code_paths() -> Iterator[None]:
    """ray.init in an empty folder of relay's own.

    ray.init puts the folder it runs in at the front of every worker's sys.path (and a local
    cluster's processes start there): a `torch.py` or `pydantic.py` in the user's working folder
    would then be imported, and run, by every actor. The rollout workers go back to the user's
    folder themselves (`rollout_workers/worker.py`), where it serves only the env they build.
    """
    empty = Path(tempfile.gettempdir()) / f"relay-empty-{os.getuid()}"
    empty.mkdir(mode=0o700, exist_ok=True)
    info = empty.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or any(empty.iterdir()):
        empty = Path(tempfile.mkdtemp(prefix="relay-empty-"))  # taken or not empty: a fresh one
    here = os.getcwd()
    os.chdir(empty)
    try:
        yield
    finally:
        os.chdir(here)


def join_or_start_ray(address: str | None, cpus_needed: float = 1.0) -> bool:
    """Connect to a cluster (`address`, else RAY_ADDRESS) or start a local Ray with at least
    `cpus_needed` logical CPUs. True if this process started it (and must shut it down)."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    # ray.init installs its own SIGTERM handler (sys.exit); relay's clean stop is put back after.
    relay_sigterm = signal.getsignal(signal.SIGTERM)
    try:
        if address:
            check_reachable(address)
            with _no_code_paths():
                ray.init(address=address, logging_level=logging.WARNING)
            raise_pending()
            return False
        # Ray >= 2.59 starts local clusters with token authentication on (unless RAY_AUTH_MODE says
        # otherwise) and warns that it did; relay documents it instead.
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        with _no_code_paths():
            ray.init(
                address="local",  # a new local instance, never one a `ray start` left running
                num_cpus=max(os.cpu_count() or 1, int(cpus_needed + 0.999)),
                include_dashboard=False,
                logging_level=logging.WARNING,
                _system_config=local_system_config(),
            )
        raise_pending()  # a Ctrl-C that landed in one of Ray's at-fork callbacks was dropped there
        return True
    except (KeyboardInterrupt, SystemExit) as err:  # Ctrl-C, or SIGTERM through Ray's handler
        end_children()
        with contextlib.suppress(Exception):
            ray.shutdown()
        if isinstance(err, SystemExit) and err.code == signal.SIGTERM:
            raise Terminated() from None
        raise
    except (ConnectionError, TimeoutError, ray.exceptions.RayError) as err:
        end_children()
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ClusterError(f"cannot join the Ray cluster at {address} ({first[:200]})") from None
    finally:
        if threading.current_thread() is threading.main_thread() and relay_sigterm is not None:
            signal.signal(signal.SIGTERM, relay_sigterm)


def autoscaling(wait_s: float = STATUS_WAIT_S) -> bool:
    """True when an autoscaler that can launch nodes watches this cluster.

    Every Ray cluster runs a monitor that publishes its status in Ray's key-value store (Ray has
    no public query for it); on a local or hand-made cluster that monitor is a read-only one
    whose node types are the nodes themselves ("node_<id>"). Only a configured autoscaler names
    node types of its own (e.g. "cpu_rollout", "npu_learner"). A cluster started seconds ago has
    published nothing yet, or no node: its first status naming a node is awaited up to `wait_s`.
    """
    from ray.experimental import internal_kv

    deadline = time.monotonic() + wait_s
    while True:
        try:
            mapping = node_types(internal_kv._internal_kv_get(b"__autoscaling_status"))
        except Exception:
            return False
        if mapping or time.monotonic() >= deadline:
            return _names_its_own(mapping)
        time.sleep(0.5)


def node_types(raw: bytes | None) -> dict[str, str]:
    """{node id: node type} from the monitor's status blob (JSON), read without trusting its
    shape: {} when there is none or it is not what Ray writes."""
    try:
        mapping = json.loads(raw or b"null")["autoscaler_report"]["node_type_mapping"]
    except (ValueError, TypeError, KeyError):
        return {}
    if not isinstance(mapping, dict):
        return {}
    return {str(k): str(v) for k, v in mapping.items()}


def is_launching_autoscaler(raw: bytes | None) -> bool:
    """Whether the monitor's status blob names node types of its own (see `autoscaling`)."""
    return _names_its_own(node_types(raw))


def _names_its_own(mapping: dict[str, str]) -> bool:
    return any(kind != f"node_{node}" for node, kind in mapping.items())


def check_cluster_device(cfg: RelayConfig) -> None:
    """learner.device=auto resolves from what the cluster has *now*; on an autoscaling cluster
    whose accelerator nodes are not up yet that would be the CPU: refuse rather than guess."""
    if cfg.learner.device != "auto":
        return
    have = ray.cluster_resources()
    if have.get("GPU", 0) < 1 and have.get("NPU", 0) < 1 and autoscaling():
        raise ClusterError(
            "learner.device=auto: this autoscaling cluster has no GPU or NPU now, and nodes it has not "
            "started yet cannot be seen; set learner.device=npu or learner.device=cuda (the autoscaler "
            "then starts one), or learner.device=cpu to learn on a CPU"
        )


def _fmt(resources: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items())) or "nothing"


def _cluster_has() -> str:
    total, free = ray.cluster_resources(), ray.available_resources()
    keys = [k for k in ("CPU", "GPU", "NPU") if k in total] + sorted(
        k for k in total if k not in ("CPU", "GPU", "NPU", "memory", "object_store_memory") and ":" not in k
    )
    return ", ".join(f"{k} {total[k]:g} ({free.get(k, 0.0):g} free)" for k in keys) or "no resources"


def _pending_demand(cfg: RelayConfig, pending: dict[str, int]) -> tuple[str, dict[str, float]]:
    """('2 rollout workers (CPU 1 each), 1 learner (CPU 1, GPU 1)', the summed demand)."""
    per = {
        "learner": learner_resources(cfg),
        "rollout worker": worker_resources(cfg),
        "evaluator": {"CPU": cfg.eval.num_cpus},
    }
    parts: list[str] = []
    total: dict[str, float] = {}
    for kind, count in pending.items():
        if count:
            each = " each" if count > 1 else ""
            parts.append(f"{count} {kind}{'s' if count > 1 else ''} ({_fmt(per[kind])}{each})")
            for k, v in per[kind].items():
                total[k] = total.get(k, 0.0) + v * count
    return ", ".join(parts), total


def wait_until_placed(cfg: RelayConfig, groups: dict[str, list[Any]]) -> None:
    """Block until every actor of `groups` ({"learner": [...], "rollout worker": [...]}) runs.

    Reports what is pending every REPORT_S; after rollout.placement_timeout_s (None: never)
    raises ClusterError naming the missing resources.
    """
    waiting = {a.__ray_ready__.remote(): kind for kind, actors in groups.items() for a in actors}
    start = time.monotonic()
    report_at = start + REPORT_S
    timeout = cfg.rollout.placement_timeout_s
    while waiting:
        ready, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=1.0)
        for ref in ready:
            ray.get(ref)  # an actor whose constructor failed raises here
            waiting.pop(ref)
        if not waiting:
            return
        counts = {kind: list(waiting.values()).count(kind) for kind in groups}
        what, demand = _pending_demand(cfg, counts)
        now = time.monotonic()
        if timeout is not None and now - start >= timeout:
            raise ClusterError(
                f"{what} could not be placed within rollout.placement_timeout_s={timeout:g}: they need "
                f"{_fmt(demand)} and the cluster has {_cluster_has()}; add nodes, ask for less "
                "(rollout.num_workers, rollout.num_cpus_per_worker, learner.device, learner.num_cpus), "
                "or set rollout.placement_timeout_s=null on an autoscaling cluster"
            )
        if now >= report_at:
            report_at = now + REPORT_S
            print(
                f"relay: waiting {now - start:.0f}s to place {what}; the cluster has {_cluster_has()}",
                file=sys.stderr,
                flush=True,
            )
