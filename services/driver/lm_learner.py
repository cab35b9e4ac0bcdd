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
    """`LanguageLearner`'s calls, answered here or by the group's ranks (every rank takes each
    call; rank 0's answer is the run's). The calls the backend pipelines (`prepare_round`,
    `accept_generated`, `weights`, `train` submitted ahead) return the ranks' refs; `answer`
    fetches such calls' results."""

    def __init__(self, cfg: RelayConfig, remote: bool) -> None:
        self.local: LanguageLearner | None = None
        self.group: LearnerGroup | None = None
        if remote:
            self.group = LearnerGroup(cfg, language_ranks(cfg))
        else:
            self.local = LanguageLearner(cfg)

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

    def blind_ranks(self, path: str, token: str) -> list[str]:
        """The ranks (by rank and node) that do not read `token` in the driver's file `path`."""
        if self.group is None:
            return []
        seen = self.answer(self.group.each(lambda r: r.sees.remote(path, token)))
        nodes = self.answer(self.group.each(lambda r: r.node.remote()))
        return [f"rank {i} (node {nodes[i][:12]})" for i, ok in enumerate(seen) if not ok]

    def weights_ref(self) -> Any:
        """The packed weights for the generators, as rank 0's object ref (never fetched here).
        Every rank takes part (a sharded group gathers the whole weights first); the other ranks'
        calls are heard out before the ref is handed on, so a failed gather surfaces here."""
        refs = self.group_each(lambda r: r.weights.remote())
        if len(refs) > 1:
            self.answer(refs[1:])
        return refs[0]

    def prepare_round_refs(self) -> list[Any]:
        """Every rank's `prepare_round` of the next round (each keeps its rows; rank 0's answer,
        the whole round, is what the generators sample): the calls' refs, in rank order."""
        return self.group_each(lambda r: r.prepare_round.remote())

    def accept_generated_refs(self, parts: list[Any]) -> list[Any]:
        """Every rank's `accept_generated` of the generators' parts (object refs), not waited for."""
        return self.group_each(lambda r: r.accept_generated.remote(*parts))

    def group_each(self, call: Callable[[Any], Any]) -> list[Any]:
        assert self.group is not None, "the generators' calls need the learner group"
        return self.group.each(call)

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
