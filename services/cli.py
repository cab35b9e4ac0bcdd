"""The `relay` command line: train, resume, validate, dashboard, export, verify, serve, eval, sweep.

Bad input gets one line on stderr and exit 2, with nothing created; a failure gets one line and
exit 1 (the traceback goes to the run directory's error.log, not the terminal); Ctrl-C exits 130,
SIGTERM 143 and SIGHUP 129, after a clean stop.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from ..contracts.checkpoint import Checkpoint, CheckpointError
from ..contracts.config import (
    ENV_FAMILY,
    LANGUAGE_FAMILY,
    PREFERENCE_FAMILY,
    ConfigError,
    config_help,
    dump_config,
    load_config,
)
from ..contracts.spaces import POLICY_NAME
from ..learner.device import DeviceError, check_device
from ..rollout_workers.envs import allow_env_module
from ..rollout_workers.user_code import allow_user_code
from ..rollout_workers.video import VideoError
from ..services.driver import run as driver
from ..services.driver.cluster import ClusterError
from ..services.driver.families import FAMILIES
from ..services.driver.preflight import PreflightError, choices, learner_memory, learner_precision, preflight
from ..services.runs.checkpoints import ResumeError, load_checkpoint
from ..services.runs.config_sections import entry_sections
from ..services.runs.files import OutputError, check_output
from ..services.runs.run_dir import RunDirError
from ..services.runs.signals import STOP_CODES, exit_code, sigterm_raises, stop_reason
from ..services.sweep.params import SweepError, parse_cli_param
from ..services.tools.evaluate import (
    MAX_EPISODES,
    EvalOptions,
    describe,
    evaluate,
    policy_file,
    save_video,
)
from ..services.tools.evaluate_lm import LanguageEvalError, evaluate_language
from ..services.tools.evaluate_rm import PairEvalError, evaluate_pairs
from ..services.tools.export import export_onnx
from ..services.tools.export_hf import export_hf
from ..services.tools.handle import PolicyLoadError
from ..services.tools.load import NamedEnv, load_policy
from ..services.tools.verify import DTYPES, VerifyOptions, run_verify

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2
BAD_INPUT = (
    ConfigError,
    PreflightError,
    DeviceError,
    RunDirError,
    ClusterError,
    ResumeError,
    CheckpointError,
    PolicyLoadError,
    driver.NoCheckpointError,
    driver.DashboardError,
    OutputError,
    VideoError,
    SweepError,
    LanguageEvalError,
    PairEvalError,
)


class InputError(ValueError):
    """Bad input from the user (exit 2)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage text is what --help is for)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see --help)", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def port_number(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0-65535; 0 picks a free one)")
    return port


def _add_set_arg(p: argparse.ArgumentParser, example: str) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a config leaf, e.g. --set {example} (repeatable)",
    )


def _add_address_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)")


def _add_best_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--best",
        action="store_true",
        help="the path is a run directory: use its checkpoints/best.pt (checkpoint.keep_best)",
    )


def _add_policy_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--policy",
        metavar="NAME",
        help="the policy group to use, where the run trained policy groups (multi_agent.policies)",
    )


def _policy(args: argparse.Namespace) -> str | None:
    """--policy, checked: a group's name (InputError otherwise)."""
    name = getattr(args, "policy", None)
    if name is not None and not POLICY_NAME.match(name):
        raise InputError(f"--policy {name[:40]!r}: not a policy group's name")
    return name


def _best(path: str, best: bool) -> str:
    """The path itself, or with --best the run directory's best.pt."""
    return str(policy_file(Path(path), best=True)) if best else path


def _add_env_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--env",
        metavar="ENV_ID",
        help=f"also {what} observations recorded in this env (built only because you name it here, "
        "with only the --env-kwargs you type: nothing in the file is ever used to build an env)",
    )
    _add_env_kwargs_arg(p)


def _add_env_kwargs_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--env-kwargs",
        metavar="JSON",
        help="keyword arguments for --env's constructor, a JSON object: '{\"continuous\": false}'",
    )


MAX_ENV_KWARGS_CHARS = 10_000


