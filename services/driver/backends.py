"""Where sampling and learning run: in-process (local mode) or as Ray actors (sync or async).

Both expose `step(progress) -> RoundResult`, so the driver loop does not know which one it drives.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from pathlib import Path
from typing import Any, cast

import ray
from ray.autoscaler.sdk import request_resources

from ...contracts.config import RelayConfig
from ...contracts.rounds import Publication, RoundResult
from ...contracts.spaces import EnvSpec
from ...learner.actor import from_host
from ...learner.algorithms import algorithm_traits
from ...learner.policy_groups import make_learner
from ...policy.weight_wires import wire_for
from ...rollout_workers.evaluator import Evaluator, create_evaluator
from ...rollout_workers.sampler import make_sampler
from ...rollout_workers.worker import create_rollout_workers, worker_resources
from ...services.driver.checks import PreflightError
from ...services.driver.cluster import wait_until_placed
from ...services.driver.evaluations import ActorEvalRunner, EvalRunner, ThreadEvalRunner
from ...services.driver.health import FleetHealth, actor_record
from ...services.driver.learner_group import LearnerGroup, env_ranks
from ...services.driver.watchdog import LocalStuckReporter, SegmentWatchdog
from ...services.runs.signals import signals_held


class LocalBackend:
    sharded_checkpoints = False  # an env learner's checkpoints are whole
    """Sampler and learner in this process: the same code as the actors, for debugging and tests."""

    def __init__(self, cfg: RelayConfig, env_spec: EnvSpec | None = None) -> None:
        # (the env spec preflight found: the local sampler reads its own)
        self.sampler = make_sampler(cfg, algorithm_traits(cfg), 0)
        self.env_spec = self.sampler.spec
        self.learner = make_learner(cfg, self.env_spec)
        self.wire = wire_for(cfg)
        self.stuck_reporter = LocalStuckReporter(SegmentWatchdog(cfg.rollout.segment_timeout_s))
        self._untaken: RoundResult | None = None  # a round trained that `step` could not return

    @staticmethod
    def actors_per_worker(cfg: RelayConfig) -> int:
        """Actors of rollout.num_cpus_per_worker CPUs per rollout worker (none run here)."""
        return 0

    def describe(self) -> dict[str, Any]:
        return {"mode": "local", "device": str(self.learner.dev), "workers": 0, "fleet": "no workers"}

    @property
    def num_workers(self) -> int:
        return 0

    def step(self, progress: float, ahead: bool = False, state_after: bool = False) -> RoundResult:
        """One round (`ahead` and `state_after` have no meaning here: one process samples, then
        learns, and its state is read in between)."""
        if self.sampler.version != self.learner.version:
            # through the run's wire, as a Ray worker receives them: both modes act on the same bits
            packed = self.wire.pack(self.learner.weights())
            self.sampler.set_weights(self.learner.version, self.wire.unpack(packed))
        t0 = time.perf_counter()
        with self.stuck_reporter:
            sampled = self.sampler.sample()  # the learner waits for it: one process does both
        # A stop waits for the update: cut halfway, it would leave weights between two versions
        # for the final checkpoint. The round then reaches the loop through `drain`.
        with signals_held():
            self._untaken = self.learner.train_round(
                [sampled],  # type: ignore[list-item]
                progress,
                wait_s=time.perf_counter() - t0,
            )
        return self._untaken

    def drain(self, timeout_s: float | None = None) -> RoundResult | None:
        """The round a stop signal met as `step` ended, once (no round ever runs ahead here)."""
        out, self._untaken = self._untaken, None
        return out

    def taken(self) -> None:
        self._untaken = None  # the loop counts step's round

    def stop_sampling(self) -> None:
        pass  # the sampler runs in this process: a stop already interrupted it

    def worker_pids(self) -> list[int]:
        return []  # the sampler is the driver itself

    def storage_problem(self, root: Path) -> str | None:
        return None  # whole checkpoints: the driver writes them

    def state_dict(self, timeout_s: float | None = None, shards: Path | None = None) -> dict[str, Any]:
        assert shards is None, "an env learner's checkpoints are whole"
        return self.learner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learner.load_state_dict(state)

    def restart_learner(self) -> None:
        self.learner = make_learner(self.learner.cfg, self.env_spec)

    def reseed_workers(self, stream: int) -> None:
        self.sampler.reseed(stream)

    def evaluation_runner(self) -> EvalRunner:
        evaluator = Evaluator(self.learner.cfg, self.env_spec, algorithm_traits(self.learner.cfg))
        return ThreadEvalRunner(evaluator, lambda: (self.learner.version, self.learner.weights()))

    def close(self) -> None:
        self.sampler.close()


class RayBackend:
    sharded_checkpoints = False  # an env learner's checkpoints are whole (rank 0's)
    """Rollout worker actors + learner actors. Segments go worker -> learner by object ref.

    sync: each round, every worker samples once with the current weights (policy lag 0); the next
    round is submitted as soon as an update publishes its weights, so driver bookkeeping overlaps it.
    async: workers keep up to `max_segments_in_flight` samples outstanding while the learner
    updates; submissions stop while a backlog waits, so object-store use stays bounded. A round
    may run ahead (`step(ahead=True)`): the next round's call is submitted while this one trains,
    as soon as its segments are ready, so the learner starts it the moment this one ends instead
    of idling while this round's result travels to the driver and the loop writes its line (5 ms
    of a 42 ms CartPole round); `drain` takes such a call's result.
    """

    @staticmethod
    def actors_per_worker(cfg: RelayConfig) -> int:
        """Actors of rollout.num_cpus_per_worker CPUs per rollout worker: the worker."""
        return 1

    def __init__(self, cfg: RelayConfig, env_spec: EnvSpec) -> None:
        self.cfg = cfg
        self.env_spec = env_spec
        self.workers: list[Any] = []
        self.group: LearnerGroup | None = None
        try:
            # The learners are placed before any rollout worker is created, so workers can never
            # take the CPUs a learner needs.
            self.group = LearnerGroup(cfg, env_ranks(cfg, env_spec))
            self.workers = create_rollout_workers(cfg, algorithm_traits(cfg))
            wait_until_placed(cfg, {"rollout worker": self.workers})
            check_worker_spec(cfg, env_spec, self.workers[0])
        except BaseException:  # unplaceable, interrupted: no actor is left pending behind us
            self.close()
            raise
        self._take_weights(self._publish_now())
        self._in_flight: dict[Any, tuple[Any, int]] = {}  # ref -> (worker, submission number)
        self._ready: list[tuple[int, Any]] = []  # (submission number, ref)
        self._submitted = 0
        self._next_round: dict[Any, Any] | None = None  # sync: the round already sampling {ref: worker}
        # Rounds submitted to the learner whose results are not taken yet, oldest first: the
        # round training and (async, run ahead) the next one; each [(info ref, weights ref)].
        self._rounds: deque[list[Any]] = deque()
        self._returned = False  # whether `_rounds[0]` was returned by step or drain (see `taken`)
        self._taken = 0  # rounds taken so far
        # The learner's state asked for behind a round and before the round run ahead of it
        # (`step(state_after=True)`): (its ref, the count of rounds taken once that round is).
        self._state_after: tuple[Any, int] | None = None
        self._retiring: list[Any] = []  # workers taking no new samples, killed once drained
        self._next_index = len(self.workers)  # worker indices name seeds: never reused
        self.health = FleetHealth(cfg, self.workers)

    @property
    def learners(self) -> LearnerGroup:
        """The learner group (open while the backend is)."""
        assert self.group is not None, "the backend is closed"
        return self.group

    def _publish_now(self) -> Publication:
        """The learner's current weights, in an object this driver owns (a call's return)."""
        info, weights = self.learners.lead.publish.remote()
        published: Publication = self.learners.answer(info)
        return published.carrying(weights)

    def _take_weights(self, published: Publication) -> None:
        """Workers sample with these weights from now on (they fetch the ref themselves)."""
        self.version, self.weights_ref = published.version, published.refs

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    def describe(self) -> dict[str, Any]:
        info = self.learners.answer(self.learners.lead.describe.remote())
        n = len(self.workers)
        fleet = f"{n} rollout worker{'s' * (n != 1)}" + f" x {len(self.learners)} learners" * (
            len(self.learners) > 1
        )
        return {"mode": self.cfg.rollout.mode, "workers": n, "fleet": fleet, **info}

    def _sample_round(self) -> dict[Any, Any]:
        """Every worker samples once with the current weights: {segment ref: worker}."""
        refs = {w.sample.remote(self.version, self.weights_ref): w for w in self.workers}
        for worker in self.workers:
            self.health.watchdog.started(worker)
        return refs

    def step(self, progress: float, ahead: bool = False, state_after: bool = False) -> RoundResult:
        """One round: the learner trains on a round of segments and publishes. With `ahead` (async
        mode) the round after it is submitted behind it before this one's result is in; with
        `state_after` too (the loop checkpoints this round), the learner's state is asked for in
        between, so the checkpoint reads the state after this round while the learner trains the
        next one, instead of the learner waiting for the checkpoint."""
        if self._returned:  # the caller asks for the next round: it counted the last one
            self.taken()
        sampling: dict[Any, Any] = {}
        if not self._rounds:
            if self.cfg.rollout.mode == "sync":
                sampling, self._next_round = self._next_round or self._sample_round(), None
                self._submit(list(sampling), progress, [])
            else:
                refs = self._next_async_round()
                self._submit(refs, progress, self._upcoming())
        calls = self._rounds[0]
        if ahead and self.cfg.rollout.mode == "async" and len(self._rounds) == 1:
            if state_after:  # an actor runs its calls in order: after this round, before the next
                self._state_after = (self.learners.lead.state_dict.remote(), self._taken + 1)
            self._submit_ahead(calls, self._progress_after(progress))
        # A stuck worker would hold the learner's fetch forever.
        self.health.watch([info for info, _ in calls], sampling)
        out = self._result(calls)
        if self.cfg.rollout.mode == "sync":
            # The next round starts sampling with the new weights now (policy lag stays 0), so
            # the driver's metrics and checkpoint writing overlap it instead of delaying it.
            self._next_round = self._sample_round()
        self._returned = True  # kept until `taken`: a stop before the loop counts it leaves it to `drain`
        return out

    def drain(self, timeout_s: float | None = None) -> RoundResult | None:
        """The oldest submitted round's result not yet taken (one a stop interrupted, one
        submitted ahead, one `step` returned that a stop kept the loop from counting), or None.
        Taken before the learner's state is read, so that its state and the run's counters stay
        one."""
        if not self._rounds:
            return None
        # The fleet's accounting stays out of it: after a signal the workers were ended on
        # purpose (stop_sampling), which is no fleet lost.
        out = self._result(self._rounds[0], timeout_s, drop_dead=False)
        self._returned = True
        return out

    def taken(self) -> None:
        """The round `step` or `drain` last returned is counted (the loop calls this with stop
        signals held, as it counts it): forget it."""
        if self._returned:
            self._rounds.popleft()
            self._taken += 1
            self._returned = False

    def _submit(self, refs: list[Any], progress: float, upcoming: list[Any]) -> None:
        """A round's learner calls, submitted and recorded in `_rounds` with stop signals held: a
        stop landing between the two would leave a round the learner trains that no one takes
        (the final checkpoint's version one past its iteration). A signal that arrives while Ray
        submits is run by Python as soon as the call returns, so that gap is not a rare one."""
        with signals_held():
            self._rounds.append(self._train(refs, progress, upcoming))

    def _train(self, refs: list[Any], progress: float, upcoming: list[Any]) -> list[Any]:
        """Submit a round's learner calls: [(info ref, weights ref)], one per learner."""
        n = len(self.learners)
        if n > 1:
            upcoming = []  # each replica takes its own share; no prefetch across shares
        ranks = self.learners.ranks
        return [lrn.train_round.remote(refs[r::n], progress, upcoming) for r, lrn in enumerate(ranks)]

    def _upcoming(self) -> list[Any]:
        # Finished segments of the next rounds: the learner fetches them while it updates.
        return [ref for _, ref in self._ready]

    def _progress_after(self, progress: float) -> float:
        """The progress the round after one at `progress` trains with: the loop's fraction once
        that round's env steps are counted, as if it were submitted after it. Whether a round runs
        ahead depends on timing (`_submit_ahead` gives up when this round finishes first), so
        giving it this round's `progress` made the learning-rate schedule, and with it a seeded
        async run, differ from run to run (a Hopper seed reached 2,000 at 289k, 473k and 977k)."""
        budget = self.cfg.stop.env_steps
        if not budget:
            return progress
        steps = round(progress * budget)  # the loop's env steps: its fraction's numerator, exactly
        return min((steps + self.cfg.update_steps) / budget, 1.0)

    def _submit_ahead(self, calls: list[Any], progress: float) -> None:
        """While `calls` run, wait for the next round's segments and submit its calls behind them
        (an actor runs its calls in order), unless `calls` finish first. The next round trains
        with `progress` (`_progress_after` this round's)."""
        running = [info for info, _ in calls]
        while len(self._ready) < self.cfg.segments_per_update:
            self.health.kill_stuck()
            self._top_up()
            _, running = ray.wait(running, num_returns=len(running), timeout=0, fetch_local=False)
            if not running:
                return
            ray.wait(
                [*running, *self._in_flight],
                num_returns=1,
                timeout=self.health.watchdog.wait_s(),
                fetch_local=False,
            )
            self._collect_finished(wait=False)
        refs = self._take_ready(top_up=False)
        self._submit(refs, progress, self._upcoming())
        self._top_up()  # counting the round ahead

    def _result(
        self, calls: list[Any], timeout_s: float | None = None, drop_dead: bool = True
    ) -> RoundResult:
        parts = self.learners.answer([info for info, _ in calls], timeout_s)
        published = parts[0][1]
        out = RoundResult.merge(
            [part for part, _ in parts],
            published=published.carrying(calls[0][1]) if published is not None else None,
            stuck_workers=self.health.take_stuck(),
        )
        if drop_dead and (out.lost_segments or out.stuck_workers):
            self._drop_dead_workers()
        if out.published is not None:
            self._take_weights(out.published)
        return out

    def _top_up(self) -> None:
        """Keep each worker busy, within the in-flight bound (outstanding + waiting segments).

        A fleet smaller than a round (an elastic fleet that shrank) gets as many samples in
        flight per worker as it takes to fill one, or no round would ever complete.
        """
        need = self.cfg.segments_per_update
        limit = max(self.cfg.rollout.max_segments_in_flight, -(-need // len(self.workers)))
        # A round submitted ahead still counts: its segments wait as a backlog would (policy lag).
        ahead = need * max(len(self._rounds) - 1, 0)
        budget = len(self.workers) * limit - len(self._in_flight) - len(self._ready) - ahead
        outstanding = Counter(worker for worker, _ in self._in_flight.values())
        for worker in self.workers:
            if outstanding[worker] == 0 and budget > 0:
                self.health.watchdog.started(worker)
            while outstanding[worker] < limit and budget > 0:
                self._in_flight[worker.sample.remote(self.version, self.weights_ref)] = (
                    worker,
                    self._submitted,
                )
                self._submitted += 1
                outstanding[worker] += 1
                budget -= 1
        for worker in [w for w in self._retiring if outstanding[w] == 0]:
            ray.kill(worker)  # drained: its last segments are in the ready list
            self._retiring.remove(worker)

    @property
    def backlog(self) -> int:
        """Finished segments waiting for the learner. (Read by the elastic fleet, whose rounds
        never run ahead: none waits in a submitted round.)"""
        return len(self._ready)

    def resize(self, target: int) -> None:
        """Grow or shrink the fleet to `target` workers (async mode). New workers take fresh
        indices (fresh seeds); a retired one takes no new samples and is killed once its
        outstanding ones are done, so none is lost. Ray's autoscaler is asked for the CPUs."""
        while len(self.workers) < target:
            added = create_rollout_workers(
                self.cfg, algorithm_traits(self.cfg), range(self._next_index, self._next_index + 1)
            )
            self.health.add(added, self._next_index)
            self.workers += added
            self._next_index += 1
        while len(self.workers) > target:
            self._retiring.append(self.workers.pop())
        request_resources(bundles=[worker_resources(self.cfg)] * len(self.workers) + self.learners.demand())

    def _collect_finished(self, wait: bool = True) -> None:
        """Move every finished sample to the ready list (with `wait`, blocking until at least one is)."""
        # fetch_local=False: the driver only learns that a segment exists; the learner fetches it.
        pending = list(self._in_flight)
        if not pending:
            return
        if wait:
            ray.wait(pending, num_returns=1, fetch_local=False, timeout=self.health.watchdog.wait_s())
        done, _ = ray.wait(pending, num_returns=len(pending), timeout=0, fetch_local=False)
        for ref in done:
            worker, number = self._in_flight.pop(ref)
            self._ready.append((number, ref))
            more = any(w == worker for w, _ in self._in_flight.values())
            self.health.watchdog.finished(worker, more)
        self.health.kill_stuck()

    def _next_async_round(self) -> list[Any]:
        # Also when the others keep the rounds full: a stuck worker would hold its slots forever.
        self.health.kill_stuck()
        self._top_up()
        while len(self._ready) < self.cfg.segments_per_update:
            self._collect_finished()
            self._top_up()
        return self._take_ready()

    def _take_ready(self, top_up: bool = True) -> list[Any]:
        """The oldest round of ready segments, taken from the ready list (then, with `top_up`,
        the workers given new samples in their place)."""
        need = self.cfg.segments_per_update
        # Oldest first: ray.wait may report a newer segment before an older one that is also
        # done, and training on the newer one first would leave the older to age (policy lag).
        self._ready.sort(key=lambda item: item[0])
        batch, self._ready = self._ready[:need], self._ready[need:]
        if top_up:
            self._top_up()
        return [ref for _, ref in batch]

    def _drop_dead_workers(self) -> None:
        """Workers Ray gave up on (past rollout.max_restarts) leave the fleet, said once; below
        rollout.min_workers the run stops (FleetLost)."""
        gone = self.health.dead(self.workers)
        if not gone:
            return
        for worker in gone:
            self.health.watchdog.forget(worker)
        self.workers = [w for w in self.workers if w not in gone]
        self._in_flight = {ref: item for ref, item in self._in_flight.items() if item[0] not in gone}
        self._next_round = None
        self.health.shrank(len(gone), len(self.workers))

    def worker_pids(self) -> list[int]:
        """Process ids of the rollout workers on this node (Ray's actor table; no call to them)."""
        here = ray.get_runtime_context().get_node_id()
        records = [actor_record(w) for w in self.workers]
        return [
            int(r["Pid"]) for r in records if r.get("Pid") and (r.get("Address") or {}).get("NodeID") == here
        ]

    def stop_sampling(self) -> None:
        """Before a stop's final checkpoint: end the rollout workers, so a learner waiting on a
        segment a stuck worker owes is freed to answer."""
        for worker in [*self.workers, *self._retiring]:
            ray.kill(worker, no_restart=True)

    def storage_problem(self, root: Path) -> str | None:
        return None  # whole checkpoints: the driver writes them

    def state_dict(self, timeout_s: float | None = None, shards: Path | None = None) -> dict[str, Any]:
        """The learner's state after the last round taken: the one `step(state_after=True)` asked
        for where that round was the last taken, else asked now (no round runs ahead then: the
        loop asks for the state ahead of every checkpoint a round runs ahead of, and takes every
        round left before the final one)."""
        assert shards is None, "an env learner's checkpoints are whole"
        asked, self._state_after = self._state_after, None
        if asked is None or asked[1] != self._taken:
            asked = (self.learners.lead.state_dict.remote(), self._taken)
        return cast(dict[str, Any], from_host(self.learners.answer(asked[0], timeout_s)))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learners.answer(self.learners.each(lambda lrn: lrn.load_state_dict.remote(state)))
        self._rounds.clear()  # the caller drained them first (TrainingLoop): no result is wanted
        self._returned = False
        self._state_after = None
        self._take_weights(self._publish_now())
        self._next_round = None  # sampled with weights that are no longer current

    def restart_learner(self) -> None:
        """A fresh learner group (`LearnerGroup.restart`); its state comes from the newest
        checkpoint, loaded by the caller."""
        self.learners.restart()
        self._take_weights(self._publish_now())
        self._next_round = None
        self._rounds.clear()  # calls to the learner that died
        self._state_after = None
        self._returned = False

    def evaluation_runner(self) -> EvalRunner:
        """The evaluation actor, placed now (it must not wait for CPUs the fleet holds)."""
        actor = create_evaluator(self.cfg, self.env_spec, algorithm_traits(self.cfg))
        wait_until_placed(self.cfg, {"evaluator": [actor]})
        return ActorEvalRunner(actor, lambda: (self.version, self.weights_ref), wire_for(self.cfg))

    def reseed_workers(self, stream: int) -> None:
        """Every worker continues on seed stream `stream` (a resumed run must not replay its data)."""
        ray.get([w.reseed.remote(stream) for w in self.workers])
        self._next_round = None

    def close(self) -> None:
        for actor in [*self.workers, *getattr(self, "_retiring", [])]:
            ray.kill(actor)
        if self.group is not None:
            self.group.kill()
        if self.cfg.rollout.autoscale:
            request_resources(bundles=[])  # the fleet's demand goes with it: idle nodes may leave


def check_worker_spec(cfg: RelayConfig, env_spec: EnvSpec, worker: Any) -> None:
    """PreflightError (one line, exit 2) when a rollout worker's env, built with the configured
    backend, does not have the spaces the driver probed (and the learner was built for): EnvPool
    can give an env other leaves than gymnasium does. A worker that failed to start is left to
    the fleet's own accounting."""
    try:
        seen = ray.get(worker.env_spec.remote())
    except ray.exceptions.RayError:
        return
    if seen != env_spec:
        raise PreflightError(
            f"env.vectorization={cfg.env.vectorization} gives {cfg.env.id} observations "
            f"{seen.describe_obs()} and {seen.action.describe()} actions, gymnasium's env "
            f"{env_spec.describe_obs()} and {env_spec.action.describe()}: choose the Dict keys both have "
            "with env.obs_keys"
        )
