"""The language learner as a Ray actor (a rank of the learner group,
`services/driver/learner_group.py`): a thin shell around `LanguageLearner`, working in the driver's
folder (prompt paths are the user's)."""

from __future__ import annotations

import os
from typing import Any

import torch

from ...contracts.config import RelayConfig
from ...learner.lm.learner import LanguageLearner
from ...learner.rank import LearnerRank


class LanguageLearnerActor(LearnerRank):
    """`LanguageLearner`'s methods, called remotely."""

    def __init__(self, cfg_data: dict[str, Any], workdir: str) -> None:
        cfg = RelayConfig.model_validate(cfg_data)
        # As many intra-op threads as the CPUs Ray reserved for it (the env learner actor's rule):
        # a CPU learner's generation and update are the run's compute, set by learner.num_cpus.
        torch.set_num_threads(cfg.learner.num_cpus)
        if os.path.isdir(workdir):  # where this node has the driver's folder, relative paths mean it
            os.chdir(workdir)
        self.learner = LanguageLearner(cfg)
        self.dev = self.learner.dev

    def join_group(self, rank: int, world: int, address: str, port: int, timeout_s: float = 1800.0) -> int:
        """Join the learner group, then shard the policy over it (`LanguageLearner.shard`)."""
        super().join_group(rank, world, address, port, timeout_s)
        self.learner.shard(rank, world)
        return rank

    def describe(self) -> dict[str, Any]:
        return self.learner.describe()

    def generate_round(self) -> dict[str, Any]:
        return self.learner.generate_round()

    def prepare_round(self) -> dict[str, Any]:
        return self.learner.prepare_round()

    def accept_generated(self, *parts: dict[str, Any]) -> None:
        self.learner.accept_generated(*parts)

    def keep(self, groups: list[int]) -> None:
        self.learner.keep(groups)

    def weights(self) -> Any:
        return self.learner.weights()

    def acting_weights(self) -> dict[str, Any] | None:
        """The whole weights (every rank takes part in gathering them); rank 0 returns them."""
        weights = self.learner.acting_weights()
        return weights if self.rank == 0 else None

    def evaluate(self, limit: int, greedy: bool) -> dict[str, Any]:
        return self.learner.evaluate(limit, greedy)

    def train(self, rewards: list[float | None]) -> dict[str, Any]:
        return self.learner.train(rewards)

    def state_dict(self, in_flight: bool = False, shards: str | None = None) -> dict[str, Any] | None:
        """The learner's state (every rank takes part in gathering it, or writes its shards into
        `shards`); rank 0 returns it."""
        state = self.learner.state_dict(in_flight, shards)
        return state if self.rank == 0 else None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learner.load_state_dict(state)