def _named_env(args: argparse.Namespace) -> NamedEnv | None:
    """--env and --env-kwargs, checked (InputError otherwise); a `module:factory` env's module
    may come from the working folder only because the user named it here."""
    text = args.env_kwargs
    if args.env is None:
        if text is not None:
            raise InputError("--env-kwargs goes with --env ENV_ID")
        return None
    kwargs: Any = {}
    if text is not None:
        if len(text) > MAX_ENV_KWARGS_CHARS:
            raise InputError(f"--env-kwargs: over {MAX_ENV_KWARGS_CHARS} characters")
        try:
            kwargs = json.loads(text)
        except (ValueError, RecursionError) as err:
            raise InputError(f"--env-kwargs: not JSON ({str(err)[:80]})") from None
        if not isinstance(kwargs, dict):
            raise InputError('--env-kwargs: a JSON object, {"name": value, ...}')
    allow_env_module(args.env, os.getcwd())
    return NamedEnv(args.env, kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="relay", description="Ray actor-learner RL training service")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train until a stop criterion")
    train.add_argument("config", help="YAML config file")
    _add_set_arg(train, "learner.lr=1e-3")
    train.add_argument("--run-dir", help="a new or empty run directory (default: <metrics.runs_dir>/<name>)")
    _add_address_arg(train)
    train.add_argument("--dashboard", action="store_true", help="serve the metrics dashboard beside the run")
    train.add_argument("--dashboard-host", default="127.0.0.1", help="dashboard bind address")
    train.add_argument(
        "--dashboard-port", type=port_number, default=8000, help="dashboard port (0: any free)"
    )
    resume = sub.add_parser("resume", help="continue a run from its newest valid checkpoint")
    resume.add_argument("run_dir", help="run directory holding config.yaml and checkpoints/")
    _add_address_arg(resume)
    _add_set_arg(resume, "stop.env_steps=200000")
    validate = sub.add_parser("validate", help="run every check train runs, print the resolved config")
    validate.add_argument("config", nargs="?", help="YAML config file")
    _add_set_arg(validate, "learner.lr=1e-3")
    _add_address_arg(validate)
    validate.add_argument(
        "--help-config", action="store_true", help="print every config leaf with its default and description"
    )
    dash = sub.add_parser(
        "dashboard", help="serve the learner metrics dashboard for a run or a folder of runs"
    )
    dash.add_argument("path", help="a run directory or a folder of run directories")
    dash.add_argument("--host", default="127.0.0.1", help="bind address (another one must be asked for)")
    dash.add_argument("--port", type=port_number, default=8000)
    export = sub.add_parser(
        "export",
        help="export a checkpoint's policy (onnx: checked against onnxruntime; hf: a language run's model "
        "or a reward model)",
    )
    export.add_argument(
        "checkpoint",
        help="a relay checkpoint (runs/<name>/checkpoints/ckpt-N.pt); for --format hf also a run dir",
    )
    _add_best_arg(export)
    export.add_argument("--format", choices=["onnx", "hf"], default="onnx")
    export.add_argument(
        "--out",
        help="output file (default: the checkpoint's name with .onnx); --format hf: a new folder "
        "(default: <run>/hf-<iteration>)",
    )
    export.add_argument(
        "--force", action="store_true", help="replace an existing regular file at --out (never the input)"
    )
    _add_env_arg(export, "check the export on")
    _add_policy_arg(export)
    verify = sub.add_parser("verify", help="precision table, fingerprint and latency of a policy")
    verify.add_argument("model", help="a relay checkpoint, an exported .onnx, or an ML-Agents .onnx/.pt")
    _add_best_arg(verify)
    verify.add_argument("--dtypes", default="float32,float16,bfloat16")
    verify.add_argument("--device", default="auto", help="auto, cpu, cuda[:i], npu[:i]")
    verify.add_argument("--batch", type=int, default=256, help="the batch-B of the latency table")
    verify.add_argument("--min-cosine", type=float, default=0.999)
    verify.add_argument("--max-abs", type=float, default=0.01)
    verify.add_argument("--seed", type=int, default=0)
    _add_env_arg(verify, "judge precision on")
    _add_policy_arg(verify)
    _add_serve_parser(sub)
    _add_eval_parser(sub)
    _add_sweep_parser(sub)
    return parser


