"""`relay sweep`: a checked plan run as one Ray Tune experiment, and its outcome as a table.

The sweep's folder holds one relay run directory per trial, the sweep's records
(services/runs/sweep_records.py: sweep.yaml, trials.jsonl, summary.json, best.yaml) and `tune/`, Ray
Tune's own experiment folder (relay reads nothing back from it).

Searches: `random` and `grid` values are drawn by relay before anything starts (so each trial's
config is checked up front and `--resume` knows every trial); `optuna` asks Tune's OptunaSearch as
trials finish. Schedulers: FIFO, ASHA (stops poor trials at rungs of training iterations) and PBT
(exploits the top quarter's checkpoints every `perturbation_interval` iterations, perturbing the
swept values within their ranges). Ctrl-C, SIGTERM and SIGHUP stop every trial through Tune's own
graceful stop (each trial writes its final checkpoint) and exit 130, 143, 129.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import ray

from ...contracts.config import RelayConfig, code_settings, dump_config, load_config, unconfirmed_code
from ...services.driver.cluster import end_children, join_or_start_ray
from ...services.runs.files import atomic_write
from ...services.runs.signals import Terminated, signals_held
from ...services.runs.sweep_records import (
    BEST_FILE,
    ENDED,
    SUMMARY_FILE,
    SWEEP_FILE,
    TRIALS_FILE,
    TrialLog,
    summarize,
)
from ...services.sweep.params import Param, SweepError
from ...services.sweep.plan import (
    SweepPlan,
    TrialSpec,
    build_plan,
    check_new_root,
    quiet_tune,
    trial_config,
    trial_cpus,
    trial_resources,
)
from ...services.sweep.trial import RELAY_DONE, RelayTrial, SweepContext
from ...services.tracking import PARENT_TAG, SWEEP_TAG, tracker_settings
from ...services.tracking.mlflow_client import finish_parent, start_parent

SIGNAL_CODES: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


# ---- Tune's pieces --------------------------------------------------------------------------------
def domain(param: Param) -> Any:
    """A Param as Tune's search domain (randint's high end included, as relay documents it)."""
    from ray import tune

    lo, hi = (*param.values, None, None)[:2]
    if param.kind == "uniform":
        return tune.uniform(lo, hi)
    if param.kind == "loguniform":
        return tune.loguniform(lo, hi)
    if param.kind == "randint":
        return tune.randint(lo, hi + 1)
    return tune.choice(list(param.values))


def clip_to_ranges(params: list[Param]) -> Any:
    """PBT's explore multiplies values by 0.8 or 1.2: keep each inside its declared range."""
    ranges = {p.key: p for p in params if p.kind in ("uniform", "loguniform", "randint")}

    def explore(config: dict[str, Any]) -> dict[str, Any]:
        values = config["trial"]["params"]
        for key, p in ranges.items():
            lo, hi = p.values
            clipped = min(max(values[key], lo), hi)
            values[key] = round(clipped) if p.kind == "randint" else float(clipped)
        return config

    return explore


def make_scheduler(plan: SweepPlan) -> Any:
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining

    o = plan.options
    if o.scheduler == "asha":
        return ASHAScheduler(time_attr="training_iteration", grace_period=o.grace_iterations, max_t=10**9)
    if o.scheduler == "pbt":
        return PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=o.perturbation_interval,
            hyperparam_mutations={"trial": {"params": {p.key: domain(p) for p in plan.params}}},
            custom_explore_fn=clip_to_ranges(plan.params),
            synch=False,
        )
    return FIFOScheduler()


def param_space(plan: SweepPlan, specs: list[TrialSpec]) -> tuple[dict[str, Any], Any, int]:
    """(param space, search algorithm or None, num_samples)."""
    from ray import tune

    if plan.options.search == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        space = {"trial": {"params": {p.key: domain(p) for p in plan.params}}}
        return space, OptunaSearch(seed=int(plan.base["env"]["seed"])), plan.samples
    trials = [{"id": s.id, "params": s.params} for s in specs]
    return {"trial": tune.grid_search(trials)}, None, 1


def _resources(plan: SweepPlan) -> Any:
    from ray.tune import PlacementGroupFactory

    fallback = trial_resources(trial_config(plan.base, {}))

    def per_trial(config: dict[str, Any]) -> Any:
        try:
            bundles = trial_resources(trial_config(plan.base, dict(config["trial"]["params"])))
        except Exception:  # the trial itself will error on its config, alone
            bundles = fallback
        return PlacementGroupFactory(bundles)

    return per_trial


# ---- the sweep's own files ------------------------------------------------------------------------
def trial_namer(taken: int) -> Any:
    """Names new trials, once, from their first config (PBT later copies other trials' configs in):
    a pre-drawn trial by its id (t000), an optuna trial by the next free number after `taken`."""
    count = iter(range(taken, 10**9))
    names: dict[str, str] = {}

    def name(trial: Any) -> str:
        if trial.trial_id not in names:
            given = trial.config.get("trial", {}).get("id")
            names[trial.trial_id] = str(given) if given else f"t{next(count):03d}"
        return names[trial.trial_id]

    return name


def _tune_callback(log: TrialLog, scheduler: str) -> Any:
    from ray.tune import Callback

    def key(trial: Any) -> str:
        return str(trial)  # the name trial_namer gave it

    last: dict[str, dict[str, Any]] = {}  # each trial's values when it last started

    class Report(Callback):
        def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
            # PBT restarts a trial at every exploit: said again only when its values changed.
            params = _params(trial)
            before, last[key(trial)] = last.get(key(trial)), params
            if params == before:
                return
            event = "started" if before is None else "continues"
            log.append(trial=key(trial), event=event, params=params)
            shown = ", ".join(f"{k}={_fmt(v)}" for k, v in params.items())
            _say(
                f"trial {key(trial)} {event} ({shown})"
                if before is None
                else f"trial {key(trial)} now {shown}"
            )

        def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
            result = trial.last_result or {}
            status = "done" if result.get(RELAY_DONE) else "stopped early"
            why = "its stop criterion" if result.get(RELAY_DONE) else f"{scheduler} stopped it"
            log.append(trial=key(trial), event="ended", status=status, why=why, params=_params(trial))
            _say(f"trial {key(trial)} {status} at iteration {result.get('training_iteration', 0)}")

        def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
            why = _first_line(trial.error_file)
            # a trial whose setup failed never "started": its values are said here
            log.append(trial=key(trial), event="ended", status="error", why=why, params=_params(trial))
            _say(f"trial {key(trial)} failed: {why} (the sweep goes on)")

    return Report()


def _params(trial: Any) -> dict[str, Any]:
    return dict(trial.config["trial"]["params"])


def _first_line(error_file: str | None) -> str:
    """The last line of a trial's traceback (the exception itself), for the table."""
    if not error_file:
        return "error"
    with suppress(OSError):
        lines = [ln.strip() for ln in Path(error_file).read_text(errors="replace").splitlines() if ln.strip()]
        if lines:  # "package.module.SomeError: what" -> "SomeError: what"
            name, sep, text = lines[-1].partition(": ")
            return f"{name.rsplit('.', 1)[-1]}{sep}{text}"[:300]
    return "error"


def _say(text: str) -> None:
    print(f"relay sweep: {text}", file=sys.stderr, flush=True)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# ---- signals --------------------------------------------------------------------------------------
@contextmanager
def graceful_signals() -> Iterator[dict[str, int]]:
    """Ctrl-C, SIGTERM and SIGHUP ask Tune to stop every trial gracefully (through the SIGUSR1
    handler Tune installs while it runs); a second one stops at once. Yields {"code": exit code}."""
    seen: dict[str, int] = {}
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # relay's handler below asks Tune itself

    def handler(signum: int, _frame: Any) -> None:
        tune_listens = signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, signal.SIG_IGN, None)
        if seen or not tune_listens:  # a second signal, or Tune not running yet (or any more)
            seen.setdefault("code", SIGNAL_CODES[signum])
            raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)
        seen["code"] = SIGNAL_CODES[signum]
        _say("stopping every trial (each writes its final checkpoint); once more to stop at once")
        os.kill(os.getpid(), signal.SIGUSR1)

    previous = {s: signal.signal(s, handler) for s in SIGNAL_CODES}
    try:
        yield seen
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


