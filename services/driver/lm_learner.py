"""The learner of a language run behind one typed interface, in this process (local mode) or as a
Ray actor: the backend calls methods, never method names, and a dead actor answers LearnerLost."""

from __future__ import annotations

import os
from typing import Any

import ray

from ...contracts.config import RelayConfig
from ...learner.actor import learner_resources
from ...learner.device import ray_options
from ...learner.lm.actor import LanguageLearnerActor
from ...learner.lm.learner import LanguageLearner
from ...services.driver.loop import LearnerLost


class LanguageLearnerProxy:
    """`LanguageLearner`'s calls, answered here or by its actor. `actor`: the actor handle (None
    in local mode), for the calls the backend pipelines (`prepare_round`, `accept_generated`,
    `weights`, `train` submitted ahead) and places; `answer` fetches such a call's result."""

    def __init__(self, cfg: RelayConfig, remote: bool) -> None:
        self.local: LanguageLearner | None = None
        self.actor: Any = None
        if remote:
            options = ray_options(learner_resources(cfg))
            self.actor = (
                ray.remote(LanguageLearnerActor)
                .options(**options)
                .remote(cfg.model_dump(mode="json"), os.getcwd())
            )
        else:
            self.local = LanguageLearner(cfg)

    @staticmethod
    def answer(ref: Any, timeout_s: float | None = None) -> Any:
        """ray.get of a learner call; a dead learner actor becomes LearnerLost."""
        try:
            return ray.get(ref, timeout=timeout_s)
        except ray.exceptions.ActorDiedError as err:
            raise LearnerLost(str(err).splitlines()[0]) from None

    def describe(self) -> dict[str, Any]:
        return self.local.describe() if self.local else self.answer(self.actor.describe.remote())

    def generate_round(self) -> dict[str, Any]:
        return self.local.generate_round() if self.local else self.answer(self.actor.generate_round.remote())

    def keep(self, groups: list[int]) -> None:
        if self.local:
            self.local.keep(groups)
        else:
            self.answer(self.actor.keep.remote(groups))

    def evaluate(self, limit: int, greedy: bool) -> dict[str, Any]:
        if self.local:
            return self.local.evaluate(limit, greedy)
        return self.answer(self.actor.evaluate.remote(limit, greedy))

    def acting_weights(self) -> dict[str, Any]:
        return self.local.acting_weights() if self.local else self.answer(self.actor.acting_weights.remote())

    def train(self, rewards: list[float | None]) -> dict[str, Any]:
        return self.local.train(rewards) if self.local else self.answer(self.actor.train.remote(rewards))

    def state_dict(self, in_flight: bool, timeout_s: float | None = None) -> dict[str, Any]:
        if self.local:
            return self.local.state_dict(in_flight)
        return self.answer(self.actor.state_dict.remote(in_flight), timeout_s)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.local:
            self.local.load_state_dict(state)
        else:
            self.answer(self.actor.load_state_dict.remote(state))

    def kill(self) -> None:
        """End the actor (a local learner has nothing to end)."""
        if self.actor is not None:
            ray.kill(self.actor, no_restart=True)
