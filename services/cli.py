"""The `relay` command line: train, resume, validate.

Bad input gets one line on stderr and exit 2; a failure gets one line and exit 1 (the traceback
goes to the run directory's error.log, not the terminal).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from services.config import ConfigError, RelayConfig, dump_config, load_config
from services.resume import NoCheckpointError

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2


class InputError(Exception):
    """Bad input from the user (exit 2)."""


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML config file")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config leaf, e.g. --set learner.lr=1e-3 (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relay", description="Ray actor-learner RL training service")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train until a stop criterion")
    _add_config_args(train)
    train.add_argument("--run-dir", help="run directory (default: <metrics.runs_dir>/<run_name>)")
    train.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)")
    resume = sub.add_parser("resume", help="continue a run from its newest valid checkpoint")
    resume.add_argument("run_dir", help="run directory holding config.yaml and checkpoints/")
    resume.add_argument("--address", help="Ray cluster address")
    resume.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config leaf (e.g. a larger stop.env_steps)",
    )
    validate = sub.add_parser("validate", help="check a config and print the resolved one")
    _add_config_args(validate)
    return parser


def _cmd_validate(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    sys.stdout.write(dump_config(cfg))
    return EXIT_OK


def _check_runnable(cfg: RelayConfig) -> None:
    """Input checks that need more than the schema: the env exists, the device spec parses."""
    from learner.device import DeviceError, _parse_spec
    from rollout_workers.envs import EnvSpecError, check_env_id

    try:
        check_env_id(cfg.env.id)
        _parse_spec(cfg.learner.device)
    except (EnvSpecError, DeviceError) as err:
        raise InputError(str(err)) from None


def run_training(
    cfg: RelayConfig, run_dir: str | None, address: str | None, t_start: float, resume: bool = False
) -> int:
    """Build everything, train, tear down. Returns an exit code."""
    from services.backends import init_ray, make_backend
    from services.resume import restore
    from services.run_dir import RunDir
    from services.train import TrainingLoop

    _check_runnable(cfg)
    run = RunDir.create(cfg, run_dir)
    started_ray = cfg.rollout.num_workers > 0 and init_ray(cfg, address)
    backend = None
    try:
        backend = make_backend(cfg)
        loop = TrainingLoop(cfg, run, backend)
        if resume:
            restore(loop)
        info = backend.describe()
        print(
            f"relay: run {run.root} | {info.get('mode')} | device {info.get('device')} | "
            f"workers {info.get('workers')}",
            file=sys.stderr,
            flush=True,
        )
        reason = loop.run_until_stop(startup_s=time.perf_counter() - t_start)
        return EXIT_OK if reason != "interrupted" else 130
    except Exception:
        (run.root / "error.log").write_text(traceback.format_exc())
        raise
    finally:
        if backend is not None:
            backend.close()
        if started_ray:
            import ray

            ray.shutdown()


def _cmd_train(args: argparse.Namespace, t_start: float) -> int:
    cfg = load_config(args.config, args.overrides)
    return run_training(cfg, args.run_dir, args.address, t_start)


def _cmd_resume(args: argparse.Namespace, t_start: float) -> int:
    run = Path(args.run_dir)
    if not (run / "config.yaml").is_file():
        raise InputError(f"{run} is not a run directory (no config.yaml)")
    cfg = load_config(run / "config.yaml", args.overrides)
    return run_training(cfg, str(run), args.address, t_start, resume=True)


def main(argv: list[str] | None = None) -> int:
    t_start = time.perf_counter()
    args = build_parser().parse_args(argv)
    handlers: dict[str, Any] = {
        "validate": lambda: _cmd_validate(args),
        "train": lambda: _cmd_train(args, t_start),
        "resume": lambda: _cmd_resume(args, t_start),
    }
    try:
        return handlers[args.command]()
    except (ConfigError, InputError, NoCheckpointError) as err:
        print(f"relay {args.command}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as err:
        print(f"relay {args.command}: failed: {type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
