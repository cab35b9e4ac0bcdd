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

from ..contracts.config import RelayConfig
from .rewards import REWARD_FAULT_KINDS, resolve_rewards, score_batch
from .worker import adopt_workdir

Scored = tuple[list[float | None], dict[str, int], list[str]]


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


def _timed_out(n: int) -> Scored:
    faults = dict.fromkeys(REWARD_FAULT_KINDS, 0)
    faults["timeout"] = n
    return [None] * n, faults, []


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
        """(reward or None per completion, fault counts by kind, fault lines); `ids`: each
        completion's token ids (TRL's `completion_ids`)."""
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
        out: Scored = ([], dict.fromkeys(REWARD_FAULT_KINDS, 0), [])
        for i, (ref, (lo, hi)) in enumerate(zip(refs, bounds, strict=True)):
            part: Scored
            if ref in ready:
                try:
                    part = ray.get(ref)
                except ray.exceptions.RayError as err:  # the actor died inside the user's code
                    part = _timed_out(hi - lo)
                    part[1]["timeout"], part[1]["raised"] = 0, hi - lo
                    part[2].append(f"reward worker died: {type(err).__name__}")
                    self._replace(i)
            else:
                part = _timed_out(hi - lo)
                part[2].append(f"rewards ran past prompts.reward_timeout_s={self.timeout_s}")
                self._replace(i)
            out[0].extend(part[0])
            for kind, count in part[1].items():
                out[1][kind] += count
            out[2].extend(part[2])
        return out

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
        out = _timed_out(len(completions))
        return out[0], out[1], [line]

    def _replace(self, i: int) -> None:
        ray.kill(self.actors[i], no_restart=True)
        self.actors[i] = self._actor()
        self.replaced += 1

    def close(self) -> None:
        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors = []
