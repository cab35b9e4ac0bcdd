"""A sweep, checked whole before anything starts: its parameters, its options, each trial's config.

`relay sweep` (and `--resume`) build a SweepPlan first; every problem is a SweepError or a
ConfigError (one line, exit 2) and nothing is created until the plan stands. A trial's config is
the base config with the sweep section reset, the trial's values set on their leaves, and its run
directory inside the sweep's folder; each pre-drawn trial's config passes `relay validate`'s checks
here, and a trial whose values are drawn later (optuna, pbt's perturbations) passes them when it
starts, alone: a trial whose config is refused errors by itself and the sweep goes on.
"""

from __future__ import annotations

import copy
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...contracts.config import RelayConfig, SweepConfig, build_config, is_code_value
from ...learner.actor import learner_resources
from ...learner.device import DeviceError
from ...policy.models import model_kind
from ...rollout_workers.worker import worker_resources
from ...services.driver.families import backend_class
from ...services.driver.preflight import check_config, preflight
from ...services.runs.config_sections import all_leaves
from ...services.runs.metric_keys import catalog
from ...services.sweep.params import Param, SweepError, draw_trials, parse_param
from ...services.tracking import TRACKERS

DEFAULT_SAMPLES = {"random": 8, "optuna": 8, "grid": 1}


def not_swept() -> tuple[str, ...]:
    """Leaves a sweep sets itself, or that name where its files go (each registered tracker's
    section, read at call time): never swept."""
    return ("sweep.", "metrics.runs_dir", "metrics.run_name", *(f"metrics.{name}" for name in TRACKERS))


# PBT restores one trial's checkpoint into another: these would not fit (model shapes, spaces,
# the algorithm) or would change what a running trial reserved from the cluster.
NOT_PERTURBED = (
    "model.",
    "env.",
    "learner.algo",
    "learner.device",
    "learner.num_learners",
    "learner.num_cpus",
    "learner.npu_ids",
    "learner.ray_resources",
    "learner.buffer_size",
    "rollout.num_workers",
    "rollout.num_cpus_per_worker",
    "rollout.autoscale",
    "eval.num_cpus",
    "eval.every_iterations",
)
NOT_METRICS = ("device", "precision")  # catalog keys that are not numbers


@dataclass(frozen=True)
class TrialSpec:
    """One trial: its id (its run directory's name) and the values of the swept leaves."""

    id: str
    params: dict[str, Any]


@dataclass
class SweepPlan:
    base: dict[str, Any]  # the resolved base config (sweep section included), as JSON data
    options: SweepConfig
    params: list[Param]
    root: Path  # the sweep's folder (absolute)
    trials: list[TrialSpec] = field(default_factory=list)  # pre-drawn (random, grid); none for optuna

    @property
    def samples(self) -> int:
        return self.options.samples or DEFAULT_SAMPLES[self.options.search]


def quiet_tune() -> None:
    """Tune's per-checkpoint and per-result INFO lines: relay prints its own (trials.jsonl keeps them)."""
    for name in ("ray.tune", "ray.train"):
        logging.getLogger(name).setLevel(logging.ERROR)


def set_leaf(tree: dict[str, Any], key: str, value: Any) -> None:
    node = tree
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SweepError(f"{key}: {part!r} is not a section")
        node = child
    node[parts[-1]] = copy.deepcopy(value)


def trial_config(base: dict[str, Any], values: dict[str, Any]) -> RelayConfig:
    """The base config with the trial's values set; the sweep section reset (a trial is a plain run,
    and its config.yaml runs as it is with `relay train`); no progress display of its own."""
    data = copy.deepcopy(base)
    data.pop("sweep", None)
    data.setdefault("metrics", {}).update({"run_name": None, "progress": "none"})
    for key, value in values.items():
        set_leaf(data, key, value)
    return build_config(data)


def _leaf_keys() -> set[str]:
    return {path for path, _default, _desc in all_leaves()}


def parse_params(exprs: dict[str, str]) -> list[Param]:
    leaves = _leaf_keys()
    params = []
    for key, expression in exprs.items():
        param = parse_param(key, expression)
        if param.key.startswith(not_swept()):
            raise SweepError(f"{param.key}: set by the sweep itself, not a parameter to sweep")
        if param.key not in leaves and not param.key.startswith("env.kwargs."):
            raise SweepError(f"{param.key}: no such config leaf (see relay validate --help-config)")
        code = [v for v in param.values if is_code_value(param.key, v)]
        if code:
            # A sweep's values are data: sweep.yaml is read back by --resume, and a swept
            # `module:factory` would run the code it names with nobody having typed it.
            raise SweepError(
                f"{param.key}: {code[0]} names code, which a sweep never draws; "
                f"set it as {param.key} itself and sweep data leaves"
            )
        params.append(param)
    if not params:
        raise SweepError("nothing to sweep: name a parameter with --param key=expression (or sweep.params)")
    return params


