"""The learner as a Ray actor: a thin shell around `Learner` that publishes weights by object ref.

The calls made every round (`train_round`, `publish`, and the workers' `sample`) opt out of Ray's
task events: the GCS would otherwise keep a record of each (a few hundred bytes, ~170k calls an
hour on CartPole) until its cap, memory nobody reads.
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import ray
import torch

from contracts.config import RelayConfig
from contracts.rounds import Publication, RoundResult
from contracts.spaces import EnvSpec
from learner.device import accelerator_resources, ray_options
from learner.distributed import init_group, world_size
from learner.heap import HeapTrimmer
from learner.learner import Arrival, Arrivals, Learner

Fetched = Arrival | ray.exceptions.RayError


class LearnerActor:
    """Holds the Learner on its accelerator; segments arrive by object ref, weights leave by one ray.put."""

    def __init__(self, cfg_data: dict[str, Any], env: EnvSpec) -> None:
        cfg = RelayConfig.model_validate(cfg_data)
        # As many intra-op threads as the CPUs Ray reserved for us: more would fight the rollout
        # workers for cores, fewer leaves a CPU learner's reserved cores idle.
        torch.set_num_threads(cfg.learner.num_cpus)
        self.learner = Learner(cfg, env)
        self._published: Publication | None = None
        # Segments of the next rounds, fetched and staged while the learner updates, by one thread
        # kept for the actor's life rather than one started per round (~45k an hour on CartPole).
        self._prefetched: dict[ray.ObjectRef, Fetched] = {}
        self._prefetch_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relay-prefetch")
        self._prefetching: Future[None] | None = None
        self._heap = HeapTrimmer()  # freed heap back to the OS once a minute (learner/heap.py)

    def describe(self) -> dict[str, Any]:
        """Device, Ray-assigned accelerator ids and parameter count, for logs."""
        return {
            "device": str(self.learner.dev),
            "ray_accelerator_ids": list(self.learner.dev.ray_ids),
            "parameters": self.learner.parameter_count,
            "torch_threads": torch.get_num_threads(),
            "buffer_bytes": self.learner.buffer.nbytes(),
            "node_id": ray.get_runtime_context().get_node_id(),
        }

    @ray.method(enable_task_events=False)  # hot: no task record kept in the GCS
    def publish(self) -> Publication:
        return self._publish()

    def _publish(self) -> Publication:
        """The newest weights. One ray.put per version; workers fetch it themselves.

        Weights travel as numpy arrays: Ray stores and reads those without copying or pickling
        them (about 5x faster to fetch than torch tensors, for every worker on every version).
        """
        if self._published is None or self._published.version != self.learner.version:
            t0 = time.perf_counter()
            weights = {k: v.numpy() for k, v in self.learner.weights().items()}
            ref = ray.put(weights)
            self._published = Publication(self.learner.version, [ref], time.perf_counter() - t0)
        return self._published

    def _fetch(self, ref: ray.ObjectRef) -> Fetched:
        """A segment staged for the buffer (or rejected by it), or the error that lost it (its
        worker died)."""
        try:
            segment = ray.get(ref)
        except ray.exceptions.RayError as err:
            return err
        return self.learner.stage(segment)

    def _prefetch(self, refs: list[ray.ObjectRef]) -> None:
        for ref in refs:
            if ref not in self._prefetched:
                self._prefetched[ref] = self._fetch(ref)

    def _take(self, refs: list[ray.ObjectRef]) -> Arrivals:
        """The round's segments: what a prefetch got ready, the rest fetched now; those lost
        (reported by the driver, aggregated: a dead worker loses one per round) are counted."""
        t0 = time.perf_counter()
        if self._prefetching is not None:
            self._prefetching.result()
            self._prefetching = None
        arrivals = Arrivals([])
        for ref in refs:
            item = self._prefetched.pop(ref, None) or self._fetch(ref)
            if isinstance(item, ray.exceptions.RayError):
                arrivals.lost += 1
            else:
                arrivals.staged.append(item)
        arrivals.wait_s = time.perf_counter() - t0
        return arrivals

    def rendezvous(self) -> tuple[str, int]:
        """Address and a free port on this node for the learners' process group (rank 0 hosts it)."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def join_group(self, rank: int, world: int, address: str, port: int) -> int:
        init_group(self.learner.dev, rank, world, address, port)
        return rank

    @ray.method(enable_task_events=False)  # hot: no task record kept in the GCS
    def train_round(
        self, segment_refs: list[ray.ObjectRef], progress: float, upcoming: list[ray.ObjectRef] | None = None
    ) -> tuple[RoundResult, Publication | None]:
        """Fetch the segments (dropping any whose worker died), ingest them, update when a round is
        in; returns this replica's part of the round and the weights it published (after an update).
        `upcoming`: segments of the next rounds, already done; a thread fetches and stages them
        (object transfer, validation, page-locked host copies on an accelerator) while this
        round's update runs, so the next round starts with its data at hand."""
        arrivals = self._take(segment_refs)
        if upcoming:
            self._prefetching = self._prefetch_pool.submit(self._prefetch, upcoming)
        out = self.learner.train_arrivals(arrivals, progress, lockstep=world_size() > 1)
        self._heap.maybe_trim()
        return out, (self._publish() if out.metrics is not None else None)

    @ray.method(enable_task_events=False)  # every checkpoint: no task record kept in the GCS
    def state_dict(self) -> dict[str, Any]:
        return self.learner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learner.load_state_dict(state)
        self._published = None


def learner_resources(cfg: RelayConfig) -> dict[str, float]:
    """What one learner actor asks Ray for: learner.num_cpus CPUs, its accelerator, and
    learner.ray_resources."""
    have = ray.cluster_resources() if ray.is_initialized() else {}
    return {
        "CPU": float(cfg.learner.num_cpus),
        **accelerator_resources(cfg.learner.device, have),
        **cfg.learner.ray_resources,
    }


def create_learner_actor(cfg: RelayConfig, env: EnvSpec) -> Any:
    options = ray_options(learner_resources(cfg))
    return ray.remote(LearnerActor).options(**options).remote(cfg.model_dump(mode="json"), env)
