"""Where sampling and learning run: in-process (local mode) or as Ray actors (sync or async).

Both expose `step(progress) -> round result` (see `Learner.train_round`), so the driver loop
does not know which one it drives.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from learner.learner import EnvSpec, Learner
from rollout_workers.envs import probe_spaces
from rollout_workers.sampler import SegmentSampler
from services.config import RelayConfig


class LearnerLost(RuntimeError):
    """The learner actor died; the driver restarts it from the newest checkpoint."""


class Backend(Protocol):
    def describe(self) -> dict[str, Any]: ...
    def step(self, progress: float) -> dict[str, Any]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    def restart_learner(self) -> None: ...
    def reseed_workers(self, stream: int) -> None: ...
    def close(self) -> None: ...


class LocalBackend:
    """Sampler and learner in this process: the same code as the actors, for debugging and tests."""

    def __init__(self, cfg: RelayConfig) -> None:
        self.sampler = SegmentSampler(cfg, 0)
        self.learner = Learner(cfg, self.sampler.spec)

    def describe(self) -> dict[str, Any]:
        return {"mode": "local", "device": str(self.learner.dev), "workers": 0}

    def step(self, progress: float) -> dict[str, Any]:
        if self.sampler.version != self.learner.version:
            self.sampler.set_weights(self.learner.version, self.learner.weights())
        out = self.learner.train_round([self.sampler.sample()], progress)
        out["lost_segments"] = 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return self.learner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learner.load_state_dict(state)

    def restart_learner(self) -> None:
        self.learner = Learner(self.learner.cfg, self.sampler.spec)

    def reseed_workers(self, stream: int) -> None:
        self.sampler.reseed(stream)

    def close(self) -> None:
        self.sampler.close()


class RayBackend:
    """Rollout worker actors + one learner actor. Segments go worker -> learner by object ref.

    sync: each round, every worker samples once with the current weights (policy lag 0); the next
    round is submitted as soon as an update publishes its weights, so driver bookkeeping overlaps it.
    async: workers keep up to `max_segments_in_flight` samples outstanding while the learner
    updates; submissions stop while a backlog waits, so object-store use stays bounded.
    """

    def __init__(self, cfg: RelayConfig) -> None:
        import ray

        from learner.actor import create_learner_actor
        from rollout_workers.worker import create_rollout_workers

        self._ray = ray
        self._create_learner = create_learner_actor
        self.cfg = cfg
        ec = cfg.env
        self.env_spec = EnvSpec(*probe_spaces(ec.id, ec.max_episode_steps, ec.kwargs))
        # Learners are placed first, so rollout workers can never take the CPUs of their nodes.
        self.learners = [create_learner_actor(cfg, self.env_spec) for _ in range(cfg.learner.num_learners)]
        self.learner = self.learners[0]  # rank 0 publishes weights and reports metrics
        if len(self.learners) > 1:
            address, port = ray.get(self.learner.rendezvous.remote())
            n = len(self.learners)
            ray.get([lrn.join_group.remote(rank, n, address, port) for rank, lrn in enumerate(self.learners)])
        self.version, self.weights_ref = ray.get(self.learner.publish.remote())
        self.workers = create_rollout_workers(cfg)
        self._in_flight: dict[Any, tuple[int, int]] = {}  # ref -> (worker, submission number)
        self._ready: list[tuple[int, Any]] = []  # (submission number, ref)
        self._submitted = 0
        self._next_round: list[Any] | None = None  # sync: the round already sampling

    def describe(self) -> dict[str, Any]:
        info = self._ray.get(self.learner.describe.remote())
        return {"mode": self.cfg.rollout.mode, "workers": len(self.workers), **info}

    def _sample_round(self) -> list[Any]:
        """Every worker samples once with the current weights."""
        return [w.sample.remote(self.version, self.weights_ref) for w in self.workers]

    def step(self, progress: float) -> dict[str, Any]:
        if self.cfg.rollout.mode == "sync":
            refs, self._next_round = self._next_round or self._sample_round(), None
        else:
            refs = self._next_async_round()
        n = len(self.learners)
        try:
            outs = self._ray.get(
                [lrn.train_round.remote(refs[r::n], progress) for r, lrn in enumerate(self.learners)]
            )
        except self._ray.exceptions.RayActorError as err:
            raise LearnerLost(str(err).splitlines()[0]) from None
        out = _merge_rounds(outs)
        if "weights" in out:
            self.version, self.weights_ref = out.pop("weights")
        if self.cfg.rollout.mode == "sync":
            # The next round starts sampling with the new weights now (policy lag stays 0), so
            # the driver's metrics and checkpoint writing overlap it instead of delaying it.
            self._next_round = self._sample_round()
        return out

    def _top_up(self) -> None:
        """Keep each worker busy, within the in-flight bound (outstanding + waiting segments)."""
        limit = self.cfg.rollout.max_segments_in_flight
        budget = len(self.workers) * limit - len(self._in_flight) - len(self._ready)
        outstanding = [0] * len(self.workers)
        for w, _ in self._in_flight.values():
            outstanding[w] += 1
        for w, worker in enumerate(self.workers):
            while outstanding[w] < limit and budget > 0:
                self._in_flight[worker.sample.remote(self.version, self.weights_ref)] = (w, self._submitted)
                self._submitted += 1
                outstanding[w] += 1
                budget -= 1

    def _collect_finished(self) -> None:
        """Move every finished sample to the ready list (blocking until at least one is)."""
        # fetch_local=False: the driver only learns that a segment exists; the learner fetches it.
        pending = list(self._in_flight)
        self._ray.wait(pending, num_returns=1, fetch_local=False)
        done, _ = self._ray.wait(pending, num_returns=len(pending), timeout=0, fetch_local=False)
        for ref in done:
            self._ready.append((self._in_flight.pop(ref)[1], ref))

    def _next_async_round(self) -> list[Any]:
        need = self.cfg.segments_per_update
        self._top_up()
        while len(self._ready) < need:
            self._collect_finished()
            self._top_up()
        # Oldest first: ray.wait may report a newer segment before an older one that is also
        # done, and training on the newer one first would leave the older to age (policy lag).
        self._ready.sort(key=lambda item: item[0])
        batch, self._ready = self._ready[:need], self._ready[need:]
        self._top_up()
        return [ref for _, ref in batch]

    def state_dict(self) -> dict[str, Any]:
        return self._ray.get(self.learner.state_dict.remote())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._ray.get([lrn.load_state_dict.remote(state) for lrn in self.learners])
        self.version, self.weights_ref = self._ray.get(self.learner.publish.remote())
        self._next_round = None  # sampled with weights that are no longer current

    def restart_learner(self) -> None:
        """A fresh learner actor (its state comes from the newest checkpoint, loaded by the caller)."""
        if len(self.learners) > 1:
            raise RuntimeError("a data-parallel learner group cannot be restarted yet; use relay resume")
        self._ray.kill(self.learner)
        self.learner = self._create_learner(self.cfg, self.env_spec)
        self.learners = [self.learner]
        self.version, self.weights_ref = self._ray.get(self.learner.publish.remote())
        self._next_round = None

    def reseed_workers(self, stream: int) -> None:
        """Every worker continues on seed stream `stream` (a resumed run must not replay its data)."""
        self._ray.get([w.reseed.remote(stream) for w in self.workers])
        self._next_round = None

    def close(self) -> None:
        for actor in [*self.workers, *self.learners]:
            self._ray.kill(actor)


def _merge_rounds(outs: list[dict[str, Any]]) -> dict[str, Any]:
    """One round's result from every data-parallel learner: counts add up, rank 0 reports metrics."""
    merged = dict(outs[0])
    for other in outs[1:]:
        for key in ("episode_returns", "episode_lengths"):
            merged[key] = merged[key] + other[key]
        for key in ("env_steps", "rejected", "lost_segments", "worker_restarts"):
            merged[key] = merged.get(key, 0) + other.get(key, 0)
        merged.setdefault("reject_reason", other.get("reject_reason"))
    return merged


def init_ray(cfg: RelayConfig, address: str | None) -> bool:
    """Connect to a cluster (--address or RAY_ADDRESS) or start a local one. True if we started it."""
    import logging

    import ray

    if ray.is_initialized():
        return False
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address, logging_level=logging.WARNING)
        return False
    # Logical CPUs: a 2-core laptop still runs 2 workers + the learner (they oversubscribe, as processes do).
    needed = cfg.rollout.num_workers * cfg.rollout.num_cpus_per_worker + cfg.learner.num_learners
    ray.init(
        num_cpus=max(os.cpu_count() or 1, int(needed + 0.999)),
        include_dashboard=False,
        logging_level=logging.WARNING,
    )
    return True


def make_backend(cfg: RelayConfig) -> Backend:
    return LocalBackend(cfg) if cfg.rollout.num_workers == 0 else RayBackend(cfg)