def check_options(options: SweepConfig, params: list[Param]) -> None:
    """The search, the scheduler and the metric against the parameters."""
    search, scheduler = options.search, options.scheduler
    if options.metric not in catalog().keys or options.metric in NOT_METRICS:
        raise SweepError(
            f"sweep.metric={options.metric}: not a numeric metrics key (see services/runs/metric_keys.py)"
        )
    if search == "grid":
        ranged = [p.key for p in params if not p.finite]
        if ranged:
            raise SweepError(
                f"--search grid takes choice(...) or grid(...) values only; {ranged[0]} is a range"
            )
    if search == "optuna":
        grids = [p.key for p in params if p.kind == "grid"]
        if grids:
            raise SweepError(f"--search optuna draws every value itself; {grids[0]} is a grid(...)")
        if scheduler == "pbt":
            raise SweepError("--scheduler pbt perturbs the values itself: use --search random or grid")
    if scheduler == "pbt":
        fixed = [p.key for p in params if p.key.startswith(NOT_PERTURBED)]
        if fixed:
            raise SweepError(
                f"--scheduler pbt cannot perturb {fixed[0]}: a trial continues another's checkpoint, "
                "so the model, the env and what a trial reserves stay as they are"
            )


def check_probes(base: dict[str, Any], params: list[Param]) -> None:
    """Each parameter's ends (or each of its values) make a valid config, one at a time."""
    for param in params:
        for value in param.probes():
            try:
                cfg = trial_config(base, {param.key: value})
                check_config(cfg)
            except ValueError as err:
                raise SweepError(f"{param.describe()}: with {param.key}={value}, {err}") from None


def check_resources(cfg: RelayConfig) -> None:
    if cfg.rollout.autoscale:
        raise SweepError(
            "rollout.autoscale=true: a trial's workers are reserved up front; sweep fixed fleets"
        )


def trial_resources(cfg: RelayConfig) -> list[dict[str, float]]:
    """The trial's placement-group bundles: the trial's driver (nothing: it only paces and writes),
    the learner(s), each rollout worker's actors (a language run's reward actor, and its generator
    where generation.placement=workers), the evaluator. In local mode the learner runs in the trial."""
    if cfg.rollout.num_workers == 0:
        return [{"CPU": float(cfg.learner.num_cpus)}]
    per_worker = backend_class(cfg).actors_per_worker(cfg)
    bundles: list[dict[str, float]] = [{}]
    bundles += [learner_resources(cfg)] * cfg.learner.num_learners
    bundles += [worker_resources(cfg)] * (cfg.rollout.num_workers * per_worker)
    if cfg.eval.every_iterations:
        bundles.append({"CPU": cfg.eval.num_cpus})
    return [{k: v for k, v in b.items() if v} for b in bundles]


def trial_cpus(cfg: RelayConfig) -> float:
    return sum(b.get("CPU", 0.0) for b in trial_resources(cfg))


def default_root(cfg: RelayConfig) -> Path:
    # What the trials train on: the env, or a language or reward model's folder (the kind says).
    source = model_kind(cfg.model.kind).run_source(cfg)
    env = "".join(c if c.isalnum() else "-" for c in source.split("/")[-1]).strip("-") or "env"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(cfg.metrics.runs_dir) / f"sweep-{env}-{stamp}-{secrets.token_hex(2)}"


def check_new_root(root: Path) -> None:
    if root.exists() and (not root.is_dir() or root.is_symlink()):
        raise SweepError(f"--dir {root}: not a folder (a file or a link)")
    if root.is_dir() and any(root.iterdir()):
        raise SweepError(f"--dir {root}: not empty (continue a sweep with relay sweep --resume {root})")
    parent = next((p for p in [root, *root.parents] if p.exists()), Path("."))
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise SweepError(f"--dir {root}: cannot be created ({parent} is not a writable folder)")


def build_plan(
    cfg: RelayConfig, root: Path | None, address: str | None, seed: int | None = None
) -> SweepPlan:
    """Everything checked, nothing created: SweepError or ConfigError on the first problem. Each
    pre-drawn trial's config passes `relay validate`'s checks (`preflight`)."""
    options = cfg.sweep
    base = cfg.model_dump(mode="json")
    params = parse_params(options.params)
    check_options(options, params)
    check_resources(cfg)
    check_probes(base, params)
    target = (root or (Path(options.dir) if options.dir else default_root(cfg))).absolute()
    plan = SweepPlan(base, options, params, target)
    if options.search != "optuna":
        drawn = draw_trials(params, plan.samples, options.search, cfg.env.seed if seed is None else seed)
        width = max(3, len(str(len(drawn) - 1)))
        plan.trials = [TrialSpec(f"t{i:0{width}d}", values) for i, values in enumerate(drawn)]
        for spec in plan.trials:
            try:
                preflight(trial_config(base, spec.params), address)
            except (ValueError, DeviceError) as err:
                raise SweepError(f"trial {spec.id} ({spec.params}): {err}") from None
    return plan