# ---- the outcome ----------------------------------------------------------------------------------
def format_table(rows: list[dict[str, Any]], metric: str) -> str:
    keys = sorted({k for r in rows for k in r["params"]})
    head = ["trial", *keys, f"best {metric}", "env steps", "wall s", "status"]
    body = [
        [
            r["trial"],
            *[_fmt(r["params"].get(k, "")) for k in keys],
            "-" if r["best"] is None else f"{r['best']:.4g}",
            str(r["env_steps"]),
            f"{r['wall_s']:.1f}",
            r["status"],
        ]
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    return "\n".join(
        "  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)) for line in [head, *body]
    )


def write_outcome(plan: SweepPlan, rows: list[dict[str, Any]]) -> Path | None:
    """summary.json and best.yaml (the best trial's config, as it last ran, ready for relay train)."""
    atomic_write(
        plan.root / SUMMARY_FILE, json.dumps({"metric": plan.options.metric, "trials": rows}).encode()
    )
    scored = [r for r in rows if r["best"] is not None]
    if not scored:
        return None
    pick = max if plan.options.mode == "max" else min
    best = pick(scored, key=lambda r: r["best"])
    cfg = load_config(plan.root / best["trial"] / "config.yaml")
    stored = set(code_settings(cfg)) - set(code_settings(trial_config(plan.base, {})))
    if stored:
        # The trial's config.yaml is data in the sweep's folder: a code setting the sweep did not
        # run is never passed on as the config to train.
        leaf, value = sorted(stored)[0]
        _say(f"{best['trial']}/config.yaml names {leaf}={value}, which the sweep never ran; no {BEST_FILE}")
        return None
    data = cfg.model_dump(mode="json")
    data["metrics"]["progress"] = plan.base["metrics"]["progress"]
    path = plan.root / BEST_FILE
    atomic_write(
        path,
        f"# the best trial of {plan.root.name}: {best['trial']}\n".encode()
        + dump_config(RelayConfig.model_validate(data)).encode(),
    )
    return path


# ---- the sweep ------------------------------------------------------------------------------------
def _start_mlflow_parent(plan: SweepPlan) -> dict[str, str]:
    """The sweep's MLflow run (its trials are its children); a server that is away costs the
    nesting, not the sweep."""
    settings = tracker_settings(trial_config(plan.base, {}), "mlflow")
    if settings is None:
        return {}
    params = {p.key: p.describe() for p in plan.params}
    try:
        return {PARENT_TAG: start_parent(settings, plan.root.name, params)}
    except Exception as err:
        _say(f"MLflow: the sweep's parent run could not be created ({type(err).__name__}); trials log alone")
        return {}


def _finish_mlflow_parent(plan: SweepPlan, tags: dict[str, str], status: str) -> None:
    settings = tracker_settings(trial_config(plan.base, {}), "mlflow")
    if settings is None or PARENT_TAG not in tags:
        return
    with suppress(Exception):
        finish_parent(settings, tags[PARENT_TAG], status)


def pending_trials(plan: SweepPlan, states: dict[str, dict[str, Any]]) -> list[TrialSpec]:
    """The pre-drawn trials that have not ended (a resumed one continues from its checkpoint)."""
    return [s for s in plan.trials if states.get(s.id, {}).get("status") not in ENDED]


def execute(plan: SweepPlan, address: str | None, max_concurrent: int | None) -> int:
    """Run the plan's pending trials under Tune; print the table; the exit code."""
    from ray import tune

    # relay restarts a PBT trial from its checkpoint on purpose (its run directory, its actors).
    warnings.filterwarnings("ignore", message="Consider boosting PBT performance")
    log = TrialLog(plan.root)
    states = log.read()
    if log.skipped:
        _say(f"{TRIALS_FILE}: {log.skipped} lines skipped (not what relay writes)")
    specs = pending_trials(plan, states)
    base_cfg = trial_config(plan.base, {})
    concurrent = max_concurrent or plan.options.max_concurrent
    started = join_or_start_ray(address, trial_cpus(base_cfg) * (concurrent or 1))
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # relay writes each trial's metrics
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    quiet_tune()
    tags = {SWEEP_TAG: plan.root.name, **_start_mlflow_parent(plan)}
    ctx = SweepContext(
        plan.base, str(plan.root), os.getcwd(), plan.options.metric, plan.options.mode, address, tags
    )
    done_before = sum(1 for s in states.values() if s.get("status") in ENDED)
    remaining = plan.samples - done_before if plan.options.search == "optuna" else len(specs)
    code = 0
    tuner: Any = None  # dropped before ray.shutdown() (the finally)
    try:
        with graceful_signals() as seen:
            if remaining > 0:
                space, search, samples = param_space(plan, specs)
                namer = trial_namer(len(states))
                tuner = tune.Tuner(
                    tune.with_resources(tune.with_parameters(RelayTrial, sweep=ctx), _resources(plan)),
                    param_space=space,
                    tune_config=tune.TuneConfig(
                        metric=plan.options.metric,
                        mode=plan.options.mode,
                        search_alg=search,
                        scheduler=make_scheduler(plan),
                        num_samples=remaining if search is not None else samples,
                        max_concurrent_trials=concurrent,
                        reuse_actors=False,
                        trial_name_creator=namer,
                        trial_dirname_creator=namer,
                    ),
                    run_config=tune.RunConfig(
                        name="tune",
                        storage_path=str(plan.root),
                        verbose=0,
                        callbacks=[_tune_callback(log, plan.options.scheduler)],
                        failure_config=tune.FailureConfig(max_failures=0),
                        # PBT exploits trials' recent checkpoints: keep a few (Tune warns at 2).
                        checkpoint_config=tune.CheckpointConfig(num_to_keep=4),
                    ),
                )
                tuner.fit()
            code = seen.get("code", 0)
    except KeyboardInterrupt as err:
        # The stop's traceback holds Tune's frames and, through them, Ray handles. Freed only after
        # ray.shutdown(), their destructors call into a Ray that is gone, and its core worker ends
        # the process with exit 1 (the second Ctrl-C exited 1, not 130). Drop them now, collect
        # them while Ray is up, and raise the same stop bare after the cleanup.
        stop = err.with_traceback(None)
        stop.__context__ = None
        raise stop from None
    finally:
        # A second Ctrl-C lands here, cutting Tune's stop short; a third must not cut this short
        # too: a Ray half shut down leaves agents that ignore SIGTERM, and Tune's exit hook then
        # waits a minute on a GCS that is gone (exit 1). Signals wait until the cleanup is done.
        with signals_held():
            # Tune's objects go while Ray is up, on every path: whatever leaves this frame later
            # (a stop's traceback holds it) is freed after ray.shutdown(), and a Ray handle freed
            # then ends the process with exit 1.
            tuner = None
            gc.collect()
            try:
                rows = summarize(plan.root, plan.options.metric, plan.options.mode)
                best = write_outcome(plan, rows)
                _finish_mlflow_parent(plan, tags, "KILLED" if code else "FINISHED")
            finally:
                if started:
                    ray.shutdown()
                    end_children()  # whatever this process started ends with it
    print(format_table(rows, plan.options.metric))
    for row in rows:
        if row["status"] == "error":
            print(f"{row['trial']}: {row['why']}")
    if best is not None:
        print(f"best config: {best}  (relay train {best})")
    if code:
        _say(f"stopped; continue with: relay sweep --resume {plan.root}")
        return code
    return 0 if any(r["status"] in ("done", "stopped early") for r in rows) else 1


def start(cfg: RelayConfig, root: Path | None, address: str | None, max_concurrent: int | None) -> int:
    """`relay sweep CONFIG ...`: check everything, then create the folder and run."""
    plan = build_plan(cfg, root, address)
    check_new_root(plan.root)
    plan.root.mkdir(parents=True, exist_ok=True)
    fd = os.open(plan.root / SWEEP_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(dump_config(cfg))
    log = TrialLog(plan.root)
    for spec in plan.trials:
        log.append(trial=spec.id, event="planned", params=spec.params)
    _say(
        f"{plan.root}: {len(plan.trials) or plan.samples} trials, {plan.options.search} search, "
        f"{plan.options.scheduler} scheduler, ranked by {plan.options.metric} ({plan.options.mode})"
    )
    return execute(plan, address, max_concurrent)


def resume(root: Path, overrides: list[str], address: str | None, max_concurrent: int | None) -> int:
    """`relay sweep --resume D`: the same plan (sweep.yaml, read as data), its unfinished trials.
    A setting that runs code (a `module:factory` env, a `module:fn` group mapping) is imported only
    when named on the command line too, with its stored value."""
    if root.is_symlink():
        raise SweepError(
            f"{root} is a symbolic link; relay never writes through links (name the folder itself)"
        )
    if not (root / SWEEP_FILE).is_file():
        raise SweepError(f"{root} is not a sweep folder (no {SWEEP_FILE})")
    cfg = load_config(root / SWEEP_FILE)
    code = code_settings(cfg)
    settings = {o: tuple(part.strip() for part in o.split("=", 1)) for o in overrides}  # (leaf, value)
    named = set(settings.values())
    others = [o for o, setting in settings.items() if setting not in code]
    if others:
        raise SweepError(f"--resume continues the sweep as it was planned; {others[0]!r} would change it")
    confirmed = {leaf for leaf, value in code if (leaf, value) in named}
    refusal = unconfirmed_code(cfg, confirmed, f"{root}/{SWEEP_FILE}", f"relay sweep --resume {root}")
    if refusal:
        raise SweepError(refusal)
    plan = build_plan(cfg, root, address)
    _say(f"resuming {plan.root}")
    return execute(plan, address, max_concurrent)
