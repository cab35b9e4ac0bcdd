"""The learner of a language run behind one typed interface, in this process (local mode) or as
the learner group's ranks (`services/driver/learner_group.py`): the backend calls methods, never
method names, and a dead rank answers LearnerLost."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...contracts.config import RelayConfig
from ...contracts.prompts import merged_rounds
from ...learner.lm.learner import LanguageLearner
from ...services.driver.learner_group import LearnerGroup, language_ranks


class LanguageLearnerProxy:
    """`LanguageLearner`'s calls, answered here or by the group's lead rank. `actor`: its handle
    (local mode has none), for the calls the backend pipelines (`prepare_round`,
    `accept_generated`, `weights`, `train` submitted ahead); `answer` fetches such a call's
    result."""

    def __init__(self, cfg: RelayConfig, remote: bool) -> None:
        self.local: LanguageLearner | None = None
        self.group: LearnerGroup | None = None
        if remote:
            self.group = LearnerGroup(cfg, language_ranks(cfg))
        else:
            self.local = LanguageLearner(cfg)

    @property
    def actor(self) -> Any:
        assert self.group is not None, "a local learner has no actor"
        return self.group.lead

    answer = staticmethod(LearnerGroup.answer)

    def _all(self, call: Callable[[Any], Any], timeout_s: float | None = None) -> Any:
        """`call` on every rank (a sharded learner's collectives need them all): rank 0's answer."""
        assert self.group is not None
        return self.answer(self.group.each(call), timeout_s)[0]

    def describe(self) -> dict[str, Any]:
        return self.local.describe() if self.local else self._all(lambda r: r.describe.remote())

    def generate_round(self) -> dict[str, Any]:
        """The round's completions: each rank samples its rows (whole groups), in rank order."""
        if self.local:
            return self.local.generate_round()
        assert self.group is not None
        return merged_rounds(self.answer(self.group.each(lambda r: r.generate_round.remote())))

    def keep(self, groups: list[int]) -> None:
        if self.local:
            self.local.keep(groups)
        else:
            self._all(lambda r: r.keep.remote(groups))

    def evaluate(self, limit: int, greedy: bool) -> dict[str, Any]:
        if self.local:
            return self.local.evaluate(limit, greedy)
        return self._all(lambda r: r.evaluate.remote(limit, greedy))

    def acting_weights(self) -> dict[str, Any]:
        return self.local.acting_weights() if self.local else self._all(lambda r: r.acting_weights.remote())

    def train(self, rewards: list[float | None]) -> dict[str, Any]:
        """One update on the round, every rank given the whole round's rewards."""
        return self.local.train(rewards) if self.local else self.answer(self.submit_train(rewards))

    def submit_train(self, rewards: list[float | None]) -> list[Any]:
        """The update's calls on every rank, not waited for: `answer` takes them (rank 0's
        metrics are the round's)."""
        assert self.group is not None
        return self.group.each(lambda r: r.train.remote(rewards))

    def state_dict(
        self, in_flight: bool, timeout_s: float | None = None, shards: str | None = None
    ) -> dict[str, Any]:
        """The learner's state; with `shards`, every rank writes its shards there (rank 0's
        answer then holds the rest)."""
        if self.local:
            return self.local.state_dict(in_flight, shards)
        return self._all(lambda r: r.state_dict.remote(in_flight, shards), timeout_s)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.local:
            self.local.load_state_dict(state)
        else:
            self._all(lambda r: r.load_state_dict.remote(state))

    def restart(self) -> None:
        """A fresh learner: the group restarted (`LearnerGroup.restart`), or a new local one."""
        if self.group is not None:
            self.group.restart()
        else:
            assert self.local is not None
            self.local = LanguageLearner(self.local.cfg)

    def kill(self) -> None:
        """End the group's ranks (a local learner has nothing to end)."""
        if self.group is not None:
            self.group.kill()
