"""The learner as a Ray actor: a thin shell around `Learner` that publishes weights by object ref.

The calls made every round (`train_round`, `publish`, and the workers' `sample`) opt out of Ray's
task events: the GCS would otherwise keep a record of each (a few hundred bytes, ~170k calls an
hour on CartPole) until its cap, memory nobody reads.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import ray
import torch

from contracts.config import RelayConfig
from contracts.rounds import RoundResult
from contracts.segment import Segment, SegmentRejected
from contracts.spaces import EnvSpec
from learner.device import accelerator_resources, ray_options
from learner.distributed import init_group, world_size
from learner.learner import Learner

Staged = tuple[Segment, dict[str, torch.Tensor] | None] | ray.exceptions.RayError


class LearnerActor:
    """Holds the Learner on its accelerator; segments arrive by object ref, weights leave by one ray.put."""

    def __init__(self, cfg_data: dict[str, Any], env: EnvSpec) -> None:
        cfg = RelayConfig.model_validate(cfg_data)
        # As many intra-op threads as the CPUs Ray reserved for us: more would fight the rollout
        # workers for cores, fewer leaves a CPU learner's reserved cores idle.
        torch.set_num_threads(cfg.learner.num_cpus)
        self.learner = Learner(cfg, env)
        self._published: tuple[int, list[ray.ObjectRef]] | None = None
        # Segments of the next rounds, fetched and staged by a thread while the learner updates.
        self._prefetched: dict[ray.ObjectRef, Staged] = {}
        self._prefetcher: threading.Thread | None = None

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
    def publish(self) -> tuple[int, list[ray.ObjectRef]]:
        return self._publish()

    def _publish(self) -> tuple[int, list[ray.ObjectRef]]:
        """The newest weights: (version, [ref]). One ray.put per version; workers fetch it themselves.

        The ref travels inside a list so Ray hands callers the reference, never the tensors.
        Weights travel as numpy arrays: Ray stores and reads those without copying or pickling
        them (about 5x faster to fetch than torch tensors, for every worker on every version).
        """
        if self._published is None or self._published[0] != self.learner.version:
            weights = {k: v.numpy() for k, v in self.learner.weights().items()}
            self._published = (self.learner.version, [ray.put(weights)])
        return self._published

    def _fetch(self, ref: ray.ObjectRef) -> Staged:
        """A segment and its staged fields (None when the buffer will reject it), or the error that
        lost it (its worker died)."""
        try:
            segment = ray.get(ref)
        except ray.exceptions.RayError as err:
            return err
        try:
            return segment, self.learner.buffer.stage(segment)
        except SegmentRejected:
            return segment, None  # ingest rejects it again and says why

    def _prefetch(self, refs: list[ray.ObjectRef]) -> None:
        for ref in refs:
            if ref not in self._prefetched:
                self._prefetched[ref] = self._fetch(ref)

    def _take(
        self, refs: list[ray.ObjectRef]
    ) -> tuple[list[Segment], list[dict[str, torch.Tensor] | None], int, float]:
        """(segments, their staged fields, segments lost, seconds waited): what a prefetch got
        ready, the rest fetched now."""
        t0 = time.perf_counter()
        if self._prefetcher is not None:
            self._prefetcher.join()
            self._prefetcher = None
        segments, staged, lost = [], [], 0
        for ref in refs:
            item = self._prefetched.pop(ref, None) or self._fetch(ref)
            if isinstance(item, ray.exceptions.RayError):
                lost += 1  # reported by the driver, aggregated: a dead worker loses one per round
                continue
            segments.append(item[0])
            staged.append(item[1])
        return segments, staged, lost, time.perf_counter() - t0

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
    ) -> RoundResult:
        """Fetch the segments (dropping any whose worker died), ingest them, update when a round is
        in. `upcoming`: segments of the next rounds, already done; a thread fetches and stages
        them (object transfer, validation, page-locked host copies on an accelerator) while this
        round's update runs, so the next round starts with its data at hand."""
        segments, staged, lost, waited = self._take(segment_refs)
        if upcoming:
            self._prefetcher = threading.Thread(target=self._prefetch, args=(upcoming,), daemon=True)
            self._prefetcher.start()
        out = self.learner.train_round(segments, progress, lockstep=world_size() > 1, staged=staged)
        out.lost_segments = lost
        out.phases["wait_s"] = waited
        if out.metrics is not None:
            t0 = time.perf_counter()
            out.published = self._publish()
            out.phases["publish_s"] = time.perf_counter() - t0
        return out

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
