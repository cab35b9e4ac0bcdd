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

from ..contracts.algorithm import AlgorithmTraits
from ..contracts.config import RelayConfig
from ..contracts.policy_groups import group_configs, part_of
from ..contracts.spaces import EnvSpec
from ..policy.models import build_policy
from ..policy.weight_wires import wire_for
from ..rollout_workers.envs import EnvSpecError
from ..rollout_workers.evaluation import (
    MAX_EVAL_ENVS,
    EvalResult,
    build_eval_env,
    eval_env_config,
    play,
)
from ..rollout_workers.scenes import GroupScene, scene_config, scene_players
from ..rollout_workers.video import VideoError, encode_mp4
from ..rollout_workers.worker import adopt_workdir

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
    """Evaluations of one policy, or of every group of a run of policy groups: each group in its
    scene (rollout_workers/scenes.py), the others playing the same weights' policies."""

    def __init__(self, cfg: RelayConfig, spec: EnvSpec, traits: AlgorithmTraits) -> None:
        self.cfg, self.spec = cfg, spec
        if spec.groups:
            self.policies = {
                name: (spec.policy(name), build_policy(conf, spec.policy(name), traits.critic).eval())
                for name, conf in group_configs(cfg, spec).items()
            }
        else:
            self.policies = {"": (spec, build_policy(cfg, spec, traits.critic).eval())}
        self._envs: dict[tuple[bool, str], tuple[gym.vector.VectorEnv, str | None]] = {}
        self._cancel = threading.Event()  # set by `cancel` from another thread: stop playing now

    def _env(self, video: bool, focus: str) -> tuple[gym.vector.VectorEnv, str | None]:
        """The env `focus`'s episodes play in ("": the run's one policy), built once."""
        if (video, focus) not in self._envs:
            n = min(self.cfg.eval.episodes, MAX_EVAL_ENVS)
            ec = eval_env_config(self.cfg.env, n, video, self.policies[focus][0].columns)
            if focus:
                specs = {name: spec for name, (spec, _) in self.policies.items()}
                self._envs[video, focus] = build_eval_env(*scene_config(ec, focus, specs))
            else:
                self._envs[video, focus] = build_eval_env(ec)
        return self._envs[video, focus]

    def evaluate(
        self, iteration: int, version: int, weights: dict[str, np.ndarray | torch.Tensor], video: bool
    ) -> EvalReport:
        """Play eval.episodes episodes with `weights` (each group's: a video of the first group's
        scene); an env that cannot render still scores."""
        # Copies: arrays fetched from Ray's object store are read-only views of it.
        tensors = {
            k: v if isinstance(v, torch.Tensor) else torch.from_numpy(np.array(v)) for k, v in weights.items()
        }
        for name, (_, model) in self.policies.items():
            model.load_state_dict(part_of(tensors, name) if name else tensors)
        results = {name: self._play(name, video and k == 0) for k, name in enumerate(self.policies)}
        result, note = next(iter(results.values()))
        if self.spec.groups:
            summary = groups_summary({name: r.summary() for name, (r, _) in results.items()})
        else:
            summary = result.summary()
        report = EvalReport(iteration, version, summary, note=note)
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

    def _play(self, focus: str, video: bool) -> tuple[EvalResult, str | None]:
        try:
            envs, note = self._env(video, focus)
        except EnvSpecError as err:  # the env for videos: the run's own env already works
            envs, note = self._env(False, focus)[0], str(err)
        spec, model = self.policies[focus]
        ev = self.cfg.eval
        if focus:  # a view over the cached env, with acting steps seeded afresh every evaluation
            others = {name: p for name, p in self.policies.items() if name != focus}
            envs = GroupScene(envs, focus, scene_players(others, not ev.deterministic, self.cfg.env.seed))
        result = play(
            envs,
            spec,
            model,
            self.cfg.env,
            ev.episodes,
            self.cfg.env.seed,
            stochastic=not ev.deterministic,
            video=video,
            note=note,
            cancelled=self._cancel.is_set,
        )
        return result, note

    def cancel(self) -> None:
        """End an evaluation that is playing (from another thread); its report counts what it
        played."""
        self._cancel.set()

    def close(self) -> None:
        for envs, _ in self._envs.values():  # a scene's env: the GroupScene views never close it
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
        self.wire = wire_for(cfg)

    def evaluate(
        self, iteration: int, version: int, weights_ref: list[ray.ObjectRef], video: bool
    ) -> EvalReport:
        weights = self.wire.unpack(ray.get(weights_ref[0]))
        return self.evaluator.evaluate(iteration, version, weights, video)


def create_evaluator(cfg: RelayConfig, spec: EnvSpec, traits: AlgorithmTraits) -> Any:
    """The evaluation actor (eval.num_cpus CPUs; Ray restarts it once if it dies)."""
    cls = ray.remote(EvaluatorActor).options(num_cpus=cfg.eval.num_cpus, max_restarts=1)
    return cls.remote(cfg.model_dump(mode="json"), spec, traits, os.getcwd())


def groups_summary(groups: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One evaluation of every policy group (each group's `EvalResult.summary`, in its scene): the
    groups' mean of each return and length statistic (min and max: over all), counts and seconds
    summed, and each group's own under "groups"."""
    values = list(groups.values())
    out: dict[str, Any] = {
        k: float(np.mean([v[k] for v in values])) for k in ("return_mean", "return_std", "len_mean")
    }
    out["return_min"] = min(v["return_min"] for v in values)
    out["return_max"] = max(v["return_max"] for v in values)
    for k in ("episodes", "env_steps", "seconds"):
        out[k] = sum(v[k] for v in values)
    out["episodes_per_s"] = out["episodes"] / out["seconds"] if out["seconds"] > 0 else float("inf")
    out["groups"] = groups
    return out
