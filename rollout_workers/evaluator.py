"""Evaluation during training: episodes of published weights, away from the rollout workers and
the learner, so neither waits for it.

`Evaluator` (no Ray) holds a CPU copy of the policy and the envs (one with rgb_array rendering,
built when a video is first asked for); `EvaluatorActor` is its thin Ray shell, fetching the
weights by ref as the rollout workers do. Every evaluation plays on the same env seeds (the
evaluation stream of the run's seed), so two evaluations differ by the policy alone and the best
one is the best policy, not the luckiest seeds.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import ray
import torch

from contracts.algorithm import AlgorithmTraits
from contracts.config import RelayConfig
from contracts.spaces import EnvSpec
from policy.models import build_policy
from rollout_workers.envs import EnvSpecError
from rollout_workers.evaluation import (
    MAX_EVAL_ENVS,
    build_eval_env,
    eval_env_config,
    play,
)
from rollout_workers.video import VideoError, encode_mp4
from rollout_workers.worker import adopt_workdir

EVAL_NICENESS = 10  # the evaluation actor's nice level: it runs on CPU training leaves idle


@dataclass
class EvalReport:
    """One evaluation: of the weights published at `iteration` (`version`), the episodes' summary
    (`EvalResult.summary`), and an MP4 of one episode when asked for (or why there is none)."""

    iteration: int
    version: int
    summary: dict[str, Any]
    video: bytes | None = None
    video_return: float | None = None
    note: str | None = None


class Evaluator:
    def __init__(self, cfg: RelayConfig, spec: EnvSpec, traits: AlgorithmTraits) -> None:
        self.cfg, self.spec = cfg, spec
        self.model = build_policy(cfg, spec, traits.critic).eval()
        self._envs: dict[bool, tuple[gym.vector.VectorEnv, str | None]] = {}
        self._cancel = threading.Event()  # set by `cancel` from another thread: stop playing now

    def _env(self, video: bool) -> tuple[gym.vector.VectorEnv, str | None]:
        if video not in self._envs:
            n = min(self.cfg.eval.episodes, MAX_EVAL_ENVS)
            self._envs[video] = build_eval_env(eval_env_config(self.cfg.env, n, video, self.spec.columns))
        return self._envs[video]

    def evaluate(
        self, iteration: int, version: int, weights: dict[str, np.ndarray | torch.Tensor], video: bool
    ) -> EvalReport:
        """Play eval.episodes episodes with `weights`; an env that cannot render still scores."""
        # Copies: arrays fetched from Ray's object store are read-only views of it.
        self.model.load_state_dict(
            {
                k: v if isinstance(v, torch.Tensor) else torch.from_numpy(np.array(v))
                for k, v in weights.items()
            }
        )
        try:
            envs, note = self._env(video)
        except EnvSpecError as err:  # the env for videos: the run's own env already works
            envs, note = self._env(False)[0], str(err)
        ev = self.cfg.eval
        result = play(
            envs,
            self.spec,
            self.model,
            self.cfg.env,
            ev.episodes,
            self.cfg.env.seed,
            stochastic=not ev.deterministic,
            video=video,
            note=note,
            cancelled=self._cancel.is_set,
        )
        report = EvalReport(iteration, version, result.summary(), note=note)
        frames = result.frames
        if frames is not None and frames.images and frames.episode_return is not None:
            meta = {"title": f"iteration {iteration}", "comment": f"return {frames.episode_return:g}"}
            try:
                report.video, report.video_return = (
                    encode_mp4(frames.images, frames.fps, meta),
                    frames.episode_return,
                )
            except VideoError as err:
                report.note = str(err)
        elif frames is not None and frames.note:
            report.note = frames.note
        return report

    def cancel(self) -> None:
        """End an evaluation that is playing (from another thread); its report counts what it
        played."""
        self._cancel.set()

    def close(self) -> None:
        for envs, _ in self._envs.values():
            with contextlib.suppress(Exception):
                envs.close()


class EvaluatorActor:
    """The evaluator on a CPU of the cluster; weights arrive by ref (inside a list: not resolved)."""

    def __init__(
        self, cfg_data: dict[str, Any], spec: EnvSpec, traits: AlgorithmTraits, workdir: str
    ) -> None:
        torch.set_num_threads(1)
        # Below the rollout workers and the learner in the OS scheduler's eyes: on a busy node the
        # evaluation waits for idle CPU instead of taking it from training.
        with contextlib.suppress(OSError, AttributeError):
            os.nice(EVAL_NICENESS)
        cfg = RelayConfig.model_validate(cfg_data)
        adopt_workdir(workdir, cfg)
        self.evaluator = Evaluator(cfg, spec, traits)

    def evaluate(
        self, iteration: int, version: int, weights_ref: list[ray.ObjectRef], video: bool
    ) -> EvalReport:
        return self.evaluator.evaluate(iteration, version, ray.get(weights_ref[0]), video)


def create_evaluator(cfg: RelayConfig, spec: EnvSpec, traits: AlgorithmTraits) -> Any:
    """The evaluation actor (eval.num_cpus CPUs; Ray restarts it once if it dies)."""
    cls = ray.remote(EvaluatorActor).options(num_cpus=cfg.eval.num_cpus, max_restarts=1)
    return cls.remote(cfg.model_dump(mode="json"), spec, traits, os.getcwd())
