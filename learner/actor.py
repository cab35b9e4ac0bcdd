"""The learner as a Ray actor: a thin shell around `Learner` that publishes weights by object ref.

The calls made every round (`train_round`, `publish`, and the workers' `sample`) opt out of Ray's
task events: the GCS would otherwise keep a record of each (a few hundred bytes, ~170k calls an
hour on CartPole) until its cap, memory nobody reads.

Published weights leave as a call's second return value, not as a `ray.put` of the actor's: Ray
makes the caller (the driver) the owner of a return value, while an object the actor put and the
driver borrowed leaves about 0.5 KB behind in the actor's core worker each time (measured: the
learner grew ~20 MB an hour on CartPole, ~45k publications an hour; see docs/benchmarks.md,
"Long runs"). The object is still written to the object store once per version and every worker
reads that one copy; and weights the driver owns outlive a learner that dies.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch

from ..contracts.config import RelayConfig
from ..contracts.rounds import Publication, RoundResult
from ..contracts.spaces import EnvSpec
from ..learner.device import accelerator_resources, ray_options
from ..learner.distributed import world_size
from ..learner.heap import HeapTrimmer
from ..learner.learner import Arrival, Arrivals
from ..learner.policy_groups import GroupArrival, make_learner
from ..learner.rank import LearnerRank
from ..policy.weight_wires import wire_for

Fetched = Arrival | GroupArrival | ray.exceptions.RayError
Weights = Any  # what the run's wire packed (policy/weight_wires.py)


class LearnerActor(LearnerRank):
    """Holds the Learner on its accelerator; segments arrive by object ref, weights leave as
    `publish`'s second return value (one object per version, owned by the driver)."""

    def __init__(self, cfg_data: dict[str, Any], env: EnvSpec) -> None:
        cfg = RelayConfig.model_validate(cfg_data)
        # As many intra-op threads as the CPUs Ray reserved for us: more would fight the rollout
        # workers for cores, fewer leaves a CPU learner's reserved cores idle.
        torch.set_num_threads(cfg.learner.num_cpus)
        self.learner = make_learner(cfg, env)
        self.dev = self.learner.dev
        self.wire = wire_for(cfg)
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
            "buffer_bytes": self.learner.buffer_bytes(),
            "node_id": ray.get_runtime_context().get_node_id(),
        }

    @ray.method(num_returns=2, enable_task_events=False)  # hot: no task record kept in the GCS
    def publish(self) -> tuple[Publication, Weights]:
        """(the Publication without its ref, the newest weights): the caller's ref to the second
        return is what it hands the workers (`Publication.carrying`)."""
        return self._publish()

    def _publish(self) -> tuple[Publication, Weights]:
        """The newest weights, for the call's second return (stored once; workers fetch it).

        They travel as the run's wire packs them (`learner.weight_wire`; float32 numpy arrays for
        an env policy, which Ray stores and reads without copying or pickling). `seconds` counts
        the packing; Ray's copy into the object store follows as the call returns.
        """
        t0 = time.perf_counter()
        weights = self.wire.pack(self.learner.weights())
        return Publication(self.learner.version, [], time.perf_counter() - t0), weights

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

    @ray.method(num_returns=2, enable_task_events=False)  # hot: no task record kept in the GCS
    def train_round(
        self, segment_refs: list[ray.ObjectRef], progress: float, upcoming: list[ray.ObjectRef] | None = None
    ) -> tuple[tuple[RoundResult, Publication | None], Weights | None]:
        """Fetch the segments (dropping any whose worker died), ingest them, update when a round is
        in; returns (this replica's part of the round, the Publication without its ref) and, as
        the second return, the weights rank 0 published after an update (else None).
        `upcoming`: segments of the next rounds, already done; a thread fetches and stages them
        (object transfer, validation, page-locked host copies on an accelerator) while this
        round's update runs, so the next round starts with its data at hand."""
        arrivals = self._take(segment_refs)
        if upcoming:
            self._prefetching = self._prefetch_pool.submit(self._prefetch, upcoming)
        out = self.learner.train_arrivals(arrivals, progress, lockstep=world_size() > 1)
        self._heap.maybe_trim()
        if out.metrics is None or self.rank != 0:
            return (out, None), None
        published, weights = self._publish()
        return (out, published), weights

    @ray.method(enable_task_events=False)  # every checkpoint: no task record kept in the GCS
    def state_dict(self) -> dict[str, Any]:
        """The learner's state with every tensor as host numpy (`to_host`; the driver's
        `from_host` turns them back)."""
        return to_host(self.learner.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learner.load_state_dict(state)


@dataclass(frozen=True)
class HostTensor:
    """A tensor crossing Ray as host numpy: `array` its values (bf16 as their int16 bits), `dtype`
    the tensor's own. Ray hands numpy arrays over out of band, without a copy, where a torch tensor
    is pickled in band through torch's serializer (CartPole's learner state: 17 ms a checkpoint);
    and a device tensor (cuda, npu) would need the device, and torch_npu, wherever it is read: the
    driver on a CPU-only head node has neither."""

    array: np.ndarray
    dtype: str


def _map_leaves(fn: Callable[[Any], Any], tree: Any) -> Any:
    """`tree` (dicts, lists, tuples) with `fn` applied to each leaf."""
    if isinstance(tree, dict):
        return {k: _map_leaves(fn, v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_map_leaves(fn, v) for v in tree)
    return fn(tree)


def _host_leaf(leaf: Any) -> Any:
    if not isinstance(leaf, torch.Tensor):
        return leaf
    t = leaf.detach().to("cpu").contiguous()
    bits = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
    return HostTensor(bits.numpy(), str(t.dtype).removeprefix("torch."))


def _tensor_leaf(leaf: Any) -> Any:
    if not isinstance(leaf, HostTensor):
        return leaf
    t = torch.from_numpy(np.array(leaf.array))
    return t.view(torch.bfloat16) if leaf.dtype == "bfloat16" else t


def to_host(tree: Any) -> Any:
    """`tree` (dicts, lists, tuples) with every tensor a HostTensor on the host."""
    return _map_leaves(_host_leaf, tree)


def from_host(tree: Any) -> Any:
    """`to_host`'s tree with its tensors back (CPU tensors of their own dtype, writable copies:
    Ray's arrays are read-only views of its object store)."""
    return _map_leaves(_tensor_leaf, tree)


def learner_resources(cfg: RelayConfig) -> dict[str, float]:
    """What one learner actor asks Ray for: learner.num_cpus CPUs, its accelerator, and
    learner.ray_resources."""
    have = ray.cluster_resources() if ray.is_initialized() else {}
    return {
        "CPU": float(cfg.learner.num_cpus),
        **accelerator_resources(cfg.learner.device, have),
        **cfg.learner.ray_resources,
    }


def create_learner_actor(cfg: RelayConfig, env: EnvSpec, **placed: Any) -> Any:
    """An env run's learner actor; `placed`: Ray options that place it (a placement group's bundle)."""
    options = {**ray_options(learner_resources(cfg)), **placed}
    return ray.remote(LearnerActor).options(**options).remote(cfg.model_dump(mode="json"), env)
