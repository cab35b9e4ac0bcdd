"""Where rewards run: CPU Ray actors beside the learner (`rollout.num_workers` of them), or this
process in local mode. Each batch of completions is split across the actors; a call past
`prompts.reward_timeout_s` is a `timeout` fault for its completions and its actor is replaced
(a hung function cannot be interrupted, only ended with its process).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import ray
import torch

from ...contracts.config import RelayConfig
from ..worker import adopt_workdir
from .rewards import Scored, faulted, resolve_rewards, score_batch


class RewardScorer:
    """The run's reward functions, resolved in the process that runs them."""

    def __init__(self, cfg_data: dict[str, Any], workdir: str | None = None) -> None:
        cfg = RelayConfig.model_validate(cfg_data)
        if workdir is not None:  # an actor of its own: one thread, the user's folder
            torch.set_num_threads(1)
            adopt_workdir(workdir, cfg)
        self.fns = resolve_rewards(cfg.prompts.rewards)
        self.weights = cfg.prompts.reward_weights or [1.0] * len(self.fns)

    def score(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, list[Any]], ids: list[list[int]]
    ) -> Scored:
        return score_batch(self.fns, self.weights, prompts, completions, columns, ids)


class RewardPool:
    """Scores completions with the run's rewards under a time limit (see the module docstring)."""

    def __init__(self, cfg: RelayConfig) -> None:
        self.cfg = cfg
        self.timeout_s = cfg.prompts.reward_timeout_s
        self.actors: list[Any] = []
        self.local: RewardScorer | None = None
        self.replaced = 0
        if cfg.rollout.num_workers == 0 or not ray.is_initialized():
            self.local = RewardScorer(cfg.model_dump(mode="json"))
        else:
            self.actors = [self._actor() for _ in range(cfg.rollout.num_workers)]

    def _actor(self) -> Any:
        cls = ray.remote(RewardScorer).options(num_cpus=self.cfg.rollout.num_cpus_per_worker, max_restarts=0)
        return cls.remote(self.cfg.model_dump(mode="json"), os.getcwd())

    def score(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, list[Any]], ids: list[list[int]]
    ) -> Scored:
        """The batch's scores (rollout_workers.lm.rewards.Scored); `ids`: each completion's token ids
        (TRL's `completion_ids`)."""
        if self.local is not None:
            return self._score_here(prompts, completions, columns, ids)
        n, k = len(completions), len(self.actors)
        bounds = [(i * n // k, (i + 1) * n // k) for i in range(k)]
        refs = [
            a.score.remote(
                prompts[lo:hi], completions[lo:hi], {c: v[lo:hi] for c, v in columns.items()}, ids[lo:hi]
            )
            for a, (lo, hi) in zip(self.actors, bounds, strict=True)
        ]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.timeout_s)
        parts: list[Scored] = []
        n_fns = len(self.cfg.prompts.rewards)
        for i, (ref, (lo, hi)) in enumerate(zip(refs, bounds, strict=True)):
            if ref in ready:
                try:
                    parts.append(ray.get(ref))
                    continue
                except ray.exceptions.RayError as err:  # the actor died inside the user's code
                    parts.append(
                        faulted(hi - lo, "raised", f"reward worker died: {type(err).__name__}", n_fns)
                    )
            else:
                line = f"rewards ran past prompts.reward_timeout_s={self.timeout_s}"
                parts.append(faulted(hi - lo, "timeout", line, n_fns))
            self._replace(i)
        return Scored.concat(parts)

    def _score_here(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, list[Any]], ids: list[list[int]]
    ) -> Scored:
        """In this process, on a daemon thread (one that hangs is left behind, never joined at exit)."""
        assert self.local is not None
        box: list[Scored] = []
        thread = threading.Thread(
            target=lambda: box.append(self.local.score(prompts, completions, columns, ids)),  # type: ignore[union-attr]
            name="relay-reward",
            daemon=True,
        )
        thread.start()
        thread.join(self.timeout_s)
        if box:
            return box[0]
        self.replaced += 1
        line = f"rewards ran past prompts.reward_timeout_s={self.timeout_s}"
        if thread.is_alive():
            line += " (local mode leaves the thread running: rollout.num_workers >= 1 ends hung rewards)"
        return faulted(len(completions), "timeout", line, len(self.cfg.prompts.rewards))

    def _replace(self, i: int) -> None:
        """End actor i and start another in its place, waiting until it runs: its start-up
        (imports, the user's module) is not the next batch's time limit."""
        ray.kill(self.actors[i], no_restart=True)
        self.actors[i] = self._actor()
        ray.get(self.actors[i].__ray_ready__.remote(), timeout=self.cfg.rollout.placement_timeout_s)
        self.replaced += 1

    def close(self) -> None:
        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors = []
