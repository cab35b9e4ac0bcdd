"""`relay train` and `relay resume` from a checked config to an exit code.

Order matters for trust: every check first (`preflight`), nothing created until the config is
runnable; the run directory is claimed (never a run's directory) only once Ray is up; a resumed
run's config.yaml is replaced only once the resume has started; SIGTERM stops like Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from ...contracts.checkpoint import Checkpoint
from ...contracts.config import RelayConfig, load_config, unconfirmed_code
from ...contracts.spaces import EnvSpec
from ...rollout_workers.user_code import allow_user_code
from ...services.dashboard.server import Dashboard
from ...services.driver.cluster import check_cluster_device, init_ray
from ...services.driver.families import backend_class, check_resumable, make_backend
from ...services.driver.loop import TrainingLoop
from ...services.driver.preflight import PreflightError, learner_memory, preflight
from ...services.runs.checkpoints import ResumeError, load_newest_valid
from ...services.runs.run_dir import RunDir
from ...services.runs.signals import STOP_CODES, sigterm_raises

EXIT_OK = 0


class NoCheckpointError(ValueError):
    """`relay resume` of a directory that is no run or has no usable checkpoint (exit 2)."""


class DashboardError(ValueError):
    """The dashboard cannot listen where asked (exit 2)."""


def start_dashboard(root: Path, host: str, port: int) -> Dashboard:
    try:
        board = Dashboard(root, host, port).start()
    except OSError as err:
        raise DashboardError(f"dashboard cannot listen on {host}:{port} ({err.strerror})") from None
    print(f"relay: dashboard at {board.url}", file=sys.stderr, flush=True)
    return board


def train(
    cfg: RelayConfig,
    run_dir: str | None,
    address: str | None,
    t_start: float,
    dashboard: tuple[str, int] | None = None,
) -> int:
    """`relay train`: a new run in a new (or empty) directory."""
    allow_user_code(cfg, os.getcwd())  # the config is the user's: its env may be theirs
    env = preflight(cfg, address)
    target = RunDir.target(cfg, run_dir)
    RunDir.check_new(target)
    with sigterm_raises(), _ray_session(cfg, address):
        return _train(
            cfg, env, target, lambda: RunDir.claim(target, cfg), t_start, dashboard, resume_from=None
        )


def resume(run_path: str, overrides: list[str], address: str | None, t_start: float) -> int:
    """`relay resume RUN`: the run's config plus `overrides`, continued from its newest checkpoint.

    Everything is checked before anything changes; config.yaml is rewritten only once the resume
    has started, so a refused `--set` leaves the run exactly as it was.
    """
    run = RunDir(Path(run_path))
    if not run.config_path.is_file():
        raise NoCheckpointError(f"{run.root} is not a run directory (no config.yaml)")
    run.lock()  # before anything is read: a running train or resume keeps its run to itself
    try:
        cfg = load_config(run.config_path, overrides)
        confirm_env_code(run.root, cfg, overrides)
        allow_user_code(cfg, os.getcwd())
        env = preflight(cfg, address)
        # A malformed checkpoint is skipped for the previous one; one the config cannot continue
        # (another model, algorithm or env) is the config's mistake and refused in one line.
        found = load_newest_valid(run.checkpoints, lambda ckpt, name: check_resumable(cfg, env, ckpt, name))
        if found is None:
            raise NoCheckpointError(f"no valid checkpoint in {run.checkpoints}")
        with sigterm_raises(), _ray_session(cfg, address):
            run.clean_stale_tmp()
            print(
                f"relay: resuming from {found[0].name} (iteration {found[1].counters.iteration}, "
                f"{found[1].counters.env_steps} env steps)",
                file=sys.stderr,
                flush=True,
            )
            return _train(cfg, env, run.root, lambda: run, t_start, None, resume_from=found[1])
    finally:
        run.unlock()


def confirm_env_code(run: Path, cfg: RelayConfig, overrides: list[str]) -> None:
    """A `module:factory` env id and a `module:fn` group mapping import and call code. Read from a
    run directory they are data, so each runs only when the user names it on the command line too."""
    named = {item.split("=", 1)[0].strip() for item in overrides}
    refusal = unconfirmed_code(cfg, named, f"{run}/config.yaml", f"relay resume {run}")
    if refusal:
        raise ResumeError(refusal)


@contextlib.contextmanager
def _ray_session(cfg: RelayConfig, address: str | None) -> Any:
    """Ray for the run (none in local mode); a Ray this command started is shut down after it."""
    per_worker = backend_class(cfg).actors_per_worker(cfg)
    started = cfg.rollout.num_workers > 0 and init_ray(cfg, address, per_worker)
    try:
        if cfg.rollout.num_workers > 0 and not started and ray.is_initialized():
            check_cluster_device(cfg)
        yield
    finally:
        if started:
            ray.shutdown()


def _train(
    cfg: RelayConfig,
    env: EnvSpec | None,
    root: Path,
    get_run: Callable[[], RunDir],
    t_start: float,
    dashboard: tuple[str, int] | None,
    resume_from: Checkpoint | None,
) -> int:
    """Listen (the dashboard's port is checked first), place the actors, then take the run
    directory (a run that cannot start leaves nothing behind), train, and tear down. Ctrl-C or
    SIGTERM before the loop runs propagates."""
    backend, board, run = None, None, None
    try:
        board = start_dashboard(root, *dashboard) if dashboard else None
        backend = make_backend(cfg, env)
        problem = backend.storage_problem(root)
        if problem:
            raise PreflightError(problem)
        run = get_run()
        loop = TrainingLoop(cfg, run, backend)
        if resume_from is not None:
            loop.restore(resume_from, counters=True)
            run.write_config(cfg)  # the resume has started: its merged config is the run's now
        info = backend.describe()
        print(
            f"relay: run {run.root} | {info.get('mode')} | device {info.get('device')} | {info.get('fleet')}",
            file=sys.stderr,
            flush=True,
        )
        memory = learner_memory(cfg)
        if memory is not None:
            print(f"relay: learner memory (estimate): {memory}", file=sys.stderr, flush=True)
        failed = True
        try:
            reason = loop.run_until_stop(startup_s=time.perf_counter() - t_start)
            failed = False
        finally:
            loop.close_tracking(failed)
        return STOP_CODES.get(reason, EXIT_OK)
    except Exception:
        if run is not None:
            run.write_error_log(traceback.format_exc())
        raise
    finally:
        if board is not None:
            board.stop()
        if backend is not None:
            backend.close()
        if run is not None:
            run.unlock()
