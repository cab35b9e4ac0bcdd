"""`relay serve`: check everything, start (or join) Ray, run the Serve application, and stop cleanly.

Every check a user can fail runs before Ray starts, so bad input is one line, exit 2, with nothing
started: the policy file is loaded (as data) and cross-checked, the runtime and device exist
here (on a local Ray), the address answers, the port is free. Ctrl-C and SIGTERM delete the
application (its replicas end), stop Serve and the Ray this command started, and exit 130 / 143.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import ray

from ...services.driver.cluster import ClusterError, join_or_start_ray
from ...services.serving.app import APP_NAME, ServeArgs, build, replica_options
from ...services.serving.service import PolicyService


class ServeError(ValueError):
    """`relay serve` cannot start as asked (exit 2)."""


def free_port(host: str, port: int) -> int:
    """`port` if it can be bound on `host` now (0: any free port), else ServeError in one line."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise ServeError(f"--host {host!r}: cannot be resolved ({err.strerror})") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(addr)
        except OSError as err:
            raise ServeError(f"cannot listen on {host}:{port} ({err.strerror})") from None
        return int(sock.getsockname()[1])


def check_model(args: ServeArgs, local: bool) -> dict[str, Any]:
    """Load the policy here once, as each replica will (file, import cross-check, runtime and,
    on a local Ray, device): a bad file or option fails now, in one line. Returns its metadata."""
    path = Path(args.model)
    if args.follow and not path.is_dir():
        raise ServeError(f"{path}: --follow serves a run directory (one with checkpoints/)")
    if not args.follow and not path.is_file():
        raise ServeError(
            f"{path}: no such policy file" + (" (a run directory needs --follow)" if path.is_dir() else "")
        )
    device = args.device if local else "cpu"  # a cluster's replicas may have devices this host lacks
    try:
        return PolicyService(args.model, args.runtime, device, args.follow, args.policy).metadata()
    except FileNotFoundError as err:
        raise ServeError(str(err)) from None


def check_placeable(args: ServeArgs) -> None:
    """Replicas that ask for a device the cluster does not have would wait forever: refuse."""
    options = replica_options(args)
    need = {"GPU": options.get("num_gpus", 0), **options.get("resources", {})}
    have = ray.cluster_resources()
    missing = [f"{k} {v * args.replicas:g}" for k, v in need.items() if v and have.get(k, 0) < v]
    if missing:
        raise ClusterError(
            f"--device {args.device}: each replica needs {', '.join(missing)} and the cluster has "
            f"{have.get('GPU', 0):g} GPU, {have.get('NPU', 0):g} NPU"
        )


def serve_policy(args: ServeArgs, host: str, port: int, address: str | None) -> int:
    """Serve until Ctrl-C / SIGTERM (raised as KeyboardInterrupt by the caller's handler)."""
    from ray import serve

    port = free_port(host, port)
    local = not (address or _ray_address_env())
    if local:  # replicas may start in another working directory
        args = args.model_copy(update={"model": str(Path(args.model).resolve())})
    meta = check_model(args, local)
    started = join_or_start_ray(address, cpus_needed=args.replicas + 1)
    try:
        check_placeable(args)
        app = build(args.model_dump())
        quiet = {"log_level": "WARNING", "enable_access_log": False}  # no line per request
        serve.start(
            proxy_location="HeadOnly", http_options={"host": host, "port": port}, logging_config=quiet
        )
        serve.run(app, name=APP_NAME, route_prefix="/", logging_config=quiet)
        what = f"{meta['source']} ({meta['runtime']}, {args.replicas} replica{'s' * (args.replicas > 1)})"
        print(f"relay: serving {what} at http://{host}:{port}/act", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
    finally:
        _stop(started)


def _ray_address_env() -> str | None:
    return os.environ.get("RAY_ADDRESS") or None


def _stop(started: bool) -> None:
    """Delete the application (its replicas drain and end), then end the Ray this command started
    (Serve's controller and proxy with it: `serve.shutdown()` waits on them for 30 s and more)."""
    from ray import serve

    with contextlib.suppress(Exception):
        if ray.is_initialized():
            serve.delete(APP_NAME)
    if started:
        ray.shutdown()
