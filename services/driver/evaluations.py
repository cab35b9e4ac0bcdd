"""Evaluation during training, the driver's side: every `eval.every_iterations` iterations the
newest published weights go to the evaluator (a Ray actor, or a thread in local mode) and the loop
goes straight on; a finished evaluation becomes `eval_*` keys on the next metrics line, its video a
new file `RUN/videos/iter-<i>-return-<R>.mp4`, and, with `checkpoint.keep_best`, a better score
`checkpoints/best.pt`.

One evaluation runs at a time: one falling due while another still runs is skipped, so a slow
evaluation never queues up behind the learner or holds it back. best.pt holds the weights that
were evaluated (not the learner's newer ones), as a checkpoint `relay eval`, `export`, `verify`
and `serve` load; resume never reads it. Its score rides inside it, so a resumed run keeps a best
policy only a better one replaces.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
import ray
import torch

from ...contracts.checkpoint import Checkpoint, CheckpointError, RunCounters
from ...contracts.config import RelayConfig, config_data
from ...contracts.metrics import POLICY_PREFIX
from ...contracts.policy_groups import without_versions
from ...contracts.spaces import EnvSpec
from ...policy.weight_wires import WeightWire
from ...rollout_workers.evaluator import EvalReport, Evaluator
from ...rollout_workers.video import video_stem
from ...services.runs.checkpoints import BEST_NAME, load_checkpoint
from ...services.runs.files import atomic_write, write_numbered
from ...services.runs.run_dir import RunDir

Weights = dict[str, Any]  # a state dict: numpy arrays or CPU tensors


class EvalRunner(Protocol):
    """Where evaluations run: `submit` starts one with the newest weights (never waits for it);
    `poll` hands back a finished one with the weights it evaluated, else None."""

    def busy(self) -> bool: ...
    def submit(self, iteration: int, video: bool) -> None: ...
    def poll(self) -> tuple[EvalReport, Callable[[], Weights]] | None: ...
    def close(self) -> None: ...


class ThreadEvalRunner:
    """Local mode: the evaluator on a thread of this process, with a copy of the weights."""

    def __init__(self, evaluator: Evaluator, current: Callable[[], tuple[int, Weights]]) -> None:
        self.evaluator, self.current = evaluator, current
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relay-eval")
        self._running: tuple[Future[EvalReport], Weights] | None = None

    def busy(self) -> bool:
        return self._running is not None

    def submit(self, iteration: int, video: bool) -> None:
        version, weights = self.current()
        future = self._pool.submit(self.evaluator.evaluate, iteration, version, weights, video)
        self._running = (future, weights)

    def poll(self) -> tuple[EvalReport, Callable[[], Weights]] | None:
        if self._running is None or not self._running[0].done():
            return None
        (future, weights), self._running = self._running, None
        return future.result(), lambda: weights

    def close(self) -> None:
        self.evaluator.cancel()  # a stop does not wait for the episodes still playing
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.evaluator.close()


class ActorEvalRunner:
    """Ray: the evaluation actor fetches the published weights by ref, as the workers do."""

    def __init__(self, actor: Any, current: Callable[[], tuple[int, list[Any]]], wire: WeightWire) -> None:
        self.actor, self.current, self.wire = actor, current, wire
        self._running: tuple[Any, list[Any]] | None = None

    def busy(self) -> bool:
        return self._running is not None

    def submit(self, iteration: int, video: bool) -> None:
        version, weights_ref = self.current()
        self._running = (self.actor.evaluate.remote(iteration, version, weights_ref, video), weights_ref)

    def poll(self) -> tuple[EvalReport, Callable[[], Weights]] | None:
        if self._running is None:
            return None
        ref, weights_ref = self._running
        done, _ = ray.wait([ref], timeout=0)
        if not done:
            return None
        self._running = None
        try:
            report: EvalReport = ray.get(ref)
        except ray.exceptions.RayError as err:  # the evaluator died: report it, train on
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            print(f"relay: an evaluation failed ({first[:200]})", file=sys.stderr, flush=True)
            return None
        return report, lambda: self.wire.unpack(ray.get(weights_ref[0]))

    def close(self) -> None:
        ray.kill(self.actor)


def eval_metrics(report: EvalReport) -> dict[str, Any]:
    """The eval_* keys of a metrics line (contracts/metrics.py); a run of policy groups adds each
    group's "policy/<group>/eval_return_mean" (the plain keys: the groups' means)."""
    s = report.summary
    groups = {
        f"{POLICY_PREFIX}{name}/eval_return_mean": g["return_mean"] for name, g in s.get("groups", {}).items()
    }
    return {
        **groups,
        "eval_return_mean": s["return_mean"],
        "eval_return_std": s["return_std"],
        "eval_return_min": s["return_min"],
        "eval_return_max": s["return_max"],
        "eval_len_mean": s["len_mean"],
        "eval_episodes": s["episodes"],
        "eval_iteration": report.iteration,
        "eval_weights_version": report.version,
        "eval_s": s["seconds"],
    }


def _tensor_copy(value: Any) -> torch.Tensor:
    """A tensor of its own: a copy of a tensor (local mode), or of an array (from Ray)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return torch.from_numpy(np.array(value))  # np.array copies: the store's view is read-only