def _add_sweep_parser(sub: Any) -> None:
    sw = sub.add_parser("sweep", help="hyperparameter sweeps and PBT on Ray Tune (one relay run per trial)")
    sw.add_argument("config", nargs="?", help="YAML config file (its sweep: section is read too)")
    sw.add_argument(
        "--param",
        dest="params",
        action="append",
        default=[],
        metavar="KEY=EXPR",
        help="a swept leaf: uniform(a,b), loguniform(a,b), randint(a,b), choice(v,...), grid(v,...)",
    )
    sw.add_argument("--samples", type=int, help="trials of a random/optuna search; repeats of a grid")
    sw.add_argument("--search", help="random, grid or optuna")
    sw.add_argument("--scheduler", help="fifo, asha or pbt")
    sw.add_argument("--metric", help="the metrics key trials are ranked by (default episode_return_mean)")
    sw.add_argument("--mode", help="max or min")
    sw.add_argument("--max-concurrent", type=int, help="trials running at once")
    sw.add_argument("--dir", help="the sweep's folder (new or empty)")
    sw.add_argument("--resume", metavar="DIR", help="continue an interrupted sweep's unfinished trials")
    _add_set_arg(sw, "stop.env_steps=50000")
    _add_address_arg(sw)


def _add_eval_parser(sub: Any) -> None:
    ev = sub.add_parser("eval", help="evaluation episodes of a policy: return mean ± std, a video")
    ev.add_argument("model", help="a run directory (its newest checkpoint), a checkpoint, or an .onnx")
    _add_best_arg(ev)
    ev.add_argument("--episodes", type=int, default=10)
    ev.add_argument("--stochastic", action="store_true", help="sample actions (default: the mode)")
    ev.add_argument("--seed", type=int, help="env seeds (default: the run's env.seed)")
    ev.add_argument("--video", metavar="DIR", help="write an MP4 of one episode into DIR")
    ev.add_argument("--json", action="store_true", help="print one JSON line instead")
    ev.add_argument(
        "--env",
        metavar="ENV_ID",
        help="the env to run in (needed for .onnx files, module:factory and PettingZoo envs; built with "
        "only the --env-kwargs you type)",
    )
    _add_env_kwargs_arg(ev)
    ev.add_argument(
        "--policy",
        metavar="NAME",
        help="a run of policy groups: score this group's agents, the other groups playing theirs",
    )
    ev.add_argument(
        "--prompts",
        metavar="FILE",
        help="a language run: the prompts to complete; a reward model's: the preference pairs to score "
        "(default: the run's prompts.eval, else prompts.train)",
    )
    ev.add_argument(
        "--reward",
        dest="rewards",
        action="append",
        default=[],
        metavar="SPEC",
        help="a language run: score with this reward instead of the run's (repeatable; a stored "
        "module:fn reward runs only when named here)",
    )


def _add_serve_parser(sub: Any) -> None:
    serve = sub.add_parser("serve", help="serve a policy over HTTP with Ray Serve (POST /act)")
    serve.add_argument(
        "model", help="a relay checkpoint or ONNX export, an ML-Agents .onnx/.pt, or a run dir"
    )
    serve.add_argument(
        "--follow", action="store_true", help="serve a run's newest checkpoint, swapping newer in"
    )
    _add_best_arg(serve)
    serve.add_argument("--runtime", default="torch", help="torch or onnxruntime")
    serve.add_argument("--device", default="auto", help="auto, cpu, cuda[:i] or npu[:i]")
    serve.add_argument("--replicas", type=int, default=1)
    serve.add_argument("--max-batch-size", type=int, default=32, help="requests @serve.batch joins")
    serve.add_argument("--batch-wait-ms", type=float, default=2.0, help="how long a batch waits to fill")
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger bodies get 413")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (another one must be asked for)")
    serve.add_argument("--port", type=port_number, default=8000, help="HTTP port (0: any free)")
    _add_policy_arg(serve)
    _add_address_arg(serve)


def _cmd_validate(args: argparse.Namespace) -> int:
    if args.help_config:
        print(config_help(choices(), entry_sections()))
        return EXIT_OK
    if args.config is None:
        raise InputError("a config file is required (or --help-config)")
    cfg = load_config(args.config, args.overrides)
    allow_user_code(cfg, os.getcwd())
    env = preflight(cfg, args.address)
    # A YAML comment, so the output stays a config file to save and train from.
    sys.stdout.write(f"# learner precision: {learner_precision(cfg, env, args.address)}\n")
    memory = learner_memory(cfg)
    if memory is not None:
        sys.stdout.write(f"# learner memory (estimate): {memory}\n")
    sys.stdout.write(dump_config(cfg))
    return EXIT_OK


def _cmd_train(args: argparse.Namespace, t_start: float) -> int:
    cfg = load_config(args.config, args.overrides)
    board = (args.dashboard_host, args.dashboard_port) if args.dashboard else None
    return driver.train(cfg, args.run_dir, args.address, t_start, dashboard=board)


