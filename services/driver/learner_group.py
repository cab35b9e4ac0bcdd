"""The learner group of a run, for every family: N learner ranks as Ray actors, one device each.

The group owns what the ranks have in common whatever they train: their creation (before any
rollout worker or reward actor, so those can never take what a learner needs), their placement
(reported, then refused after rollout.placement_timeout_s), the rendezvous that joins them in one
torch process group, the fault rule (a dead rank is `LearnerLost`, heard out over every rank's
call), restarts (the whole group: a survivor's process group died with its peer) and the state a
checkpoint reads (rank 0's). The backends own what a round is.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import GetTimeoutError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ...contracts.config import RelayConfig
from ...contracts.spaces import EnvSpec
from ...learner.actor import create_learner_actor, learner_resources
from ...learner.device import ray_options
from ...learner.lm.actor import LanguageLearnerActor
from ...services.driver.cluster import wait_until_placed
from ...services.driver.loop import LearnerLost
from ...services.runs.signals import signals_held

# A new rank's actor handle, not yet placed, from the Ray options that place it (its bundle).
RankFactory = Callable[..., Any]


def env_ranks(cfg: RelayConfig, env_spec: EnvSpec) -> RankFactory:
    """An env run's learner rank: `LearnerActor` over the probed spec."""
    return lambda **placed: create_learner_actor(cfg, env_spec, **placed)


def language_ranks(cfg: RelayConfig) -> RankFactory:
    """A language run's learner rank: `LanguageLearnerActor`, working in the driver's folder."""

    def make(**placed: Any) -> Any:
        options = {**ray_options(learner_resources(cfg)), **placed}
        return (
            ray.remote(LanguageLearnerActor)
            .options(**options)
            .remote(cfg.model_dump(mode="json"), os.getcwd())
        )

    return make


class LearnerGroup:
    """`learner.num_learners` ranks made by `make_rank`, placed and joined (see the module
    docstring). `lead` is rank 0; `ranks` all of them, in rank order."""

    def __init__(self, cfg: RelayConfig, make_rank: RankFactory) -> None:
        self.cfg = cfg
        self._make_rank = make_rank
        self.ranks: list[Any] = []
        self.placement: PlacementGroup | None = None  # N > 1: one bundle per rank, packed per node
        self.nodes: list[str] = []  # each rank's node (N > 1)
        self.started = 0  # groups started: 1, then one more per restart
        self._start()

    def _start(self) -> None:
        n = self.cfg.learner.num_learners
        try:
            if n == 1:
                self.ranks = [self._make_rank()]
            else:
                # One placement group: the ranks are placed together or not at all (a group half
                # placed would hold devices while it waits), packed onto as few nodes as take them.
                self.placement = placement_group([learner_resources(self.cfg)] * n, strategy="PACK")
                self.ranks = [
                    self._make_rank(scheduling_strategy=PlacementGroupSchedulingStrategy(self.placement, k))
                    for k in range(n)
                ]
            wait_until_placed(self.cfg, {"learner": self.ranks})
            if n > 1:
                self._order_by_node()
                self._join()
        except BaseException:  # unplaceable, interrupted: no rank is left pending behind us
            self.kill()
            raise
        self.started += 1

    def _order_by_node(self) -> None:
        """Ranks on one node take consecutive ranks, nodes in a stable order (their ids), each
        node's in bundle order: the rank a shard file or a device gets does not move between
        starts of the same placement."""
        nodes = self.answer([r.node.remote() for r in self.ranks])
        order = sorted(range(len(self.ranks)), key=lambda k: (nodes[k], k))
        self.ranks = [self.ranks[k] for k in order]
        self.nodes = [nodes[k] for k in order]

    def _join(self) -> None:
        """One torch process group over the ranks; rank 0 hosts its rendezvous."""
        address, port = self.answer(self.lead.rendezvous.remote())
        n = len(self.ranks)
        timeout = self.cfg.learner.collective_timeout_s
        self.answer([r.join_group.remote(k, n, address, port, timeout) for k, r in enumerate(self.ranks)])

    @property
    def lead(self) -> Any:
        """Rank 0: it publishes the weights, reports the run-wide metrics and holds the state."""
        return self.ranks[0]

    def __len__(self) -> int:
        return len(self.ranks)

    def each(self, call: Callable[[Any], Any]) -> list[Any]:
        """`call(rank)` on every rank, in rank order: the calls' refs. Submitted as one: a stop
        signal waits until every rank has the call (a signal between two submissions would leave
        a rank without a call its peers make collectives in, and the stop's own calls, its final
        checkpoint's, would then meet those collectives out of step)."""
        with signals_held():
            return [call(rank) for rank in self.ranks]

    @staticmethod
    def answer(refs: Any, timeout_s: float | None = None) -> Any:
        """ray.get of one learner call or a list of them; a dead rank becomes LearnerLost.

        A list is taken as its calls finish: a survivor of a dead peer blocks in its collective,
        so waiting for the calls in order could wait forever. A survivor's collective may also fail
        (the peer's connection reset) before the dead peer's call reports: every call is heard
        out, and a death among them wins over the errors it caused.
        """
        try:
            if not isinstance(refs, list):
                return ray.get(refs, timeout=timeout_s)
            pending, results, failed = list(refs), {}, None
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while pending:
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                done, pending = ray.wait(pending, num_returns=1, timeout=left)
                if not done:
                    raise GetTimeoutError(f"the learner did not answer within {timeout_s} s")
                try:
                    results[done[0]] = ray.get(done[0])
                except ray.exceptions.RayTaskError as err:
                    failed = failed or err
            if failed is not None:
                raise failed
            return [results[ref] for ref in refs]
        except ray.exceptions.RayActorError as err:
            raise LearnerLost(str(err).splitlines()[0]) from None

    def demand(self) -> list[dict[str, float]]:
        """The ranks' resource bundles, for the autoscaler's standing request."""
        return [learner_resources(self.cfg)] * len(self.ranks)

    def restart(self) -> None:
        """Fresh ranks, the whole group (a survivor's process group died with its peer); their
        state comes from the newest checkpoint, loaded by the caller."""
        self.kill()
        self._start()

    def kill(self) -> None:
        for rank in self.ranks:
            ray.kill(rank, no_restart=True)
        self.ranks = []
        if self.placement is not None:
            remove_placement_group(self.placement)
            self.placement = None