def best_return(run: RunDir) -> float | None:
    """The score of the run's best.pt, None when it has none (or an unreadable one)."""
    path = run.checkpoints / BEST_NAME
    if not path.is_file() or path.is_symlink():
        return None
    try:
        score = load_checkpoint(path).learner.get("eval", {}).get("return_mean")
    except (CheckpointError, AttributeError):
        return None
    return float(score) if isinstance(score, int | float) and not isinstance(score, bool) else None


class Evaluations:
    """The run's evaluations: when they fall due, what they report, the videos and best.pt."""

    def __init__(self, cfg: RelayConfig, run: RunDir, runner: EvalRunner, env: EnvSpec | None) -> None:
        self.cfg, self.run, self.runner, self.env = cfg, run, runner, env
        self.submitted = 0
        self.best = best_return(run) if cfg.checkpoint.keep_best else None
        self.last_return: float | None = None
        self._said: set[str] = set()  # notes already printed (an env that cannot render: once)

    def take_finished(self, counters: RunCounters) -> dict[str, Any]:
        """A finished evaluation's metrics for this iteration's line (its best model saved), or {}."""
        done = self.runner.poll()
        return self._take(*done, counters) if done is not None else {}

    def start_if_due(self, iteration: int) -> None:
        """Start this iteration's evaluation when one is due and none runs. (A language run's
        runs to its end here: the loop calls this outside its signal hold, so a stop cuts it.)"""
        ev = self.cfg.eval
        if iteration % ev.every_iterations == 0 and not self.runner.busy():
            video = ev.video_every > 0 and self.submitted % ev.video_every == 0
            self.runner.submit(iteration, video)
            self.submitted += 1

    def _take(
        self, report: EvalReport, weights: Callable[[], Weights], counters: RunCounters
    ) -> dict[str, Any]:
        self.last_return = report.summary["return_mean"]
        if report.note:
            print(
                f"relay: evaluation at iteration {report.iteration}: {report.note}",
                file=sys.stderr,
                flush=True,
            )
        if report.video is not None and report.video_return is not None:
            stem = video_stem(f"iter-{report.iteration:06d}", report.video_return)
            write_numbered(self.run.root / "videos", stem, ".mp4", report.video)
        if self.cfg.checkpoint.keep_best and (self.best is None or self.last_return > self.best):
            self._save_best(report, weights(), counters)
            self.best = self.last_return
        return eval_metrics(report)

    def _save_best(self, report: EvalReport, weights: Weights, counters: RunCounters) -> None:
        learner = {
            # A copy: weights fetched from Ray's object store are read-only views of it.
            "model": {k: _tensor_copy(v) for k, v in without_versions(weights).items()},
            "version": report.version,
            "updates": 0,
            "eval": {**report.summary, "iteration": report.iteration},
        }
        ckpt = Checkpoint(learner, counters, config_data(self.cfg), self.env, family=self.cfg.family)
        buf = io.BytesIO()
        torch.save(ckpt.to_dict(), buf)
        self.run.checkpoints.mkdir(parents=True, exist_ok=True)
        atomic_write(self.run.checkpoints / BEST_NAME, buf.getvalue())

    def close(self) -> None:
        self.runner.close()
