"""The backend of a reward model's run (`model.kind: reward_model`): each round the learner takes
prompts.batch_size preference pairs and updates the scorer on them, in the driver's process on
the learner's device (a reward model's run has no rollout: nothing to place on a fleet).

It is a `Backend` like the env and language backends, so the driver loop, checkpoints, resume,
signals, sweeps, the dashboard and tracking are the same code. In a reward model's run an
"episode" is a pair, its return 1 where the chosen side scored above the rejected one and 0
otherwise (so the return mean is the pair accuracy), an env step a trained token; an evaluation
scores prompts.eval's held-out pairs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...contracts.config import RelayConfig
from ...contracts.pairs import PairSet, load_pairs
from ...contracts.rounds import RoundResult
from ...learner.lm.reward_model import RewardModelLearner, RewardModelSetup, pair_summary
from ...rollout_workers.evaluator import EvalReport
from ...services.driver.evaluations import EvalRunner
from ...services.runs.signals import signals_held


class PreferenceBackend:
    """Updates of a reward model on pairs, in this process (see the module docstring)."""

    @staticmethod
    def actors_per_worker(cfg: RelayConfig) -> int:
        return 0  # no rollout workers

    def __init__(self, cfg: RelayConfig, spec: None = None) -> None:
        self.cfg = cfg
        self.env_spec = None  # no env: its checkpoints record none
        self.sharded_checkpoints = False
        self.setup = RewardModelSetup.of(cfg)
        self.learner = RewardModelLearner(self.setup)
        self.held: PairSet | None = None
        if cfg.prompts.eval is not None:
            tokenizer, limit = self.learner.tokenizer, self.setup.max_tokens
            self.held = load_pairs(cfg.prompts.eval, tokenizer, limit, "prompts.eval")
        self.pairs = 0
        self._round: RoundResult | None = None  # the round `step` made, until the loop has `taken` it

    @property
    def num_workers(self) -> int:
        return 0

    def describe(self) -> dict[str, Any]:
        info = self.learner.describe()
        fleet = f"{info['pairs']} pairs, {info['trained_params']:,} parameters trained"
        return {"mode": "reward model (local)", "workers": 0, "fleet": fleet, **info}

    def step(self, progress: float, ahead: bool = False, state_after: bool = False) -> RoundResult:
        """One update on the next prompts.batch_size pairs. It runs in this thread with the stop
        signals held: a stop waits for it (cut halfway, it would leave weights between two
        updates), and the round is counted with it."""
        with signals_held():
            metrics = self.learner.train()
            self._round = self._result(metrics)
        return self._round

    def _result(self, metrics: dict[str, Any]) -> RoundResult:
        correct, tokens = metrics.pop("correct"), int(metrics.pop("tokens"))
        skipped = int(metrics.pop("amp_skipped"))
        self.pairs += len(correct)
        update_s = float(metrics["update_s"])
        return RoundResult(
            env_steps=tokens,
            episode_returns=correct,
            episode_lengths=[0] * len(correct),
            metrics={**metrics, "pairs": self.pairs, "version": self.learner.updates},
            amp_skipped_steps=skipped,
            phases={"update_s": update_s, "wait_s": 0.0},
        )

    def drain(self, timeout_s: float | None = None) -> RoundResult | None:
        """The round a stop kept the loop from counting, or None (the update itself ran whole)."""
        return self._round

    def taken(self) -> None:
        self._round = None

    def stop_sampling(self) -> None:
        pass  # nothing samples

    def worker_pids(self) -> list[int]:
        return []

    def state_dict(self, timeout_s: float | None = None, shards: Path | None = None) -> dict[str, Any]:
        return {**self.learner.state_dict(), "pairs": self.pairs}

    def storage_problem(self, root: Path) -> str | None:
        return None  # the learner writes where the driver does: it is the driver

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learner.load_state_dict(state)
        self.pairs = int(state.get("pairs", 0))
        self._round = None  # the loop drained it before the restore

    def restart_learner(self) -> None:
        self.learner = RewardModelLearner(self.setup)
        self._round = None

    def evaluation_runner(self) -> EvalRunner:
        return PreferenceEvalRunner(self)

    def reseed_workers(self, stream: int) -> None:
        pass  # the pairs' order is the learner's state

    def close(self) -> None:
        pass


class PreferenceEvalRunner:
    """Evaluations of a reward model's run: prompts.eval's pairs scored by the model as it is (the
    first eval.episodes of them), its return the pair accuracy. It runs between rounds, on the
    learner's device, so `submit` finishes it and `poll` hands it over."""

    def __init__(self, backend: PreferenceBackend) -> None:
        self.backend = backend
        self._done: tuple[EvalReport, Callable[[], dict[str, Any]]] | None = None

    def busy(self) -> bool:
        return False

    def submit(self, iteration: int, video: bool) -> None:
        b = self.backend
        assert b.held is not None, "the config's rules ask for prompts.eval"
        t0 = time.perf_counter()
        out = b.learner.evaluate(b.held.head(b.cfg.eval.episodes))
        summary = pair_summary(out["correct"], out["tokens"], time.perf_counter() - t0)
        weights = b.learner.weights()
        self._done = (EvalReport(iteration, b.learner.updates, summary), lambda: weights)

    def poll(self) -> tuple[EvalReport, Callable[[], dict[str, Any]]] | None:
        done, self._done = self._done, None
        return done

    def close(self) -> None:
        pass
