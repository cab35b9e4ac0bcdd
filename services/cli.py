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

from learner.device import DeviceError
from services.config import ConfigError, RelayConfig, dump_config, load_config
from services.policy_io import PolicyLoadError
from services.resume import NoCheckpointError

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2


class InputError(Exception):
    """Bad input from the user (exit 2)."""


def _add_set_arg(p: argparse.ArgumentParser, example: str) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a config leaf, e.g. --set {example} (repeatable)",
    )


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML config file")
    _add_set_arg(p, "learner.lr=1e-3")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relay", description="Ray actor-learner RL training service")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train until a stop criterion")
    _add_config_args(train)
    train.add_argument("--run-dir", help="run directory (default: <metrics.runs_dir>/<run_name>)")
    train.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)")
    train.add_argument("--dashboard", action="store_true", help="serve the metrics dashboard beside the run")
    train.add_argument("--dashboard-host", default="127.0.0.1", help="dashboard bind address")
    train.add_argument("--dashboard-port", type=int, default=8000, help="dashboard port (0: any free one)")
    resume = sub.add_parser("resume", help="continue a run from its newest valid checkpoint")
    resume.add_argument("run_dir", help="run directory holding config.yaml and checkpoints/")
    resume.add_argument("--address", help="Ray cluster address")
    _add_set_arg(resume, "stop.env_steps=200000")
    validate = sub.add_parser("validate", help="check a config and print the resolved one")
    _add_config_args(validate)
    dash = sub.add_parser(
        "dashboard", help="serve the learner metrics dashboard for a run or a folder of runs"
    )
    dash.add_argument("path", help="a run directory or a folder of run directories")
    dash.add_argument("--host", default="127.0.0.1", help="bind address (another one must be asked for)")
    dash.add_argument("--port", type=int, default=8000)
    export = sub.add_parser("export", help="export a checkpoint's policy (checked against onnxruntime)")
    export.add_argument("checkpoint", help="a relay checkpoint (runs/<name>/checkpoints/ckpt-N.pt)")
    export.add_argument("--format", choices=["onnx"], default="onnx")
    export.add_argument("--out", help="output file (default: the checkpoint's name with .onnx)")
    verify = sub.add_parser("verify", help="precision table, fingerprint and latency of a policy")
    verify.add_argument("model", help="a relay checkpoint, an exported .onnx, or an ML-Agents .onnx/.pt")
    verify.add_argument("--dtypes", default="float32,float16,bfloat16")
    verify.add_argument("--device", default="auto", help="auto, cpu, cuda[:i], npu[:i]")
    verify.add_argument("--batch", type=int, default=256, help="the batch-B of the latency table")
    verify.add_argument("--min-cosine", type=float, default=0.999)
    verify.add_argument("--max-abs", type=float, default=0.01)
    verify.add_argument("--seed", type=int, default=0)
    return parser


def _cmd_validate(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    sys.stdout.write(dump_config(cfg))
    return EXIT_OK


def _check_runnable(cfg: RelayConfig) -> None:
    """Input checks that need more than the schema: the env exists, the device spec parses, a
    token policy gets token observations."""
    from learner.device import DeviceError, _parse_spec
    from rollout_workers.envs import EnvSpecError, check_env_id

    try:
        check_env_id(cfg.env.id)
        _parse_spec(cfg.learner.device)
        if cfg.model.kind == "transformer":
            _check_token_env(cfg)
    except (EnvSpecError, DeviceError) as err:
        raise InputError(str(err)) from None


def _check_token_env(cfg: RelayConfig) -> None:
    """The env gives token ids the transformer's vocabulary (the one build_policy uses) covers."""
    from learner.learner import token_vocab
    from rollout_workers.envs import action_spec, check_token_observations, env_spaces

    ec = cfg.env
    obs, act = env_spaces(ec.id, ec.max_episode_steps, ec.kwargs)
    try:
        vocab = token_vocab(cfg, action_spec(act))
    except ValueError as err:  # continuous actions and no vocab_size
        raise InputError(str(err)) from None
    check_token_observations(ec.id, obs, vocab)


def run_training(
    cfg: RelayConfig,
    run_dir: str | None,
    address: str | None,
    t_start: float,
    resume: bool = False,
    dashboard: tuple[str, int] | None = None,
) -> int:
    """Build everything, train, tear down. Returns an exit code."""
    from services.backends import init_ray, make_backend
    from services.resume import restore
    from services.run_dir import RunDir
    from services.train import TrainingLoop

    _check_runnable(cfg)
    run = RunDir.create(cfg, run_dir)
    board = _start_dashboard(run.root, dashboard) if dashboard else None
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
        if board is not None:
            board.stop()
        if backend is not None:
            backend.close()
        if started_ray:
            import ray

            ray.shutdown()


def _start_dashboard(root: Path, where: tuple[str, int]) -> Any:
    from services.dashboard import Dashboard

    try:
        board = Dashboard(root, *where).start()
    except OSError as err:
        raise InputError(f"dashboard cannot listen on {where[0]}:{where[1]} ({err.strerror})") from None
    print(f"relay: dashboard at {board.url}", file=sys.stderr, flush=True)
    return board


def _cmd_train(args: argparse.Namespace, t_start: float) -> int:
    cfg = load_config(args.config, args.overrides)
    board = (args.dashboard_host, args.dashboard_port) if args.dashboard else None
    return run_training(cfg, args.run_dir, args.address, t_start, dashboard=board)


def _cmd_dashboard(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not path.is_dir():
        raise InputError(f"{path}: no such folder")
    board = _start_dashboard(path, (args.host, args.port))
    try:
        board.wait()  # serve until Ctrl-C
    except KeyboardInterrupt:
        board.stop()
    return EXIT_OK


def _cmd_resume(args: argparse.Namespace, t_start: float) -> int:
    run = Path(args.run_dir)
    if not (run / "config.yaml").is_file():
        raise InputError(f"{run} is not a run directory (no config.yaml)")
    cfg = load_config(run / "config.yaml", args.overrides)
    return run_training(cfg, str(run), args.address, t_start, resume=True)


def _cmd_export(args: argparse.Namespace) -> int:
    from services.export import export_onnx
    from services.policy_io import load_relay_checkpoint

    ckpt = Path(args.checkpoint)
    if not ckpt.is_file():
        raise InputError(f"{ckpt}: no such checkpoint")
    out = Path(args.out) if args.out else ckpt.with_suffix(".onnx")
    report = export_onnx(load_relay_checkpoint(ckpt), out)
    print(
        f"wrote {report.path} (checked on {report.checked} observations against onnxruntime: "
        f"max abs error {report.max_abs_error:.2e})"
    )
    return EXIT_OK


def _cmd_verify(args: argparse.Namespace) -> int:
    from services.policy_io import load_policy
    from services.verify import DTYPES, VerifyOptions, run_verify

    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown or not dtypes:
        raise InputError(f"--dtypes {args.dtypes!r}: choose from {', '.join(DTYPES)}")
    opts = VerifyOptions(dtypes, args.device, args.batch, args.min_cosine, args.max_abs, args.seed)
    text, passed = run_verify(load_policy(args.model), opts)
    print(text)
    return EXIT_OK if passed else EXIT_FAILURE


def main(argv: list[str] | None = None) -> int:
    t_start = time.perf_counter()
    args = build_parser().parse_args(argv)
    handlers: dict[str, Any] = {
        "validate": lambda: _cmd_validate(args),
        "train": lambda: _cmd_train(args, t_start),
        "resume": lambda: _cmd_resume(args, t_start),
        "export": lambda: _cmd_export(args),
        "dashboard": lambda: _cmd_dashboard(args),
        "verify": lambda: _cmd_verify(args),
    }
    try:
        return handlers[args.command]()
    except (ConfigError, InputError, NoCheckpointError, PolicyLoadError, DeviceError) as err:
        print(f"relay {args.command}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as err:
        print(f"relay {args.command}: failed: {type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