def _cmd_resume(args: argparse.Namespace, t_start: float) -> int:
    return driver.resume(args.run_dir, args.overrides, args.address, t_start)


def _cmd_dashboard(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not path.is_dir():
        raise InputError(f"{path}: no such folder")
    board = driver.start_dashboard(path, args.host, args.port)
    try:
        board.wait()  # serve until Ctrl-C
    finally:
        board.stop()
    return EXIT_OK


def _cmd_export(args: argparse.Namespace) -> int:
    if args.format == "hf":  # export_hf checks the checkpoint's family as it loads it
        if args.env or args.env_kwargs or args.policy or args.force:
            raise InputError(
                "--format hf takes no --env, --env-kwargs, --policy or --force (it never replaces a folder)"
            )
        out = Path(args.out) if args.out else None
        folder, loads = export_hf(Path(_best(args.checkpoint, args.best)), out)
        print(f"wrote {folder} (a Hugging Face folder: {loads})")
        return EXIT_OK
    ckpt = Path(_best(args.checkpoint, args.best))
    if not ckpt.is_file():
        raise InputError(f"{ckpt}: no such checkpoint")
    _check_export_format(ckpt, args.format)
    policy = _policy(args)
    default = ckpt.with_suffix(".onnx") if policy is None else ckpt.with_name(f"{ckpt.stem}-{policy}.onnx")
    out = Path(args.out) if args.out else default
    check_output(out, [ckpt], args.force)
    handle = load_policy(ckpt, relay_only=True, policy=policy)  # before --env's module may load
    report = export_onnx(handle, out, env=_named_env(args), replace=args.force)
    print(
        f"wrote {report.path} (checked on {report.checked} observations against onnxruntime: "
        f"max abs error {report.max_abs_error:.2e})"
    )
    return EXIT_OK


def _check_export_format(path: Path, fmt: str) -> None:
    """InputError where the checkpoint's run exports in other formats (its family's)."""
    ckpt = _relay_checkpoint(path)
    if ckpt is None:
        return  # the exporter names what is wrong with it
    formats = FAMILIES[ckpt.family].export_formats
    if fmt not in formats:
        raise InputError(
            f"{path}: a {ckpt.family} run's checkpoint exports as --format {' or '.join(formats)}"
        )


def _cmd_verify(args: argparse.Namespace) -> int:
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown or not dtypes:
        raise InputError(f"--dtypes {args.dtypes!r}: choose from {', '.join(DTYPES)}")
    if args.batch < 1:
        raise InputError(f"--batch {args.batch}: must be at least 1")
    if not (0 <= args.min_cosine <= 1 and 0 <= args.max_abs < float("inf")):
        raise InputError("--min-cosine must be in [0, 1] and --max-abs a finite number >= 0")
    check_device(args.device)
    named = _named_env(args)
    opts = VerifyOptions(dtypes, args.device, args.batch, args.min_cosine, args.max_abs, args.seed, named)
    text, passed = run_verify(load_policy(_best(args.model, args.best), policy=_policy(args)), opts)
    print(text)
    return EXIT_OK if passed else EXIT_FAILURE


def _cmd_eval(args: argparse.Namespace) -> int:
    if not 1 <= args.episodes <= MAX_EPISODES:
        raise InputError(f"--episodes {args.episodes}: must be 1 to {MAX_EPISODES}")
    if args.seed is not None and not 0 <= args.seed < 2**63:
        raise InputError(f"--seed {args.seed}: must be 0 or more")
    path = policy_file(Path(args.model), args.best)
    ckpt = _relay_checkpoint(path)
    return EVALUATIONS[ckpt.family if ckpt is not None else ENV_FAMILY](args, path, ckpt)


def _eval_policy(args: argparse.Namespace, path: Path, ckpt: Checkpoint | None) -> int:
    """`relay eval` of an env policy: episodes in its env, a video where asked."""
    video_dir = Path(args.video) if args.video else None
    if video_dir is not None:
        _check_video_dir(video_dir)
    if args.prompts or args.rewards:
        raise InputError("--prompts and --reward are for a language run's checkpoint (model.kind=causal_lm)")
    if path.suffix == ".onnx" and not args.env:
        raise InputError(f"{path}: an ONNX file names no env relay may build; name one with --env ENV_ID")
    named = _named_env(args)
    handle = load_policy(path, policy=_policy(args))
    opts = EvalOptions(args.episodes, args.stochastic, args.seed, named, video=video_dir is not None)
    result = evaluate(handle, opts)
    if not args.json:  # the score is out before the video is written: a failed write costs no score
        print(describe(result, handle.source, not args.stochastic), flush=True)
    written, note, code = _write_video(result, video_dir, path.stem, handle.source)
    if note:
        print(f"relay eval: {note}", file=sys.stderr)
    if args.json:
        line = {"source": handle.source, "deterministic": not args.stochastic, **result.summary()}
        print(json.dumps({**line, "video": str(written) if written else None}))
    elif written is not None:
        print(f"wrote {written}")
    return code


def _relay_checkpoint(path: Path) -> Checkpoint | None:
    """The relay checkpoint at `path`, or None for anything else (an ONNX file, a malformed file:
    the env policy loaders judge them, with their own line)."""
    if path.suffix != ".pt" or not path.is_file():
        return None
    try:
        return load_checkpoint(path)
    except CheckpointError:
        return None


def _eval_language(args: argparse.Namespace, path: Path, ckpt: Checkpoint | None) -> int:
    assert ckpt is not None
    if args.video or args.env or args.env_kwargs or args.policy:
        raise InputError("a language run's evaluation takes no --video, --env, --env-kwargs or --policy")
    result = evaluate_language(path, ckpt, args.episodes, args.stochastic, args.prompts, args.rewards)
    s = result.summary()
    if args.json:
        print(json.dumps({"source": str(path), "deterministic": not args.stochastic, **s}))
    else:
        how = "sampled" if args.stochastic else "greedy"
        unscored = f", {s['unscored']} unscored (a reward fault)" if s["unscored"] else ""
        print(
            f"{path}: reward {s['return_mean']:.3f} ± {s['return_std']:.3f} over {s['episodes']} {how} "
            f"completions (min {s['return_min']:.3f}, max {s['return_max']:.3f}, "
            f"{s['len_mean']:.1f} tokens{unscored})",
            flush=True,
        )
    return EXIT_OK


def _eval_pairs(args: argparse.Namespace, path: Path, ckpt: Checkpoint | None) -> int:
    """`relay eval` of a reward model's run: its pair accuracy on preference pairs."""
    assert ckpt is not None
    if args.video or args.env or args.env_kwargs or args.policy or args.rewards or args.stochastic:
        raise InputError(
            "a reward model's evaluation takes no --video, --env, --env-kwargs, --policy, --reward or "
            "--stochastic (it scores pairs: --prompts names a pairs file)"
        )
    s = evaluate_pairs(path, ckpt, args.episodes, args.prompts)
    if args.json:
        print(json.dumps({"source": str(path), **s}))
    else:
        print(
            f"{path}: pair accuracy {s['return_mean']:.3f} over {s['episodes']} pairs (Bradley–Terry "
            f"loss {s['loss']:.3f}, mean margin {s['reward_margin']:.3f})",
            flush=True,
        )
    return EXIT_OK


# `relay eval` of a checkpoint, by its run's family (an ONNX file is an env policy's).
EVALUATIONS = {ENV_FAMILY: _eval_policy, LANGUAGE_FAMILY: _eval_language, PREFERENCE_FAMILY: _eval_pairs}


def _write_video(
    result: Any, folder: Path | None, stem: str, source: str
) -> tuple[Path | None, str | None, int]:
    """(the video written, a note on why not, the exit code): a folder that changed since it was
    checked costs the video, never the score printed before it."""
    if folder is None:
        return None, None, EXIT_OK
    try:
        return (*save_video(result, folder, stem, source), EXIT_OK)
    except (OSError, OutputError) as err:
        why = getattr(err, "strerror", None) or str(err)
        return None, f"no video: {folder} could not be written ({why})", EXIT_FAILURE


def _check_video_dir(folder: Path) -> None:
    """--video names a folder relay may create or write into, checked before any episode plays."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise InputError(f"--video {folder}: not a folder (it is a file or a link)")
    parent = next((p for p in [folder, *folder.parents] if p.exists()), Path("."))
    try:
        if not parent.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a folder")
        # A nameless file (O_TMPFILE) tried there: permissions alone say yes to root on a read-only
        # filesystem or an immutable folder.
        tempfile.TemporaryFile(dir=parent).close()
    except OSError as err:
        raise InputError(
            f"--video {folder}: cannot be written ({parent} is not a writable folder: {err.strerror})"
        ) from None


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        from ..services.serving.app import ServeArgs
        from ..services.serving.runner import ServeError, serve_policy
    except ImportError as err:
        raise InputError(
            f"needs the serve extra ({err.name} is missing): pip install 'relay-rl[serve]'"
        ) from None

    if args.best and args.follow:
        raise InputError("--best serves the run's best.pt; --follow its newest checkpoint: choose one")
    args.model = _best(args.model, args.best)
    _policy(args)
    fields = (
        "policy",
        "model",
        "follow",
        "runtime",
        "device",
        "replicas",
        "max_batch_size",
        "batch_wait_ms",
        "max_body_bytes",
    )
    try:
        options = ServeArgs.model_validate({k: getattr(args, k) for k in fields})
    except ValidationError as err:
        first = err.errors()[0]
        flag = "--" + str(first["loc"][0]).replace("_", "-")
        raise InputError(f"{flag} {getattr(args, str(first['loc'][0]))!r}: {first['msg']}") from None
    if options.runtime == "torch" and not args.address:
        check_device(options.device)  # a cluster's replicas may have devices this host lacks
    try:
        with sigterm_raises():
            return serve_policy(options, args.host, args.port, args.address)
    except ServeError as err:
        raise InputError(str(err)) from None


def _cmd_sweep(args: argparse.Namespace) -> int:
    try:
        from ..services.sweep import runner
    except ImportError as err:
        raise InputError(
            f"needs the sweep extra ({err.name} is missing): pip install 'relay-rl[sweep]'"
        ) from None
    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise InputError(f"--max-concurrent {args.max_concurrent}: must be at least 1")
    if args.resume:
        if args.config or args.params:
            raise InputError("--resume continues a sweep as planned: give no config or --param")
        with sigterm_raises():
            return runner.resume(Path(args.resume), args.overrides, args.address, args.max_concurrent)
    if args.config is None:
        raise InputError("a config file is required (or --resume DIR)")
    flags = {k: getattr(args, k) for k in ("samples", "search", "scheduler", "metric", "mode")}
    sets = [f"sweep.{k}={v}" for k, v in flags.items() if v is not None]
    cfg = load_config(args.config, [*args.overrides, *sets])
    extra = dict(parse_cli_param(item) for item in args.params)
    cfg = cfg.model_copy(
        update={"sweep": cfg.sweep.model_copy(update={"params": {**cfg.sweep.params, **extra}})}
    )
    allow_user_code(cfg, os.getcwd())
    preflight(cfg, args.address)
    with sigterm_raises():  # until the sweep's own handlers take over (runner.graceful_signals)
        return runner.start(cfg, Path(args.dir) if args.dir else None, args.address, args.max_concurrent)


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
        "serve": lambda: _cmd_serve(args),
        "eval": lambda: _cmd_eval(args),
        "sweep": lambda: _cmd_sweep(args),
    }
    # SDL (pygame, which gymnasium's renderers use) takes SIGTERM for itself unless told not to:
    # `relay eval --video` ran to its end through a SIGTERM.
    os.environ.setdefault("SDL_NO_SIGNAL_HANDLERS", "1")
    try:
        with sigterm_raises():  # every command stops on SIGTERM/SIGHUP as on Ctrl-C (143/129/130)
            return handlers[args.command]()
    except (*BAD_INPUT, InputError) as err:
        print(f"relay {args.command}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as err:
        why = stop_reason(err)
        if args.command not in ("dashboard", "serve"):
            print(f"relay {args.command}: {why}", file=sys.stderr)
        if args.command == "serve":
            print(f"relay serve: stopped ({why})", file=sys.stderr)
        return EXIT_OK if args.command == "dashboard" else exit_code(err)
    except Exception as err:
        text = " ".join(str(err).split())[:300]
        print(f"relay {args.command}: failed: {type(err).__name__}: {text}", file=sys.stderr)
        return EXIT_FAILURE


def run() -> NoReturn:
    """The `relay` command: `main`, then its exit code. A sweep stopped by a signal leaves
    through os._exit once its own cleanup is done (`runner.run`'s finally: the records written,
    ray.shutdown, its child processes ended): what Tune and Ray leave behind after a stop cut
    short is destroyed at interpreter exit, calling into a Ray that is gone, and Ray's core
    worker then ended the process with exit 1 instead of 130 (a flaky CI failure of the
    double Ctrl-C test)."""
    code = main()
    if code in STOP_CODES.values() and sys.argv[1:2] == ["sweep"]:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
